"""How `spec --help` and each command's help read: commands in the order a user meets them, and flags
without the `<bool>` Typer would print beside them (a flag takes no value)."""

from __future__ import annotations

from typing import Any

import typer.core

# run, chat, serve, bench, models, doctor, worker; the others (none today) after them.
ORDER = ("run", "chat", "batch", "serve", "bench", "models", "doctor", "worker")


def _untyped_flags(params: list[Any]) -> list[Any]:
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


class CommandGroup(typer.core.TyperGroup):
    """A Typer group whose commands are listed in `ORDER` and whose flags show no type."""

    def list_commands(self, ctx: Any) -> list[str]:
        names = super().list_commands(ctx)
        return sorted(names, key=lambda name: ORDER.index(name) if name in ORDER else len(ORDER))

    def get_params(self, ctx: Any) -> list[Any]:
        return _untyped_flags(super().get_params(ctx))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None and not isinstance(command, CommandGroup):
            _untyped_flags(command.get_params(ctx))
        return command
