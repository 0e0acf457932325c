"""Stage 3: the passes over a file's events — the fused fast path, or the listed passes.

The fused loop (:mod:`..transform.fastpath`) does every pass in one loop and leaves the times in the
output's units, relative to the job's base (µs for Chrome JSON, ns for protobuf); the listed passes
(:func:`..transform.passes.run_passes`) leave absolute ns. Which one ran is ``FileJob.fast``.
The fused loop runs compiled where its twin is built from the source beside it
(``transform/_fastpath_native.pyx``: the same loop on C doubles and an event's slots, which hands a file
it cannot take exactly to the Python; ``RL_TRACE_NATIVE=0`` runs the Python).
"""

from __future__ import annotations

from typing import Any

from ...common import twins
from ..timeline.model import Rebase
from ..timeline.times import EARLIEST_NS
from ..transform import fastpath
from ..transform.passes import PassContext, run_passes
from .file import FileJob, JobRun

FASTPATH_TWIN = "rl_trace_observer.merge.transform._fastpath_native"


def fused_loop() -> Any:
    """``to_output`` of the compiled twin of :mod:`..transform.fastpath`, else of the module itself."""
    return (twins.twin(FASTPATH_TWIN) or fastpath).to_output


def context(f: FileJob, run: JobRun) -> PassContext:
    """What the passes need to know about the file (its scope ids: ``JobLinks.scopes``)."""
    job = run.job
    assert f.correction is not None
    collect, scopes, scope_ids = run.links.scopes(f.task)
    return PassContext(
        correction=f.correction,
        windows=job.windows,
        min_dur_ns=job.min_dur_ns,
        mapper=f.mapper,
        namespace=f.task.namespace,
        scope_namespace=job.scope_namespace,
        collect_scopes=collect,
        scopes=scopes,
        scope_ids=scope_ids,
    )


def transform(f: FileJob, run: JobRun) -> None:
    """Fill ``f.ctx`` and ``f.kept`` (and, on the fused path, ``f.in_order``, ``f.far``, the
    phases and the file's time range)."""
    f.ctx = ctx = context(f, run)
    f.unit_ns = 1 if run.protobuf else 1000
    if not f.fast:
        f.kept = run_passes(f.events, ctx)
        return
    job, res, out = run.job, f.res, f.out
    assert res is not None and f.correction is not None and ctx.mapper is not None
    anchor = res.anchor_ns if res.deferred and res.anchor_ns is not None else 0
    protobuf = run.protobuf
    f.in_order = {} if protobuf else None
    if protobuf:
        ctx.fanned = set()
    f.kept, out.phases, lo, hi = fused_loop()(
        f.events,
        res,
        source_ns=not res.deferred,
        shift_ns=anchor + f.correction.offset_ns - job.base_ns,
        mapper=ctx.mapper,
        ctx=ctx,
        unit_ns=f.unit_ns,
        hold=f.hold,
        in_order=f.in_order,
        far=None if protobuf else f.far,
        low_ns=EARLIEST_NS - job.base_ns,
    )
    if lo is not None and hi is not None:
        out.min_ts, out.max_ts = job.base_ns + lo, job.base_ns + hi
        if protobuf and lo < 0:  # the protobuf writer cannot go below its base: re-plan it
            raise Rebase(job.base_ns + lo)
