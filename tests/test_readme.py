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
