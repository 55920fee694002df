"""Where a pair's models run: every layer that fits on a GPU or workers by default, the CPU otherwise, and the
run says where (decided against a device list given by hand: no GPU here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spec_cli import load_pair
from spec_cli.cli.app import app
from spec_cli.llama import placement


@pytest.mark.parametrize("given, workers, gpus, expected", [
    (None, False, [], 0),  # a CPU-only machine (or build)
    (None, False, ["CUDA0"], -1),  # a GPU: every layer that fits, as llama.cpp does by default
    (None, True, [], -1),  # RPC workers
    (0, False, ["CUDA0"], 0),  # --gpu-layers 0 keeps a model on the CPU
    (12, False, ["Metal"], 12),
])
def test_layers_go_to_a_gpu_by_default(given: int | None, workers: bool, gpus: list[str], expected: int) -> None:
    assert placement.default_gpu_layers(given, workers, gpus) == expected


def test_placement_names_the_devices() -> None:
    assert placement.describe(0, [], ["CUDA0"]) == "CPU"
    assert placement.describe(-1, [], []) == "CPU"
    assert placement.describe(-1, [], ["CUDA0"]) == "CUDA0 (every layer that fits; the rest on the CPU)"
    assert placement.describe(20, ["10.0.0.2:50052"], ["CUDA0"]) == "10.0.0.2:50052, CUDA0 (20 layers; the rest on the CPU)"


def test_files_given_directly_go_to_the_gpu_a_mocked_machine_has(monkeypatch: pytest.MonkeyPatch,
                                                                 target_path: Path, other_draft_path: Path) -> None:
    """The decision for files as for registry pairs; this build has no GPU, so llama.cpp itself keeps the
    layers on the CPU whatever it is asked, and the run names the device it was told about."""
    asked: list[int] = []
    model_class = placement.Model

    def recording(path: Path, layers: int, **kwargs: object) -> placement.Model:
        asked.append(layers)
        return model_class(path, layers, **kwargs)

    monkeypatch.setattr(placement, "local_gpu_names", lambda: ["CUDA0"])
    monkeypatch.setattr(placement, "Model", recording)
    with load_pair(target_path, other_draft_path) as loaded:
        assert asked == [-1, -1]
        assert loaded.placement()["target"].startswith("CUDA0")
    with load_pair(target_path, other_draft_path, gpu_layers=0, draft_gpu_layers=0) as loaded:
        assert asked[2:] == [0, 0] and loaded.placement() == {"target": "CPU", "draft": "CPU"}


def test_the_run_says_where_each_model_runs(monkeypatch: pytest.MonkeyPatch, target_path: Path,
                                            other_draft_path: Path) -> None:
    base = ["run", "--target", str(target_path), "--draft", str(other_draft_path), "-n", "4", "--raw"]
    on_cpu = CliRunner().invoke(app, [*base, "--json", "hi"])
    assert json.loads(on_cpu.stdout)["stats"]["placement"] == {"target": "CPU", "draft": "CPU"}
    assert " on CPU" not in on_cpu.stderr  # all on the CPU: nothing worth a word in the summary
    monkeypatch.setattr(placement, "local_gpu_names", lambda: ["CUDA0"])
    on_gpu = CliRunner().invoke(app, [*base, "hi"], env={"COLUMNS": "400"})
    assert on_gpu.exit_code == 0, on_gpu.output
    assert "target on CUDA0 (every layer that fits" in on_gpu.stderr and "draft on CUDA0" in on_gpu.stderr
