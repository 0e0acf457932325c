"""``rl-trace`` entry point. Each subcommand lives in its own module and registers itself here.

Exit codes: 0 success, 1 runtime failure (one stderr line naming the file and the fix),
2 usage error (typer/click's own convention; an input path that does not exist is one): cli/errors.py.
"""

from __future__ import annotations

import importlib
import sys

import typer

app = typer.Typer(
    name="rl-trace",
    help="RL Trace Observer: one correct Perfetto timeline for a distributed RL training run.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's plain help: fits 80 columns (cli/help_text.py)
)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"rl-trace {version('rl-trace-observer')}")
        except PackageNotFoundError:  # run from a source tree without an install
            typer.echo("rl-trace (not installed: no version)")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="Print the version and exit."
    ),
) -> None:
    """RL Trace Observer: one correct Perfetto timeline for a distributed RL training run."""


# Subcommand modules, imported lazily by name so `rl-trace --help` stays fast and a broken
# optional command cannot take the others down.
COMMAND_MODULES = (
    "config_cmd",
    "collect_cmd",
    "merge_cmd",
    "demo_cmd",
    "report_cmd",
    "view_cmd",
    "sql_cmd",
    "diff_cmd",
    "watch_cmd",
)


def _load_commands() -> None:
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"{__package__}.{name}")
        module.register(app)


def main(argv: list[str] | None = None) -> int:
    from typer.main import get_command

    from .help_text import tidy

    _load_commands()
    try:
        tidy(get_command(app)).main(args=argv, prog_name="rl-trace", standalone_mode=True)
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except OSError as exc:  # any subcommand: one line naming the path, never a traceback
        from .errors import os_error_line

        typer.echo(os_error_line(exc), err=True)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
