"""``rl-trace config``: show every RL_TRACE_* setting and how this environment resolves them."""

from __future__ import annotations

import os
from typing import Any

import typer

from .. import config as config_mod
from ..common.encoding import dumps_pretty


def field_of(variable: str) -> str:
    """The ``Config`` field a variable sets: ``RL_TRACE_OUTPUT_DIR`` → ``output_dir``."""
    return variable.removeprefix("RL_TRACE_").lower()


def by_variable(cfg: config_mod.Config, env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Each documented variable as the user spells it: its validated value, what the environment
    said (null: unset) and the documented default."""
    values = config_mod.as_dict(cfg)
    return {
        s.name: {"value": values[field_of(s.name)], "environment": env.get(s.name), "default": s.default}
        for s in config_mod.SETTINGS
    }


def register(app: typer.Typer) -> None:
    @app.command("config", short_help="Show every RL_TRACE_* variable and its value here.")
    def config_command(
        markdown: bool = typer.Option(False, "--markdown", help="Print the README's settings table."),
    ) -> None:
        """Show every RL_TRACE_* variable: its validated value in this environment, what the environment
        set (null: unset) and the default."""
        if markdown:
            typer.echo(config_mod.markdown_table())
            return
        env = dict(os.environ)
        cfg = config_mod.load(env)
        typer.echo(dumps_pretty(by_variable(cfg, env)).decode())
        for problem in cfg.problems:
            typer.echo(f"warning: {problem}", err=True)
