"""``rl-trace report INPUT``: where each step's time went, as tables, HTML and JSON (a thin shell over
:mod:`rl_trace_observer.analysis.report.output`)."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report_command(
        input: str = typer.Argument(
            ..., metavar="INPUT", help="A merged trace (.json, .json.gz) or a run directory to merge first."
        ),
        html: str | None = typer.Option(None, "--html", help="Write a self-contained HTML report here."),
        json_path: str | None = typer.Option(
            None, "--json", help="Write the JSON summary (schema rl-trace-report/2)."
        ),
        manifest: str | None = typer.Option(
            None, "--manifest", help="Merge manifest (default: INPUT.manifest.json)."
        ),
        top: int = typer.Option(10, "--top", min=1, help="Rows in the stragglers table."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No terminal tables (files only)."),
    ) -> None:
        """Where each step's time went: per role and rank, overlap, stragglers, metrics, clock, artifacts."""
        from rich.console import Console

        from ..analysis.report.inputs import InputError
        from ..analysis.report.load import TraceError
        from ..analysis.report.output import summarize, write_outputs
        from ..analysis.report.terminal import render

        try:
            summary = summarize(input, manifest=manifest)
            written = write_outputs(summary, html=html, json_path=json_path)
        except (InputError, TraceError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
        except OSError as exc:
            typer.echo(f"error: cannot write the report ({exc})", err=True)
            raise typer.Exit(1) from None
        if not quiet:
            render(summary, Console(), top=top)
        for path in written:
            typer.echo(f"wrote {path}", err=True)
        if not summary["steps"]:
            typer.echo("warning: no RL-Insight stage spans or known stage names in this trace", err=True)
        if Path(input).is_file():
            typer.echo(f"next: rl-trace view {input}", err=True)
