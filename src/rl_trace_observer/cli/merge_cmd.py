"""``rl-trace merge``: every artifact of a run → one Perfetto timeline (a thin shell over
:func:`rl_trace_observer.merge.pipeline.merge`)."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer


def _progress() -> tuple[Any, Any]:
    """A rich progress bar on a terminal; nothing otherwise (CI logs stay clean)."""
    if not sys.stderr.isatty():
        return None, None
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TimeRemainingColumn

    bar = Progress("merging", BarColumn(), TaskProgressColumn(), TimeRemainingColumn(), transient=True)
    task = bar.add_task("merge", total=1)

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    return bar, update


def _report(results: list[Any]) -> int:
    from ..merge.manifest.document import problem_summary, why_nothing

    code = 0
    for res in results:
        for line in problem_summary(res.manifest["problems"]):
            typer.echo(f"warning: {line}", err=True)
        counts = res.manifest.get("counts", {})
        if res.usable:
            typer.echo(res.output)
            typer.echo(
                f"  {counts.get('events_kept', 0)} events, {counts.get('processes', 0)} processes; "
                f"manifest: {res.manifest_path}",
                err=True,
            )
            typer.echo(
                f"  open it at https://ui.perfetto.dev (Open trace file) or: rl-trace view {res.output}",
                err=True,
            )
        else:
            typer.echo(
                f"error: nothing usable was merged into {res.output} ({why_nothing(res.manifest)}); "
                f"see {res.manifest_path}",
                err=True,
            )
        if res.problems and res.exit_code and res.usable:
            typer.echo("error: --strict: problems were found (listed above)", err=True)
        code = max(code, res.exit_code)
    return code


def register(app: typer.Typer) -> None:
    @app.command("merge")
    def merge_command(
        inputs: Annotated[list[str], typer.Argument(help="Files, directories (recursive) or fsspec URLs.")],
        output: str = typer.Option(
            ..., "-o", "--output", help="Output: .pftrace.gz, .pftrace, .json.gz or .json."
        ),
        manifest: str | None = typer.Option(None, "--manifest", help="Manifest path [OUTPUT.manifest.json]."),
        run: str | None = typer.Option(None, "--run", help="Only this run id."),
        step: Annotated[
            list[str] | None, typer.Option("--step", help="Step N or range A-B (repeatable).")
        ] = None,
        role: Annotated[list[str] | None, typer.Option("--role", help="Only this role (repeatable).")] = None,
        time_window: str | None = typer.Option(
            None, "--time-window", help="START:END seconds from the timeline start (or Unix seconds)."
        ),
        min_duration_us: float = typer.Option(0.0, "--min-duration-us", min=0.0, help="Drop shorter slices."),
        split_steps: bool = typer.Option(False, "--split-steps", help="One output per step."),
        strict: bool = typer.Option(False, "--strict", help="Exit 1 when any problem is found."),
        clock: str = typer.Option("auto", "--clock", help="Clock alignment: auto, aligned or wall."),
        clock_tolerance_us: float = typer.Option(
            1000.0, "--clock-tolerance-us", min=0.0, help="Clock error above which hosts are reported."
        ),
        workers: int | None = typer.Option(None, "--workers", min=0, help="Worker processes [2]; 0: none."),
    ) -> None:
        """Merge RL-Insight logs, Torch/Kineto, VizTracer and TokenSpeed/Proton traces into one timeline."""
        from ..merge.options import MergeOptions, UsageError
        from ..merge.pipeline import merge, merge_steps
        from ..merge.plan.selection import parse_steps, parse_time_window

        try:
            opts = MergeOptions(
                run=run,
                steps=parse_steps(step or []),
                roles=tuple(role or ()),
                time_window=parse_time_window(time_window),
                min_duration_us=min_duration_us,
                strict=strict,
                workers=workers,
                manifest=manifest,
                clock_mode=clock,
                clock_tolerance_us=clock_tolerance_us,
            )
            if clock not in ("auto", "aligned", "wall"):
                raise ValueError(f"--clock {clock!r}: use auto, aligned or wall")
            if split_steps and manifest:
                raise ValueError("--manifest cannot be combined with --split-steps (one manifest per output)")
            bar, opts.progress = _progress()
            if bar is not None:
                bar.start()
            try:
                results = merge_steps(inputs, output, opts) if split_steps else [merge(inputs, output, opts)]
            finally:
                if bar is not None:
                    bar.stop()
        except (UsageError, ValueError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        raise typer.Exit(_report(results))
