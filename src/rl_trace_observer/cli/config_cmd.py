"""``rl-trace config``: show every RL_TRACE_* setting and how this environment resolves them."""

from __future__ import annotations

import typer

from .. import config as config_mod
from ..common.encoding import dumps_pretty


def register(app: typer.Typer) -> None:
    @app.command("config")
    def config_command(
        markdown: bool = typer.Option(False, "--markdown", help="Print the README's settings table."),
    ) -> None:
        """Show every RL_TRACE_* variable and its validated value in this environment."""
        if markdown:
            typer.echo(config_mod.markdown_table())
            return
        cfg = config_mod.load()
        typer.echo(dumps_pretty(config_mod.as_dict(cfg)).decode())
        for problem in cfg.problems:
            typer.echo(f"warning: {problem}", err=True)
