"""The README's promises that a test can hold it to."""

from __future__ import annotations

import functools
import re
import shlex
from pathlib import Path

import pytest
import typer

from spec_cli.cli.app import app

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


DOCS = sorted((ROOT / "docs").glob("*.md"))


def documented_commands(path: Path) -> list[list[str]]:
    """The words of each `spec …` command in a page's bash blocks (after a pipe, `&&` or `(` too)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", path.read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.commenters = "#"
            command: list[str] = []
            for word in [*lexer, ";"]:
                if set(word) <= set("|&;()<>"):
                    if command and command[0] in ("spec", ".venv/bin/spec"):
                        commands.append(command)
                    command = []
                else:
                    command.append(word)
    return commands


@functools.cache
def spec_command() -> object:
    """spec's Typer app as the click command it runs as (building it takes a while: once)."""
    return typer.main.get_command(app)


def unknown_options(words: list[str]) -> list[str]:
    """The subcommands and options of a `spec` command's `words` that spec's Typer app does not know."""
    command, words = spec_command(), words[1:]
    while hasattr(command, "commands") and words and not words[0].startswith("-"):
        if words[0] not in command.commands:
            return [words[0]]
        command, words = command.commands[words[0]], words[1:]
    known = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)} | {"--help", "-h"}
    return [word.split("=")[0] for word in words if word.startswith("-") and word != "-"
            and word.split("=")[0] not in known and not re.fullmatch(r"-\d.*", word)]


def test_the_readme_links_every_page_of_docs_and_each_page_starts_with_its_minute() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 110
    assert {f"docs/{page.name}" for page in DOCS} == set(re.findall(r"\]\((docs/[\w-]+\.md)\)", readme))
    for page in DOCS:
        lines = page.read_text().splitlines()
        assert lines[0].startswith("# ") and lines[2].startswith("**In one minute.**"), page.name


@pytest.mark.parametrize("page", [ROOT / "README.md", *DOCS], ids=lambda page: page.name)
def test_every_documented_command_names_commands_and_options_that_exist(page: Path) -> None:
    commands = documented_commands(page)
    assert commands or page.name in PAGES_WITHOUT_COMMANDS
    for command_line in commands:
        assert not unknown_options(command_line), (command_line, unknown_options(command_line))


PAGES_WITHOUT_COMMANDS = {"how-it-works.md", "python-api.md", "development.md"}  # code, the loop, pytest


@pytest.mark.parametrize("page", [ROOT / "README.md", *DOCS], ids=lambda page: page.name)
def test_every_link_between_the_pages_leads_to_a_page(page: Path) -> None:
    targets = re.findall(r"\]\(([^)#\s]+\.md)(?:#[\w-]+)?\)", page.read_text())
    assert all((page.parent / target).is_file() for target in targets), targets
