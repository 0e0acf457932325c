"""``merge(inputs, output, options) -> MergeResult``: the whole merge, as a library call.

Plan in the parent (cheap: heads, names, process records), then read + rewrite + serialise each
file in worker processes, and stream their bytes into the output in job order. The output and its
manifest are written atomically; the manifest is written even when the merge fails.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..files.sources import InputError, discover
from ..manifest.document import manifest_path_for, new_manifest, set_problems, write_manifest
from ..manifest.fill import fill_manifest
from ..options import MergeOptions, MergeResult, UsageError, output_format, step_output
from ..plan.build import apply_records_to_artifacts, order_processes, plan_sources
from ..plan.plan import Plan
from ..plan.selection import Selection, select, window_ns
from ..run.execute import NothingUsable, run_all
from ..shards.layout import is_shards_dir
from ..timeline.model import Problem, Rebase

__all__ = ["MergeOptions", "MergeResult", "UsageError", "merge", "merge_steps"]

_MAX_REBASES = 3


def _options_dict(opts: MergeOptions) -> dict[str, Any]:
    d = asdict(opts)
    d.pop("progress", None)
    return d


def merge(inputs: list[str], output: str, options: MergeOptions | None = None) -> MergeResult:
    opts = options or MergeOptions()
    if len(inputs) == 1 and is_shards_dir(inputs[0]):  # a view: written from the rows, not the inputs
        if output.endswith(".tar"):
            from ..views.archive import merge_archive

            return merge_archive(inputs[0], output, opts)
        from ..views.view import merge_view

        return merge_view(inputs[0], output, opts)
    out_path = Path(output)
    fmt = output_format(output)
    if "://" in output:
        raise UsageError(f"{output}: the output must be a local path")
    manifest_path = Path(opts.manifest) if opts.manifest else manifest_path_for(output)
    if opts.shards:
        _shards_ready(opts.shards)
    try:
        sources = discover(inputs)
    except InputError as exc:
        raise UsageError(str(exc)) from exc
    resolved = out_path.resolve()
    for src in sources:
        if src.protocol in ("file", "local") and Path(src.path).resolve() in (
            resolved,
            manifest_path.resolve(),
        ):
            raise UsageError(f"{output}: is one of the inputs; choose another output path")
    manifest = new_manifest(str(out_path), fmt, [str(i) for i in inputs], _options_dict(opts))
    problems: list[Problem] = []
    started = time.monotonic()
    try:
        plan = plan_sources(sources)
        problems = plan.problems
        windows = select(plan, Selection(opts.run, opts.steps, opts.roles))
        apply_records_to_artifacts(plan)
        order_processes(plan)
        state = _run(plan, opts, fmt, out_path, windows, manifest)
        fill_manifest(manifest, plan, state)
    except Exception as exc:  # the manifest still says what was read and where it broke
        problems.append(Problem("incomplete", str(out_path), f"merge failed: {type(exc).__name__}: {exc}"))
        manifest["status"] = "failed"
        set_problems(manifest, problems)
        manifest["elapsed_s"] = round(time.monotonic() - started, 3)
        write_manifest(manifest_path, manifest)
        return MergeResult(str(out_path), str(manifest_path), manifest, 1, problems)
    set_problems(manifest, problems)
    manifest["elapsed_s"] = round(time.monotonic() - started, 3)
    written = manifest["output"]["written"] and manifest["counts"].get("events_kept", 0) > 0
    manifest["status"] = "failed" if not written else ("partial" if manifest["problems"] else "ok")
    if written and opts.shards:
        from ..manifest.shard_document import finish

        finish(opts.shards, plan, state, manifest, state.shard_parts, state.header)
    write_manifest(manifest_path, manifest)
    code = 0 if written and not (opts.strict and manifest["problems"]) else 1
    return MergeResult(str(out_path), str(manifest_path), manifest, code, problems)


def _shards_ready(shards: str) -> None:
    """pyarrow is there and the shard directory is not one of the inputs' files (one clear line)."""
    from ..shards.arrow import ShardsUnavailable, pyarrow

    try:
        pyarrow()
    except ShardsUnavailable as exc:
        raise UsageError(f"--shards {shards}: {exc}") from None
    if "://" in shards:
        raise UsageError(f"--shards {shards}: span shards are written to a local directory")


def _run(plan: Plan, opts: MergeOptions, fmt: str, out: Path, windows: Any, manifest: dict[str, Any]) -> Any:
    from .clock import clock_plan

    clock = clock_plan(plan, opts.clock_mode, opts.clock_tolerance_us)
    plan.problems.extend(clock.problems)
    manifest["timeline"]["clock"] = clock.section
    base = _base_hint(plan)
    replans: list[dict[str, int]] = []
    for _ in range(_MAX_REBASES + 1):
        eff = _effective_windows(windows, opts.time_window, base)
        try:
            state = run_all(plan, clock, fmt, out, base, eff, opts)
        except Rebase as rb:  # the heads did not hold the earliest event: not a problem of the data
            replans.append({"planned_base_ns": base, "earliest_event_ns": rb.min_ns})
            base = _floor_s(rb.min_ns)
            continue
        except NothingUsable as nothing:
            state = nothing.state
        if replans:
            manifest["timeline"]["base_replanned"] = replans
        plan.problems.extend(clock.check_causality(plan, state.outcomes))  # from the workers' summaries
        return state
    raise RuntimeError("could not find a timeline base below every event")


def _effective_windows(
    steps: tuple[tuple[int, int], ...], tw: tuple[float | None, float | None] | None, base: int
) -> tuple[tuple[int | None, int | None], ...]:
    if tw is None:
        return tuple(steps)
    lo, hi = window_ns(tw, base)
    if not steps:
        return ((lo, hi),)
    out = []
    for s_lo, s_hi in steps:
        a = s_lo if lo is None else max(s_lo, lo)
        b = s_hi if hi is None else min(s_hi, hi)
        if a <= b:
            out.append((a, b))
    return tuple(out) or ((0, 0),)


def _floor_s(ns: int) -> int:
    return max(0, (ns // 1_000_000_000 - 1) * 1_000_000_000)


def _base_hint(plan: Plan) -> int:
    """An early bound on the first event: file heads, process starts, step windows (1 s margin)."""
    hints = [a.hints.start_ns for a in plan.selected() if a.hints.start_ns]
    for art in plan.selected():
        owner = plan.processes.get(art.info.owner) if art.info.owner else None
        snaps = owner.record.get("clock_snapshots") if owner else None
        if snaps and isinstance(snaps[0], dict) and isinstance(snaps[0].get("wall_ns"), int):
            hints.append(snaps[0]["wall_ns"])
    hints += [lo for lo, _ in plan.step_windows.values()]
    hints = [h for h in hints if isinstance(h, int) and h > 0]
    return _floor_s(min(hints)) if hints else 1 << 62  # no hint: the first job tells (a rebase)


def merge_steps(inputs: list[str], output: str, options: MergeOptions | None = None) -> list[MergeResult]:
    """``--split-steps``: one output (and manifest) per step — the selected steps, else every step
    the run recorded a window for."""
    opts = options or MergeOptions()
    output_format(output)
    if len(inputs) == 1 and is_shards_dir(inputs[0]):
        from ..views.view import split_views

        return split_views(inputs[0], output, opts)
    if opts.shards:
        raise UsageError("--shards with --split-steps: write the shards once, then split them into views")
    if opts.steps:
        steps = sorted({s for lo, hi in opts.steps for s in range(lo, hi + 1)})
    else:
        try:
            plan = plan_sources(discover(inputs))
        except InputError as exc:
            raise UsageError(str(exc)) from exc
        steps = sorted(plan.step_windows)
    if not steps:
        raise UsageError("--split-steps: the inputs record no step windows (step_begin/step_end); use --step")
    results = []
    for step in steps:
        one = MergeOptions(**{**opts.__dict__, "steps": ((step, step),), "manifest": None})
        results.append(merge(inputs, step_output(output, step), one))
    return results
