"""Who may use `spec serve`: API keys, other machines (`--allow-remote`), browsers' origins (`--cors`), and a port
already taken; no test binds a non-loopback address."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
from support.serving import NAME, openai_error, running
from typer.testing import CliRunner

from spec_cli import Pair, SpecError
from spec_cli.cli.app import app
from spec_cli.server import app as server


def test_an_api_key_is_required_on_every_request_but_health(chat_pair: Pair) -> None:
    with running(chat_pair, api_key="s3cret") as serving:
        assert serving.post("/v1/completions", {"prompt": "the cat"}).status_code == 401
        wrong = serving.post("/v1/completions", {"prompt": "the cat"}, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"{serving.url}/v1/models").status_code == 401
        assert httpx.get(f"{serving.url}/health").status_code == 200
        with pytest.raises(openai.AuthenticationError):
            serving.client(api_key="nope").models.list()
        answer = serving.client(api_key="s3cret").completions.create(model=NAME, prompt="the cat", max_tokens=3)
        assert answer.choices[0].text


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.7", "::"])
def test_a_server_reachable_from_other_machines_needs_allow_remote(host: str) -> None:
    result = CliRunner().invoke(app, ["serve", "--host", host])
    assert result.exit_code == 1
    assert result.stderr.strip() == (f"spec: error: --host {host} lets other machines use this server; add "
                                     "--allow-remote if that is what you want (and --api-key to require a key)")


@pytest.fixture()
def no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """`spec serve` binds a loopback socket whatever its --host, and its HTTP server refuses to start."""
    monkeypatch.setattr(server, "listen", lambda _host, _port: server.socket.create_server(("127.0.0.1", 0)))

    class Refuse:
        def __init__(self, _app: object, _limits: object, _log: object) -> None:
            pass

        def run(self, sockets: object) -> None:
            raise SpecError("server not started in tests")

    monkeypatch.setattr(server, "http_server", Refuse)


def test_allow_remote_warns_before_serving(no_server: None, chat_target_path: Path) -> None:
    """No test binds a non-loopback address: the socket is a loopback one and the HTTP server is replaced."""
    result = CliRunner().invoke(app, ["serve", "--target", str(chat_target_path), "--no-draft", "--host", "0.0.0.0",
                                      "--allow-remote"])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and lines[-1] == "spec: error: server not started in tests"
    assert lines[-2] == ("spec: warning: other machines can reach this server on 0.0.0.0; anyone who can reach it "
                         "can use it (--api-key requires a key)")


@pytest.mark.parametrize("flags, warned", [(["--cors", "*"], True), (["--cors", "*", "--api-key", "k"], False),
                                           (["--cors", "http://localhost:3000"], False)])
def test_any_origin_without_a_key_is_warned_about(no_server: None, chat_target_path: Path, flags: list[str],
                                                  warned: bool) -> None:
    result = CliRunner().invoke(app, ["serve", "--target", str(chat_target_path), "--no-draft", *flags])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and lines[-1] == "spec: error: server not started in tests"
    warning = ("spec: warning: --cors * lets any web page open in a browser here use this server (--api-key "
               "requires a key)")
    assert (warning in lines) == warned


def test_a_port_in_use_is_one_line_before_any_model_loads() -> None:
    with server.socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        result = CliRunner().invoke(app, ["serve", "--target", "missing.gguf", "--no-draft", "--port", str(port)])
    assert result.exit_code == 1
    assert result.stderr.strip().startswith(f"spec: error: cannot listen on 127.0.0.1:{port}:")


def test_the_bearer_scheme_is_case_insensitive(chat_pair: Pair) -> None:
    with running(chat_pair, api_key="s3cret") as serving:
        for given in ("bearer s3cret", "BEARER s3cret", "Bearer  s3cret"):
            assert httpx.get(f"{serving.url}/v1/models", headers={"Authorization": given}).status_code == 200
        for given in ("s3cret", "Basic s3cret", "Bearer s3cre", "Bearer"):
            error = openai_error(httpx.get(f"{serving.url}/v1/models", headers={"Authorization": given}), 401)
            assert error["code"] == "invalid_api_key"


@pytest.mark.parametrize("how", [["--api-key", ""], ["--api-key", "  "], "SPEC_API_KEY"])
def test_an_empty_api_key_is_refused_at_start(no_server: None, chat_target_path: Path, how: list[str] | str) -> None:
    flags, env = (how, {}) if isinstance(how, list) else ([], {how: ""})
    result = CliRunner().invoke(app, ["serve", "--target", str(chat_target_path), "--no-draft", *flags], env=env)
    assert result.exit_code == 1 and result.stderr.strip().splitlines() == [
        "spec: error: the API key is empty (--api-key or SPEC_API_KEY): give a key, or set neither to serve "
        "without one"]


def test_browsers_are_answered_only_from_the_origins_given(chat_pair: Pair) -> None:
    preflight = {"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    with running(chat_pair, cors=("http://localhost:3000",), api_key="k") as serving:
        allowed = httpx.options(f"{serving.url}/v1/chat/completions", headers=preflight)
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == "http://localhost:3000"
        refused = httpx.options(f"{serving.url}/v1/chat/completions", headers={**preflight, "Origin": "http://evil"})
        assert openai_error(refused, 400)["message"] == "Disallowed CORS origin"
        unauthorised = httpx.get(f"{serving.url}/v1/models", headers={"Origin": "http://localhost:3000"})
        assert unauthorised.status_code == 401  # readable by the page: it carries the CORS header
        assert unauthorised.headers["access-control-allow-origin"] == "http://localhost:3000"
    with running(chat_pair) as serving:
        answer = httpx.options(f"{serving.url}/v1/chat/completions", headers=preflight)
        assert openai_error(answer, 405) and "access-control-allow-origin" not in answer.headers
