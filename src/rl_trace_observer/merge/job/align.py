"""Stage 2: a file placed on its partner's clock, or its flow starts held for its rank's scopes."""

from __future__ import annotations

from ..clock.correction import stack
from ..clock.pair_apply import clock_problems
from ..timeline.times import to_ns
from .file import FileJob, JobRun
from .read import partner


def align(f: FileJob, run: JobRun) -> None:
    """Set ``f.correction`` (the host's, with the file's own alignment on top) and ``f.hold``.

    A rank's VizTracer report holds its ``viztracer->proton`` flow starts until the rank's Proton
    files are written (the fused loop sets them aside as it goes; the listed path takes them out
    here). Any other file with a partner is aligned on it; a drift line leaves the fused path, which
    only adds a constant."""
    task, res, job = f.task, f.res, run.job
    assert res is not None
    f.correction = task.correction
    if run.links.holds(task):
        if f.fast:
            f.hold = []
        else:
            f.events, f.hold = run.links.hold_flows(f.url, f.events, res)
        return
    aligned = run.links.align(
        task, f.events, res, partner(task), job.clock_tolerance_ns, job.clock_mode != "wall"
    )
    if aligned is None:
        return
    f.out.clock = aligned.record
    f.out.problems.extend(clock_problems(aligned))
    f.correction = stack(task.correction, aligned.correction)
    if f.fast and f.correction.fn is not None:
        events, bad = to_ns(f.events, res.anchor_ns or 0)  # the conversion the fused loop would do
        res.events, res.deferred, res.dropped = events, False, res.dropped + bad
        f.events, f.fast = events, False
