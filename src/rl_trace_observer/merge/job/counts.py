"""Stage 4: what a file read, kept and left out, and why — its manifest entry, one problem line.

Why in one place: every "events left out" line a user sees comes from here, so the reasons a reader,
the passes and the job itself give are counted alike and said once per file.
"""

from __future__ import annotations

from collections import Counter
from operator import attrgetter

from ..clock.probe import stage_spans
from ..formats import ReadResult
from ..formats.base import ClockEvidence
from ..timeline.model import Problem
from ..transform.flowbind import UNBOUND
from ..transform.outliers import OUTLIERS
from ..transform.passes import BAD_PID, WHY_BAD_PID
from .file import FileJob, JobRun
from .spec import JobResult, Outcome, Task

# why an event was left out, for what the reader could not tell apart (it counts them in one number)
WHY_VALUES = "a time that is not a number, out of range or before 2001, or an unknown phase"
WHY_OUTLIERS = "timed over 92 days away from the file's others"
WHY_UNBOUND = "flow events no slice of their thread can take (Perfetto drops them too)"


def account(f: FileJob, run: JobRun) -> None:
    """The file's counts after the passes; the identities it declared join the job's."""
    out, res, ctx, mapper = f.out, f.res, f.ctx, f.mapper
    assert res is not None and ctx is not None and mapper is not None
    if isinstance(mapper.reader, ClockEvidence):  # the few spans the clock's causality checks need
        out.spans = stage_spans(f.kept, mapper.reader.probe_cat, f.relative_to, f.unit_ns, f.far)
    left_out = ctx.stats.get(UNBOUND, 0) + ctx.stats.get(OUTLIERS, 0) + ctx.stats.get(BAD_PID, 0)
    out.read = res.read - res.metadata
    out.dropped = res.dropped + ctx.stats.get("unlinked_scope_flows", 0) + left_out
    report_dropped(out, res, f.url, ctx.stats)
    out.stats = ctx.stats
    out.filtered = ctx.stats.get("filtered", 0)
    out.kept = len(f.kept)
    if not f.fast:  # the fused loop counted them
        out.phases = dict(Counter(map(attrgetter("ph"), f.kept)))
    run.result.processes.update(mapper.processes)
    run.result.threads.update(mapper.threads)


def dropped_why(res: ReadResult, stats: dict[str, int]) -> dict[str, int]:
    """Reason -> events left out of one file (the manifest entry's ``dropped_why``)."""
    why = {k: n for k, n in res.dropped_why.items() if n}
    told = sum(why.values())
    if res.dropped > told:
        why[WHY_VALUES] = why.get(WHY_VALUES, 0) + res.dropped - told
    for key, reason in ((BAD_PID, WHY_BAD_PID), (OUTLIERS, WHY_OUTLIERS), (UNBOUND, WHY_UNBOUND)):
        if stats.get(key):
            why[reason] = why.get(reason, 0) + stats[key]
    return why


def report_dropped(out: Outcome, res: ReadResult, path: str, stats: dict[str, int] | None = None) -> None:
    """One ``dropped_events`` problem per file: what its reader and the passes left out, and why."""
    why = dropped_why(res, stats or {})
    for reason, n in why.items():
        out.dropped_why[reason] = out.dropped_why.get(reason, 0) + n
    if any(p.kind == "dropped_events" for p in out.problems) or not out.dropped_why:
        return
    total = sum(out.dropped_why.values())
    detail = "; ".join(f"{n} {reason}" for reason, n in out.dropped_why.items())
    out.problems.append(Problem("dropped_events", path, f"{total} events left out: {detail}"))


def add_held(out: Outcome, sub: Outcome, path: str) -> None:
    """A rank report's held flow starts, written last, counted into the report's own outcome."""
    out.kept += sub.kept
    out.dropped += sub.dropped
    out.filtered += sub.filtered
    for ph, n in sub.phases.items():
        out.phases[ph] = out.phases.get(ph, 0) + n
    for key, n in sub.stats.items():
        out.stats[key] = out.stats.get(key, 0) + n
    if sub.min_ts is not None and sub.max_ts is not None:
        out.min_ts = sub.min_ts if out.min_ts is None else min(out.min_ts, sub.min_ts)
        out.max_ts = sub.max_ts if out.max_ts is None else max(out.max_ts, sub.max_ts)
    for reason, n in sub.dropped_why.items():  # rare: a flow start with a bad time or pid
        out.dropped_why[reason] = out.dropped_why.get(reason, 0) + n
    if sub.dropped_why:  # one problem line for the whole file
        out.problems = [p for p in out.problems if p.kind != "dropped_events"]
        total = sum(out.dropped_why.values())
        detail = "; ".join(f"{n} {reason}" for reason, n in out.dropped_why.items())
        out.problems.append(Problem("dropped_events", path, f"{total} events left out: {detail}"))


def say_skipped(out: Outcome, path: str) -> None:
    """A file left out whole: its problem line says how many events that cost (one line per file)."""
    lost = f"none of its {out.read} events merged"
    if not out.complete:  # what would have placed it may have been in the lost part (an anchor last)
        lost += " (the file is cut short: what places it may have been after the cut)"
    mine = [p for p in out.problems if p.path == path]
    if mine:
        mine[-1].detail = f"{mine[-1].detail}; {lost}"
    else:
        out.problems.append(Problem("dropped_events", path, f"{lost} (the reader could not place it)"))


def file_failed(result: JobResult, task: Task, exc: Exception) -> None:
    """A file whose content made a stage fail (a case no reader foresaw) costs that file, never the
    merge: it is left out whole and named with what broke. Only while nothing of it was written: a
    failure after its events reached an emitter is the merge's (re-raised)."""
    out = result.outcomes[-1] if result.outcomes and result.outcomes[-1].index == task.index else None
    if out is None:
        out = Outcome(task.index)
        result.outcomes.append(out)
    if out.emitted:
        raise exc
    out.skipped, out.kept = True, 0
    out.dropped = out.read
    what = f"{type(exc).__name__}: {exc}"[:300].replace("\n", " ")
    out.problems.append(
        Problem("not_a_trace", task.source.url, f"left out whole: reading it failed ({what})")
    )
