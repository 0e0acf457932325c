"""``rl-trace merge``: every artifact of a run → one Perfetto timeline (a thin shell over
:func:`rl_trace_observer.merge.pipeline.merge`)."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from .ray_options import Address, NodeDir, NodeWorkers, OutputDir, StallTimeout, cluster_options


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
    from ..common.visible import visible
    from ..merge.manifest.document import problem_summary, strict_failure, why_nothing
    from ..merge.manifest.ui import hint

    code = 0
    for res in results:
        for line in problem_summary(res.manifest["problems"]):
            typer.echo(f"warning: {visible(line)}", err=True)  # a problem may quote a trace's name
        counts = res.manifest.get("counts", {})
        if res.usable:
            typer.echo(res.output)
            typer.echo(
                f"  {counts.get('events_kept', 0)} events, {counts.get('processes', 0)} processes; "
                f"manifest: {res.manifest_path}",
                err=True,
            )
            shards = res.manifest.get("shards")
            if shards:
                typer.echo(f"  span shards: {shards['dir']} ({shards['rows']} rows)", err=True)
            too_big = hint(res.manifest, res.output)
            if too_big:
                typer.echo(f"warning: {too_big}", err=True)
            typer.echo(
                f"  open it at https://ui.perfetto.dev (Open trace file) or: rl-trace view {res.output}",
                err=True,
            )
        elif res.problems and res.manifest.get("counts", {}).get("events_kept", 0) and res.exit_code:
            typer.echo(
                f"error: --strict: problems were found (listed above); see {res.manifest_path}", err=True
            )
        else:
            typer.echo(
                f"error: nothing usable was merged into {res.output} ({why_nothing(res.manifest)}); "
                f"see {res.manifest_path}",
                err=True,
            )
        if res.manifest["output"].get("kept_earlier"):
            typer.echo(
                f"  {res.output} and its manifest are left as they were (an earlier merge's)", err=True
            )
        if res.problems and res.exit_code and res.usable:
            typer.echo(visible(f"error: {strict_failure(res.manifest['problems'])}"), err=True)
        code = max(code, res.exit_code)
    return code


def _ray(output: str, opts: Any, inputs: list[str] | None, split_steps: bool, cluster: Any) -> Any:
    from ..cluster.merge import ray_merge

    if inputs:
        raise ValueError(
            "--ray reads every node's output directory: give no inputs (--output-dir, --node-dir)"
        )
    if split_steps:
        raise ValueError(
            "--ray with --split-steps: merge once with --shards DIR, then: rl-trace merge DIR --split-steps"
        )
    return ray_merge(output, opts, cluster)


def register(app: typer.Typer) -> None:
    @app.command("merge", short_help="Merge every trace of a run into one Perfetto timeline.")
    def merge_command(
        inputs: Annotated[
            list[str] | None,
            typer.Argument(
                help="Files, directories (recursive) or fsspec URLs; a span shard directory for views; "
                "none with --ray."
            ),
        ] = None,
        output: str = typer.Option(
            ..., "-o", "--output", help="Output: .pftrace.gz, .pftrace, .json.gz or .json."
        ),
        manifest: str | None = typer.Option(
            None, "--manifest", help="Manifest path (default: OUTPUT.manifest.json)."
        ),
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
        workers: int | None = typer.Option(
            None, "--workers", min=0, help="Worker processes (default: 2); 0: none."
        ),
        shards: str | None = typer.Option(
            None, "--shards", help="Also write span shards (Parquet rows, for reports and views) here."
        ),
        ray: bool = typer.Option(
            False, "--ray", help="Merge the running Ray cluster's node-local outputs, converted on the nodes."
        ),
        address: Address = None,
        output_dir: OutputDir = None,
        node_dir: NodeDir = None,
        node_workers: NodeWorkers = 1,
        stall_timeout: StallTimeout = 600.0,
    ) -> None:
        """Merge RL-Insight logs, Torch/Kineto, VizTracer and TokenSpeed/Proton traces into one timeline."""
        from ..merge.options import MergeOptions, UsageError
        from ..merge.pipeline import merge, merge_steps
        from ..merge.plan.selection import parse_steps, parse_time_window
        from .errors import check_output

        check_output(output, "-o/--output")
        check_output(manifest, "--manifest")
        check_output(shards, "--shards", directory=True)
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
                shards=shards,
            )
            if clock not in ("auto", "aligned", "wall"):
                raise ValueError(f"--clock {clock!r}: use auto, aligned or wall")
            if split_steps and manifest:
                raise ValueError("--manifest cannot be combined with --split-steps (one manifest per output)")
            if ray:
                cluster = cluster_options(address, output_dir, node_dir, node_workers, stall_timeout)
                results = [_ray(output, opts, inputs, split_steps, cluster)]
            else:
                if not inputs:
                    raise ValueError(
                        "give the inputs to merge (or --ray to merge a running Ray cluster's nodes)"
                    )
                bar, opts.progress = _progress()
                if bar is not None:
                    bar.start()
                try:
                    results = (
                        merge_steps(inputs, output, opts) if split_steps else [merge(inputs, output, opts)]
                    )
                finally:
                    if bar is not None:
                        bar.stop()
        except (UsageError, ValueError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        raise typer.Exit(_report(results))
