"""install.sh picks the backend to build: CUDA where an NVIDIA driver is present, the CPU otherwise, always with
RPC, and CMAKE_ARGS given by the user wins (checked with --dry-run, which builds nothing)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "install.sh"


def dry_run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=30)


def without_cmake_args(path: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "CMAKE_ARGS"}
    env["PATH"] = path
    return env


def test_an_nvidia_driver_means_a_cuda_build_with_rpc(tmp_path: Path) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    done = dry_run(without_cmake_args(f"{tmp_path}:{os.environ['PATH']}"), "--dry-run")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == 'install.sh: would build llama-cpp-python for CUDA: ' \
                                  'CMAKE_ARGS="-DGGML_CUDA=on -DGGML_RPC=on"'


def test_a_machine_without_a_gpu_builds_for_the_cpu_with_rpc() -> None:
    if Path("/proc/driver/nvidia").exists() or (platform.system() == "Darwin" and platform.machine() == "arm64"):
        pytest.skip("this machine has a GPU")
    path = ":".join(p for p in os.environ["PATH"].split(":") if not (Path(p) / "nvidia-smi").exists())
    done = dry_run(without_cmake_args(path), "--dry-run")
    assert done.stdout.strip() == 'install.sh: would build llama-cpp-python for CPU: CMAKE_ARGS="-DGGML_RPC=on"'


def test_cmake_args_given_by_the_user_win(tmp_path: Path) -> None:
    env = {**os.environ, "CMAKE_ARGS": "-DGGML_VULKAN=on -DGGML_RPC=on"}
    done = dry_run(env, "--dry-run")
    assert done.stdout.strip() == 'install.sh: would build llama-cpp-python for your CMAKE_ARGS: ' \
                                  'CMAKE_ARGS="-DGGML_VULKAN=on -DGGML_RPC=on"'


def test_an_unknown_option_is_one_line_and_exit_status_2() -> None:
    done = dry_run(dict(os.environ), "--gpu")
    assert done.returncode == 2 and done.stderr.strip() == \
        "install.sh: unknown option '--gpu' (try --test, --dry-run or --help)"
