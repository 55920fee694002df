"""`spec models …` and `spec doctor`: what they print and how they fail."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.tiny_models import write_model
from typer.testing import CliRunner

from spec_cli.cli.app import app
from spec_cli.llama.model import Model, supports_gpu_offload
from spec_cli.reports import models
from spec_cli.reports.models import backends

runner = CliRunner()


def spec(*args: str):
    return runner.invoke(app, list(args))


def test_path_prints_the_user_registry_location(user_dirs: Path) -> None:
    result = spec("models", "path")
    assert result.exit_code == 0
    assert result.stdout.strip() == str(user_dirs / ".config" / "spec-cli" / "models.toml")


def test_check_reports_every_rule_passed(target_path: Path, other_draft_path: Path) -> None:
    result = spec("models", "check", str(target_path), str(other_draft_path))
    assert result.exit_code == 0, result.output
    for rule in ("vocabulary type", "BOS token id", "EOS token id", "vocabulary size", "token texts"):
        assert rule in result.stdout
    assert "differs" not in result.stdout and "drafting through text" not in result.stdout


def test_check_names_the_first_difference_and_drafts_through_text(tmp_path: Path, target_path: Path) -> None:
    renamed = write_model(tmp_path / "renamed.gguf", seed=4, rename_token=301, eos=1)
    result = spec("models", "check", str(target_path), str(renamed))
    assert result.exit_code == 0, result.output
    assert result.stdout.count("differs") == 2
    assert "first difference at id 301" in result.stdout and "_renamed" in result.stdout
    assert "different vocabularies: drafting through text (exact)" in result.stdout


def test_check_on_a_missing_file_is_one_line(tmp_path: Path, target_path: Path) -> None:
    result = spec("models", "check", str(target_path), str(tmp_path / "nope.gguf"))
    assert result.exit_code == 1 and "model file not found" in result.stderr


def test_show_reads_gguf_metadata(target_path: Path) -> None:
    result = spec("models", "show", "smollm2-demo")
    assert result.exit_code == 0, result.output
    assert "Q4_1" in result.stdout and "llama" in result.stdout and "49152" in result.stdout
    assert "not on disk yet" in result.stdout  # the derived F32 target is not made by `show`


def test_show_unknown_pair() -> None:
    result = spec("models", "show", "qwen-7b")
    assert result.exit_code == 1 and "unknown pair 'qwen-7b'; did you mean" in result.stderr


def test_derive_writes_a_loadable_file_and_prints_its_path(target_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "target.q8_0.gguf"
    result = spec("models", "derive", str(target_path), "--type", "Q8_0", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(out)
    model = Model(out, vocab_only=True)
    assert model.metadata("general.file_type") == "7"
    model.close()
    again = spec("models", "derive", str(target_path), "--type", "q8_0", "--out", str(out))
    assert again.exit_code == 1 and "already exists" in again.stderr


def test_derive_rejects_an_unknown_type(target_path: Path) -> None:
    result = spec("models", "derive", str(target_path), "--type", "q3_x")
    assert result.exit_code == 1 and "unknown type 'q3_x'; choose one of: f32, f16" in result.stderr


def test_derive_into_the_cache_by_default(target_path: Path, user_dirs: Path) -> None:
    result = spec("models", "derive", str(target_path), "--type", "f16")
    assert result.exit_code == 0, result.output
    assert Path(result.stdout.strip()).parent == user_dirs / "cache" / "derived"


def test_the_same_model_elsewhere_reuses_its_derived_file_and_other_bytes_do_not(target_path: Path, user_dirs: Path,
                                                                                  tmp_path: Path) -> None:
    """A derived model is named by what its source holds: the same file in another folder with another modification
    time (a new virtual environment's copy of a wheel's model) reuses it, made once; the same file with its last byte
    changed is another model."""
    first = spec("models", "derive", str(target_path), "--type", "f16")
    assert first.exit_code == 0, first.output
    copy = tmp_path / "another-env" / target_path.name
    copy.parent.mkdir()
    copy.write_bytes(target_path.read_bytes())
    os.utime(copy, (1_000_000_000, 1_000_000_000))
    again = spec("models", "derive", str(copy), "--type", "f16")
    assert again.exit_code == 0 and again.stdout == first.stdout and "making" not in again.stderr
    data = bytearray(copy.read_bytes())
    data[-1] ^= 0xFF
    copy.write_bytes(bytes(data))
    other = spec("models", "derive", str(copy), "--type", "f16")
    assert other.exit_code == 0 and other.stdout != first.stdout and "making" in other.stderr
    assert len(list((user_dirs / "cache" / "derived").iterdir())) == 2


def test_using_a_derived_model_removes_the_copies_its_earlier_names_left(target_path: Path, user_dirs: Path) -> None:
    """Copies of a derived model that its earlier names left in the cache (one per virtual environment) are removed
    when it is next used, and said so; a file of the same name and size holding other bytes stays."""
    first = spec("models", "derive", str(target_path), "--type", "f16")
    assert first.exit_code == 0, first.output
    made = Path(first.stdout.strip())
    old = made.with_name(f"{target_path.stem}-0123456789ab.f16.gguf")
    old.write_bytes(made.read_bytes())
    other = made.with_name(f"{target_path.stem}-ba9876543210.f16.gguf")
    data = bytearray(made.read_bytes())
    data[-1] ^= 0xFF
    other.write_bytes(bytes(data))
    again = spec("models", "derive", str(target_path), "--type", "f16")
    assert again.exit_code == 0 and again.stdout == first.stdout, again.output
    assert made.exists() and not old.exists() and other.exists()
    assert f"removed 1 older copy of {made.name} from the cache" in again.stderr
    quiet = spec("models", "derive", str(target_path), "--type", "f16")
    assert quiet.exit_code == 0 and "removed" not in quiet.stderr and other.exists()


def test_doctor_reports_versions_backend_and_locations(user_dirs: Path) -> None:
    result = spec("doctor")
    assert result.exit_code == 0, result.output
    for fact in ("llama-cpp-python", "0.3.36", "GPU offload", "CPU threads", "memory", "user pairs"):
        assert fact in result.stdout
    assert "CPU kernels" in result.stdout


def test_doctor_prints_the_gpu_reinstall_only_where_the_machine_has_a_gpu(user_dirs: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    if supports_gpu_offload():
        pytest.skip("this build offloads already")
    wide = {"COLUMNS": "400"}
    monkeypatch.setattr(models, "machine_gpu", lambda: None)
    assert "enable GPU" not in CliRunner().invoke(app, ["doctor"], env=wide).stdout
    monkeypatch.setattr(models, "machine_gpu", lambda: "an NVIDIA GPU")
    monkeypatch.setattr(models.sys, "platform", "linux")
    result = CliRunner().invoke(app, ["doctor"], env=wide)
    assert "this machine has an NVIDIA GPU, which this build cannot use: " \
           'CMAKE_ARGS="-DGGML_CUDA=on -DGGML_RPC=on" pip install' in result.stdout


def test_backends_are_read_from_system_info() -> None:
    info = "CUDA : ARCHS = 890 | USE_GRAPHS = 1 | CPU : SSE3 = 1 | AVX = 1 |"
    assert backends(info) == ["CUDA", "CPU"]
    assert backends("") == ["CPU"]


@pytest.mark.skipif(supports_gpu_offload(), reason="this build can offload to a GPU")
def test_gpu_layers_on_a_cpu_build_warn_once_and_run(target_path: Path) -> None:
    result = spec("run", "--target", str(target_path), "--no-draft", "--raw", "-n", "4", "--gpu-layers", "8", "hi")
    assert result.exit_code == 0
    warnings = [line for line in result.stderr.splitlines() if "no GPU support" in line]
    assert len(warnings) == 1


@pytest.fixture()
def hybrid_pair_name(tmp_path: Path, user_dirs: Path) -> str:
    """A user pair of tiny LFM2 files: a hybrid that llama.cpp rolls back in place."""
    target = write_model(tmp_path / "lfm2.gguf", 1, arch="lfm2")
    draft = write_model(tmp_path / "lfm2-draft.gguf", 1, arch="lfm2", noise=0.1)
    user_file = user_dirs / ".config" / "spec-cli" / "models.toml"
    user_file.parent.mkdir(parents=True)
    user_file.write_text(f'[pairs.tiny-lfm2]\ntarget = {{ path = "{target}" }}\ndraft = {{ path = "{draft}" }}\n'
                         f'draft_max = 6\n')
    return "tiny-lfm2"


def test_check_takes_a_pair_name_and_reports_memory(hybrid_pair_name: str) -> None:
    result = spec("models", "check", hybrid_pair_name)
    assert result.exit_code == 0, result.output
    assert "differs" not in result.stdout
    assert "target memory" in result.stdout and "hybrid; rollback: in place (up to 16 tokens)" in result.stdout
    assert "draft memory" in result.stdout and "hybrid; rollback: snapshot + replay" in result.stdout


def test_check_of_files_reports_each_memory(tmp_path: Path, target_path: Path) -> None:
    recurrent = write_model(tmp_path / "mamba.gguf", 1, arch="mamba")
    result = spec("models", "check", str(target_path), str(recurrent))
    assert result.exit_code == 0, result.output
    assert "attention; rollback: cut" in result.stdout and "recurrent; rollback: snapshot + replay" in result.stdout
    windowed = write_model(tmp_path / "gemma3.gguf", 1, arch="gemma3")
    result = spec("models", "check", str(windowed), str(target_path))
    assert "sliding window; rollback: cut (window 4)" in result.stdout


def test_check_of_a_pair_not_on_disk_says_how_to_get_it() -> None:
    result = spec("models", "check", "qwen3.5-9b")
    assert result.exit_code == 1
    assert result.stderr.strip() == "spec: error: pair 'qwen3.5-9b' is not on disk yet: spec models pull qwen3.5-9b"


def test_show_and_list_report_the_memory_kind(hybrid_pair_name: str) -> None:
    shown = spec("models", "show", hybrid_pair_name)
    assert shown.exit_code == 0, shown.output
    assert "hybrid" in shown.stdout and "in place (up to 16 tokens)" in shown.stdout
    listed = spec("models", "list")
    row = next(line for line in listed.stdout.splitlines() if "tiny-lfm2" in line)
    assert "hybrid" in row  # read from the file: the entry does not say
    qwen = next(line for line in listed.stdout.splitlines() if "qwen3.5-9b" in line)
    assert "hybrid" in qwen  # stated by the shipped entry, before any download


def test_doctor_reports_the_default_pairs_memory(hybrid_pair_name: str, user_dirs: Path) -> None:
    user_file = user_dirs / ".config" / "spec-cli" / "models.toml"
    user_file.write_text(f'default = "{hybrid_pair_name}"\n' + user_file.read_text())
    result = spec("doctor")
    assert result.exit_code == 0, result.output
    assert "tiny-lfm2: target memory" in result.stdout and "in place" in result.stdout


def test_show_reports_the_sampling_a_gguf_recommends(tmp_path: Path, user_dirs: Path) -> None:
    target = write_model(tmp_path / "recommends.gguf", 1, sampling={"temp": 0.6, "top_k": 20})
    user_file = user_dirs / ".config" / "spec-cli" / "models.toml"
    user_file.parent.mkdir(parents=True)
    user_file.write_text(f'[pairs.tiny]\ntarget = {{ path = "{target}" }}\ndraft = {{ path = "{target}" }}\n')
    result = spec("models", "show", "tiny")
    assert result.exit_code == 0, result.output
    assert "recommended sampling" in result.stdout
    assert "temp 0.6 · top_k 20" in " ".join(result.stdout.split())
