"""``rl-trace diff A B [--fail-if EXPR]``: per stage and role, the change in time per step between two
runs, with a noise band; a CI gate (a thin shell over :mod:`rl_trace_observer.analysis.query.diff`)."""

from __future__ import annotations

from pathlib import Path

import typer

from ..common.visible import visible


def register(app: typer.Typer) -> None:
    @app.command("diff", short_help="Compare two runs per stage and role, against the noise.")
    def diff_command(
        a: str = typer.Argument(
            ..., metavar="A", help="Baseline: a report JSON, a merged trace, shards or a run."
        ),
        b: str = typer.Argument(..., metavar="B", help="Candidate, the same kinds as A."),
        fail_if: list[str] | None = typer.Option(  # noqa: B008 (typer reads the default, never mutates it)
            None,
            "--fail-if",
            help="Exit 1 when a change crosses this threshold: KEY>VALUE or KEY<VALUE, KEY a series "
            "(step, trainer/update) or a category (update), VALUE with %, ns, us, ms or s: "
            "'update>+10%', 'step>+50ms'. Repeatable.",
        ),
        skip_first: int = typer.Option(
            0, "--skip-first", min=0, help="Leave out the first N steps (warm-up)."
        ),
        html: str | None = typer.Option(None, "--html", help="Write the diff as a self-contained HTML page."),
        json_path: str | None = typer.Option(
            None, "--json", help="Write the diff JSON (schema rl-trace-diff/1)."
        ),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No terminal table."),
    ) -> None:
        """Compare two runs: per stage and role, time per step in A and B, the change and its noise."""
        from rich.console import Console

        from ..analysis.query import diff as d
        from ..analysis.query import diff_render as r
        from ..common.atomic import write_atomic
        from .errors import check_output, make_parent, require_inputs

        require_inputs(a, b)
        check_output(html, "--html")
        check_output(json_path, "--json")
        try:
            thresholds = [d.Threshold.parse(t) for t in fail_if or []]
        except d.DiffError as exc:
            typer.echo(visible(f"error: {exc}"), err=True)
            raise typer.Exit(2) from None
        try:
            result = d.compare(d.load_summary(a), d.load_summary(b), skip_first=skip_first)
            failures = d.check(result, thresholds)
        except d.ThresholdError as exc:
            typer.echo(visible(f"error: {exc}"), err=True)
            raise typer.Exit(2) from None
        except d.DiffError as exc:
            typer.echo(visible(f"error: {exc}"), err=True)
            raise typer.Exit(1) from None
        for note in result.get("incomplete") or []:
            typer.echo(f"warning: {note}", err=True)
        if not result["rows"]:
            typer.echo(f"error: no steps to compare in {a} and {b} (no stage spans?)", err=True)
            raise typer.Exit(1)
        try:
            make_parent(html)
            make_parent(json_path)
            if html:
                write_atomic(Path(html), r.html(result).encode("utf-8"))
            if json_path:
                write_atomic(Path(json_path), r.json_bytes(result))
        except OSError as exc:
            typer.echo(f"error: cannot write the diff ({exc})", err=True)
            raise typer.Exit(1) from None
        if not quiet:
            console = Console()
            console.print(r.terminal(result, width=console.width))
        for path in (html, json_path):
            if path:
                typer.echo(f"wrote {path}", err=True)
        if failures:
            more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
            typer.echo(f"FAIL: {visible(failures[0])}{more}", err=True)
            raise typer.Exit(1)
        if thresholds:
            typer.echo(f"ok: {len(thresholds)} threshold(s) passed", err=True)
