"""THE merge, given an executor: locate → plan → select → clock plan → jobs → run (re-based if needed)
→ manifest → status → shards. One sequence for every way a merge runs.

What differs is the executor (:class:`Executor`): where the files are and where the jobs run — a local
process pool (:mod:`.local`: ``rl-trace merge``) or one Ray task per node
(:mod:`rl_trace_observer.cluster.merge`: ``--ray``, ``collect --convert``). Both stitch their jobs'
pieces through the same :class:`..job.stitch.Stitcher`, so the bytes are the same. The output and its
manifest are one unit (:mod:`..manifest.pair`): committed together when the merge succeeds; a merge
that fails (``--strict`` included, where an earlier output is there) leaves an earlier pair untouched
and writes its manifest beside it. Temp files of killed merges to the same output are swept first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..files.sources import Source
from ..job.spec import Job
from ..job.stitch import NothingUsable, RunState, Stitcher, trace_header
from ..manifest.document import manifest_path_for, new_manifest, set_problems
from ..manifest.fill import fill_manifest
from ..manifest.pair import commit, record_failure
from ..options import MergeOptions, MergeResult, UsageError, output_format
from ..output import owned
from ..plan.build import Prepared, apply_records_to_artifacts, order_processes, plan_sources
from ..plan.plan import Plan
from ..plan.selection import Selection, select, window_ns
from ..timeline.model import Problem, Rebase
from ..timeline.times import plausible
from .clock import ClockChoice, clock_plan
from .jobs import build_jobs

if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import TracebackType

MAX_REBASES = 3


@dataclass
class Located:
    """Where a merge reads and writes, known before anything is planned (usage errors end here)."""

    out: Path
    opts: MergeOptions  # as given, or with what locating decided (a Ray merge's ``{run_id}``)
    inputs: list[str]  # what the manifest lists as its inputs
    options: dict[str, Any]  # what the manifest lists as its options
    problems: list[Problem] = field(default_factory=list)  # found while locating (dead nodes)


@dataclass
class Inventory:
    """The input files, and what was read of them where they are (files this process cannot open)."""

    sources: list[Source]
    prepared: Mapping[str, Prepared] | None = None
    ignored: list[str] = field(default_factory=list)  # left out before planning (earlier merges' outputs)


class Executor(Protocol):
    """Where a merge's files are and where its jobs run. A context manager: ``__exit__`` lets go of
    what ``locate`` took hold of (a Ray connection)."""

    def __enter__(self) -> Executor: ...

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None: ...

    def locate(self, output: str, opts: MergeOptions) -> Located:
        """The output path and the inputs; :class:`UsageError` when they are wrong."""
        ...

    def inventory(self) -> Inventory: ...

    def estimate(self, src: Source) -> int:
        """A file's decompressed size (orders the jobs: every executor must give the same)."""
        ...

    def run(self, jobs: list[Job], stitch: Stitcher, problems: list[Problem]) -> RunState:
        """Run the jobs and stitch their pieces in job order (``stitch.output()``); may raise
        :class:`Rebase` (an event before the base) or :class:`NothingUsable`. What it finds on the way
        goes to ``problems``."""
        ...

    def report(self, manifest: dict[str, Any], problems: list[Problem], failed: bool) -> None:
        """Its own manifest section and problems (a Ray merge: the nodes and what they missed)."""
        ...

    def finished(self, manifest: dict[str, Any], written: bool) -> None:
        """After the manifest is complete (a Ray merge: the shards' completeness, its store)."""
        ...


def run_merge(executor: Executor, output: str, opts: MergeOptions) -> MergeResult:
    """Merge what ``executor`` finds into ``output`` (raises :class:`UsageError` for bad arguments)."""
    fmt = output_format(output)
    if "://" in output:
        raise UsageError(f"{output}: the output must be a local path")
    if opts.shards:
        _shards_ready(opts.shards)
    with executor:
        return _merge(executor, executor.locate(output, opts), fmt)


def _merge(ex: Executor, loc: Located, fmt: str) -> MergeResult:
    out, opts = loc.out, loc.opts
    manifest_path = Path(opts.manifest) if opts.manifest else manifest_path_for(out)
    manifest = new_manifest(str(out), fmt, loc.inputs, loc.options)
    problems = list(loc.problems)
    started = time.monotonic()
    _sweep_leftovers(out, manifest_path, opts.shards)
    shards_before = _files_under(opts.shards)
    try:
        inv = ex.inventory()
        plan = plan_sources(inv.sources, inv.prepared)
        plan.ignored.extend(inv.ignored)
        problems.extend(plan.problems)
        plan.problems = problems
        windows = select(plan, Selection(opts.run, opts.steps, opts.roles))
        apply_records_to_artifacts(plan)
        order_processes(plan)
        state = _run(ex, plan, opts, fmt, out, windows, manifest)
        fill_manifest(manifest, plan, state)
    except Exception as exc:  # the manifest still says what was read and where it broke
        owned.temp_path(out).unlink(missing_ok=True)  # a completed output this merge will not commit
        _discard_new_files(opts.shards, shards_before)  # no half shard directory stays behind
        problems.append(Problem("incomplete", str(out), f"merge failed: {type(exc).__name__}: {exc}"))
        manifest["status"] = "failed"
        ex.report(manifest, problems, failed=True)
        set_problems(manifest, problems)
        manifest["elapsed_s"] = round(time.monotonic() - started, 3)
        where = record_failure(out, manifest_path, manifest)
        return MergeResult(str(out), str(where), manifest, 1, problems)
    ex.report(manifest, problems, failed=False)
    set_problems(manifest, problems)
    manifest["elapsed_s"] = round(time.monotonic() - started, 3)
    written = manifest["output"]["written"] and manifest["counts"].get("events_kept", 0) > 0
    manifest["status"] = "failed" if not written else ("partial" if manifest["problems"] else "ok")
    code = 0 if written and not (opts.strict and manifest["problems"]) else 1
    if written and code and out.exists():  # --strict failed: the earlier output and manifest stay
        written = False
        manifest["output"]["written"] = False
        manifest["status"] = "failed"
    if not written:
        if state.pending is not None:
            state.pending.unlink(missing_ok=True)
        _discard_new_files(opts.shards, shards_before)
        ex.finished(manifest, False)
        where = record_failure(out, manifest_path, manifest)
        return MergeResult(str(out), str(where), manifest, code, problems)
    if opts.shards:
        from ..manifest.shard_document import finish

        finish(opts.shards, plan, state, manifest, state.shard_parts, state.header)
    ex.finished(manifest, True)
    assert state.pending is not None
    commit(state.pending, out, manifest_path, manifest)
    return MergeResult(str(out), str(manifest_path), manifest, code, problems)


def _sweep_leftovers(out: Path, manifest_path: Path, shards: str | None) -> None:
    """Temp files of earlier merges to this output that were killed (:mod:`..output.owned`)."""
    owned.claim()
    owned.sweep(out.parent, {out.name})
    owned.sweep(manifest_path.parent, {manifest_path.name})
    if shards:
        owned.sweep(Path(shards), set(), recursive=True)


def _files_under(root: str | None) -> set[Path] | None:
    """What a shard directory holds before this merge writes into it (None: no --shards)."""
    if not root:
        return None
    folder = Path(root)
    return {p for p in folder.rglob("*")} | {folder} if folder.exists() else set()


def _discard_new_files(root: str | None, before: set[Path] | None) -> None:
    """After a failed merge: remove what it wrote under ``root`` (parts, partition folders), deepest first."""
    if not root or before is None or not Path(root).exists():
        return
    for path in sorted({*Path(root).rglob("*"), Path(root)} - before, key=lambda p: -len(p.parts)):
        try:
            path.rmdir() if path.is_dir() else path.unlink()
        except OSError:  # not empty (a file it did not write) or gone: leave it
            pass


def _shards_ready(shards: str) -> None:
    """pyarrow is there and the shard directory is local (one clear line)."""
    from ..shards.arrow import ShardsUnavailable, pyarrow

    try:
        pyarrow()
    except ShardsUnavailable as exc:
        raise UsageError(f"--shards {shards}: {exc}") from None
    if "://" in shards:
        raise UsageError(f"--shards {shards}: span shards are written to a local directory")


def _run(
    ex: Executor, plan: Plan, opts: MergeOptions, fmt: str, out: Path, windows: Any, manifest: dict[str, Any]
) -> RunState:
    """Clocks, then the jobs; again from a lower base while an event lies below it."""
    clock = clock_plan(plan, opts.clock_mode, opts.clock_tolerance_us)
    plan.problems.extend(clock.problems)
    manifest["timeline"]["clock"] = clock.section
    base = base_hint(plan)
    replans: list[dict[str, int]] = []
    for _ in range(MAX_REBASES + 1):
        eff = effective_windows(windows, opts.time_window, base)
        jobs = build_jobs(plan, clock, fmt, base, eff, opts, estimate=ex.estimate)
        try:
            state = ex.run(jobs, _stitcher(out, fmt, base, clock, plan), plan.problems)
        except Rebase as rb:  # the heads did not hold the earliest event: not a problem of the data
            replans.append({"planned_base_ns": base, "earliest_event_ns": rb.min_ns})
            base = floor_s(rb.min_ns)
            continue
        except NothingUsable as nothing:
            state = nothing.state
        if replans:
            manifest["timeline"]["base_replanned"] = replans
        plan.problems.extend(clock.check_causality(plan, state.outcomes))  # from the jobs' summaries
        return state
    raise RuntimeError("could not find a timeline base below every event")


def _stitcher(out: Path, fmt: str, base: int, clock: ClockChoice, plan: Plan) -> Stitcher:
    header = trace_header(base, clock.section.get("mode", "wall"), clock.trace_metadata())
    return Stitcher(out, fmt, base, header, clock.titles(plan), clock.pftrace_metadata())


def effective_windows(
    steps: tuple[tuple[int, int], ...], tw: tuple[float | None, float | None] | None, base: int
) -> tuple[tuple[int | None, int | None], ...]:
    """The time windows events must fall in: the selected steps', cut to ``--time-window``."""
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


def floor_s(ns: int) -> int:
    return max(0, (ns // 1_000_000_000 - 1) * 1_000_000_000)


def base_hint(plan: Plan) -> int:
    """An early bound on the first event: file heads, process starts, step windows (1 s margin)."""
    hints = [a.hints.start_ns for a in plan.selected() if a.hints.start_ns]
    for art in plan.selected():
        owner = plan.processes.get(art.info.owner) if art.info.owner else None
        snaps = owner.record.get("clock_snapshots") if owner else None
        if snaps and isinstance(snaps[0], dict) and isinstance(snaps[0].get("wall_ns"), int):
            hints.append(snaps[0]["wall_ns"])
    hints += [lo for lo, _ in plan.step_windows.values()]
    hints = [h for h in hints if plausible(h)]  # an absurd time never moves the base (times.EARLIEST_NS)
    return floor_s(min(hints)) if hints else 1 << 62  # no hint: the first job tells (a rebase)
