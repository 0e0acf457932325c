"""``rl-trace report INPUT``: where each step's time went, as tables, HTML and JSON (a thin shell over
:mod:`rl_trace_observer.analysis.report.output`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from ..common.visible import visible


def register(app: typer.Typer) -> None:
    @app.command("report", short_help="Where each step's time went: terminal, HTML and JSON.")
    def report_command(
        input: str = typer.Argument(
            ...,
            metavar="INPUT",
            help="A merged trace (.json.gz, .json; a .pftrace whose merge wrote --shards), span shards "
            "(merge --shards DIR) or a run directory to merge first.",
        ),
        html: str | None = typer.Option(None, "--html", help="Write a self-contained HTML report here."),
        json_path: str | None = typer.Option(
            None, "--json", help="Write the JSON summary (schema rl-trace-report/4)."
        ),
        manifest: str | None = typer.Option(
            None, "--manifest", help="Merge manifest (default: INPUT.manifest.json)."
        ),
        top: int = typer.Option(10, "--top", min=1, help="Rows in the stragglers table."),
        critical_path: str | None = typer.Option(
            None,
            "--critical-path",
            help="Also write the merged trace with the critical path drawn in (a `critical path` track "
            "and a flow chain) to this .json.gz.",
        ),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No terminal tables (files only)."),
    ) -> None:
        """Where each step's time went: per role and rank, overlap, stragglers, metrics, clock, artifacts."""
        from rich.console import Console

        from ..analysis.report.inputs import InputError
        from ..analysis.report.load import TraceError
        from ..analysis.report.output import summarize, write_outputs
        from ..analysis.report.terminal import render
        from .errors import check_output, make_parent, require_inputs

        require_inputs(input)
        check_output(html, "--html")
        check_output(json_path, "--json")
        check_output(critical_path, "--critical-path")
        try:
            summary = summarize(input, manifest=manifest)
            for path in (html, json_path, critical_path):
                make_parent(path)
            written = write_outputs(summary, html=html, json_path=json_path)
        except (InputError, TraceError) as exc:
            typer.echo(visible(f"error: {exc}"), err=True)
            raise typer.Exit(1) from None
        except OSError as exc:
            typer.echo(f"error: cannot write the report ({exc})", err=True)
            raise typer.Exit(1) from None
        if critical_path:
            written.append(_draw_path(input, summary, Path(critical_path)))
        if not quiet:
            render(summary, Console(), top=top)
        for path in written:
            typer.echo(f"wrote {path}", err=True)
        if summary["source"].get("read_error"):
            typer.echo(
                f"warning: {visible(summary['source']['read_error'])}; reported on what the merge kept "
                f"(rl-trace merge {input} -o FILE.json.gz keeps it too)",
                err=True,
            )
        if summary["source"].get("missing_note"):
            typer.echo(f"warning: {summary['source']['missing_note']}", err=True)
        if summary["source"].get("manifest_note"):
            typer.echo(f"warning: {summary['source']['manifest_note']}; reported without it", err=True)
        if not summary["steps"]:
            typer.echo("warning: no RL-Insight stage spans or known stage names in this trace", err=True)
        if critical_path:  # the file that shows what the report just found
            typer.echo(f"next: rl-trace view {critical_path}", err=True)
        elif Path(input).is_file() and not summary["source"].get("read_error"):
            typer.echo(f"next: rl-trace view {input}", err=True)


def _draw_path(input: str, summary: dict[str, Any], output: Path) -> Path:
    from ..analysis.query.highlight import merged_json, write_with_path
    from ..analysis.report.inputs import InputError

    try:
        with merged_json(input) as trace:
            write_with_path(trace, summary["critical_path"], output)
    except InputError as exc:
        typer.echo(visible(f"error: {exc}"), err=True)
        raise typer.Exit(1) from None
    except OSError as exc:
        typer.echo(f"error: cannot write {output} ({exc})", err=True)
        raise typer.Exit(1) from None
    return output
