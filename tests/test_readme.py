"""The README's promises that a test can hold it to."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def quickstart_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section)


def test_quickstart_is_two_lines_one_runs_the_demo_one_runs_the_tests() -> None:
    install_and_run, install_and_test = quickstart_commands()
    assert "spec run" in install_and_run
    assert install_and_test.endswith("pytest")


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    _, install_and_test = quickstart_commands()
    assert install_and_test in (ROOT / ".ci" / "run").read_text().splitlines()


def test_both_lines_build_llama_cpp_with_rpc_even_over_a_cached_wheel() -> None:
    """pip's wheel cache ignores CMAKE_ARGS: each line checks the build and rebuilds the pinned version."""
    pinned = re.search(r'"(llama-cpp-python==[^"]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    for line in quickstart_commands():
        assert 'export CMAKE_ARGS="-DGGML_RPC=on"' in line and "llama_cpp.llama_supports_rpc()" in line
        assert f'pip cache remove llama_cpp_python || true; pip install --force-reinstall --no-deps "{pinned}"' in line
