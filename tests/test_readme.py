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


def test_both_lines_install_through_the_script_that_builds_with_rpc_and_sees_through_the_wheel_cache() -> None:
    """pip's wheel cache ignores CMAKE_ARGS: install.sh checks the build and rebuilds the pinned version."""
    pinned = re.search(r'"(llama-cpp-python==[^"]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    script = (ROOT / "install.sh").read_text()
    assert f'LLAMA_CPP_PYTHON="{pinned}"' in script
    assert 'pip cache remove llama_cpp_python' in script and '--force-reinstall --no-deps --no-cache-dir "$LLAMA_CPP_PYTHON"' in script
    for flags in ("-DGGML_CUDA=on -DGGML_RPC=on", "-DGGML_METAL=on -DGGML_RPC=on", "-DGGML_RPC=on"):
        assert f'export CMAKE_ARGS="{flags}"' in script
    run_line, test_line = quickstart_commands()
    assert run_line.startswith("./install.sh && ") and test_line == "./install.sh --test && .venv/bin/pytest"
