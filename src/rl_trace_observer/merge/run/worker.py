"""One unit of parallel work: read a file (or a TokenSpeed rank's files), run the passes, serialise.

A job runs in a worker process and returns bytes ready for the output (JSON pieces, deflated
pieces, or a protobuf sequence of its own) plus the identities it declared and its counts. At most
one file's events are alive at a time in a worker: they are serialised and released before the
next file of the job is read.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from ..clock.correction import TimeCorrection, stack
from ..clock.pair_apply import clock_problems
from ..clock.pairs import PairAlignment
from ..clock.probe import stage_spans
from ..files import spill
from ..files.sources import read_content
from ..formats import NotATrace, ReadContext, ReadResult, format_for
from ..formats.base.chrome_json import gc_paused
from ..formats.partners import JobLinks, read_partner
from ..timeline.model import Event, Problem, ProcessKey, Rebase
from ..timeline.times import EARLIEST_NS, to_ns
from ..transform import fastpath
from ..transform.flowbind import UNBOUND
from ..transform.outliers import OUTLIERS, SpreadOut
from ..transform.passes import IdentityMapper, PassContext, run_passes
from ..writers import chrome_json
from . import memory
from .jobs import Job, JobResult, Outcome, Task
from .pftrace_job import PftraceSink

if TYPE_CHECKING:
    from ..shards.sink import ShardSink

_in_worker = False  # set in the merge's own worker processes (see init_worker)


def init_worker() -> None:
    """Pool initializer: page reuse between files (see :mod:`.memory`)."""
    global _in_worker
    _in_worker = True
    memory.tune_allocator()


def run_job(job: Job) -> JobResult:
    """Run one job with the garbage collector paused: a job allocates millions of objects that live
    until it ends (events, flow chains), and collections passing over them cost ~10-20 % of the job."""
    with gc_paused():
        return _run_job(job)


def _run_job(job: Job) -> JobResult:
    result = JobResult([], {}, {}, [])
    pf = PftraceSink(job) if job.out_format.startswith("pftrace") else None
    links = JobLinks(job.tasks)
    tasks = links.order(job.tasks)
    held: list[_Held] = []
    sink = _shard_sink(job)
    spilled = 0
    deflated: list[tuple[int, int]] = []  # (crc32, length) of each spilled deflate piece
    for task in tasks:
        fast = not job.windows and job.min_dur_ns <= 0 and task.correction.fn is None
        try:
            _run_task(job, task, links, held, result, pf, sink, fast)
        except SpreadOut:  # times too far apart for the fused loop to judge: the listed passes do
            result.outcomes.pop()
            _run_task(job, task, links, held, result, pf, sink, False)
        spilled += _spill(job, result, spilled, deflated)
    if held:
        for h in held:
            _emit_held(job, h, links, result, pf, sink)
        held.clear()
        spilled += _spill(job, result, spilled, deflated)
    if pf is not None:
        result.pieces, result.writer_stats = pf.close()
        spilled += _spill(job, result, spilled, deflated)
    if spilled:
        assert job.spill_path is not None
        result.pieces = [spill.Spilled(job.spill_path, spilled, tuple(deflated))]
    if sink is not None:
        result.shards = sink.close()
    return result


def _run_task(
    job: Job,
    task: Task,
    links: JobLinks,
    held: list[_Held],
    result: JobResult,
    pf: PftraceSink | None,
    sink: ShardSink | None,
    fast: bool,
) -> None:
    """Read one file, align it on its partner, run the passes (fused when ``fast``) and serialise."""
    out = Outcome(task.index)
    result.outcomes.append(out)
    read = _read(task, out, job.planned, fast)
    if read is None:
        return
    events, mapper, res = read
    correction = task.correction
    url, apply, tol = task.source.url, job.clock_mode != "wall", job.clock_tolerance_ns
    aligned: PairAlignment | None = None
    hold: list[Event] | None = None  # a rank's report: its scope flow starts, written last
    if links.holds(task):
        if fast:
            hold = []  # the fused loop sets them aside as it goes
        else:
            events, hold = links.hold_flows(url, events, res)
    else:
        aligned = links.align(task, events, res, _partner(task), tol, apply)
    if aligned is not None:
        correction, events, fast = _apply_alignment(aligned, task, events, res, out, fast)
    ctx = _context(job, task, correction, mapper, links)
    _emit(job, task, events, res, ctx, out, result, pf, fast, hold if fast else None, sink)
    if hold:
        links.held(url, hold, res)
        held.append(_Held(task, hold, mapper, res, out, fast))
    if ctx.collect_scopes:
        links.collected(ctx.scopes)
    if _in_worker:
        memory.keep_arenas(events)


def _shard_sink(job: Job) -> ShardSink | None:
    """Span rows for ``--shards`` (pyarrow, imported only then)."""
    if job.shards is None:
        return None
    from ..shards.sink import ShardSink

    return ShardSink(job.shards, job.sequence_id)


def _partner(task: Task) -> tuple[str, ReadResult] | None:
    """The file's partner in another job (a Torch trace's RL-Insight log), read here for its pairing
    events; None when it has none or it cannot be read (its own job says why)."""
    partner_kind = format_for(task.kind).partner
    if task.partner is None or partner_kind is None:
        return None
    res = read_partner(task.partner, partner_kind)
    return (task.partner.url, res) if res is not None else None


def _context(
    job: Job, task: Task, correction: TimeCorrection, mapper: IdentityMapper, links: JobLinks
) -> PassContext:
    """The scope ids a file collects or links to (:meth:`..formats.partners.JobLinks.scopes`)."""
    collect, scopes, scope_ids = links.scopes(task)
    return PassContext(
        correction=correction,
        windows=job.windows,
        min_dur_ns=job.min_dur_ns,
        mapper=mapper,
        namespace=task.namespace,
        scope_namespace=job.scope_namespace,
        collect_scopes=collect,
        scopes=scopes,
        scope_ids=scope_ids,
    )


def _emit(
    job: Job,
    task: Task,
    events: list[Event],
    res: ReadResult,
    ctx: PassContext,
    out: Outcome,
    result: JobResult,
    pf: PftraceSink | None,
    fast: bool,
    hold: list[Event] | None = None,
    sink: ShardSink | None = None,
) -> None:
    """Run the passes over a file's events and serialise what they keep; ``out`` gets the counts.

    ``hold`` (fused path only): a rank report's scope flow starts are set aside there, untouched.
    The kept events' times are absolute ns from the listed passes; on the fused path they are already
    the output's: µs (Chrome JSON) or ns (protobuf) relative to ``job.base_ns``."""
    assert ctx.mapper is not None
    mapper = ctx.mapper
    in_order: dict[Any, bool] | None = None
    far: dict[int, int] = {}  # the fused JSON path's events whose µs double misses the ns (fastpath)
    if fast:
        kept, in_order = _fast(events, res, ctx.correction, job, ctx, out, result, hold, pf is not None, far)
    else:
        kept = run_passes(events, ctx)
    unit = 1 if pf is not None else 1000
    if sink is not None:  # span rows of exactly what the writers get (fast: output units from the base)
        sink.add(kept, task, mapper, job.base_ns if fast else None, unit, far)
    fmt = mapper.reader
    if fmt.probe:  # the few spans the clock's causality checks need
        out.spans = stage_spans(kept, fmt.probe_cat, job.base_ns if fast else None, unit, far)
    left_out = ctx.stats.get(UNBOUND, 0) + ctx.stats.get(OUTLIERS, 0)
    out.read, out.dropped = (
        res.read - res.metadata,
        res.dropped + ctx.stats.get("unlinked_scope_flows", 0) + left_out,
    )
    _report_dropped(out, res, task.source.url, ctx.stats)
    out.stats = ctx.stats
    out.filtered = ctx.stats.get("filtered", 0)
    out.kept = len(kept)
    if not fast:  # the fused loop counted them
        out.phases = dict(Counter(map(attrgetter("ph"), kept)))
    result.processes.update(mapper.processes)
    result.threads.update(mapper.threads)
    if pf is not None:  # a rank's report waits for its held flow starts: they bind to its slices
        pf.add(kept, mapper, out, in_order, ctx.fanned, wait=bool(hold))
    elif not fast:
        pieces, lo, hi = chrome_json.encode_pieces(kept, job.base_ns, job.out_format == "json.gz")
        result.pieces.extend(pieces)
        if kept:
            out.min_ts, out.max_ts = lo, hi


def _spill(job: Job, result: JobResult, before: int, deflated: list[tuple[int, int]]) -> int:
    """In a worker process, outputs go to the job's part file instead of the pipe (.spill)."""
    if not (_in_worker and job.spill_path and result.pieces):
        return 0
    size = spill.append(job.spill_path, result.pieces, before == 0, deflated)
    result.pieces.clear()
    return size


def _fast(
    events: list[Event],
    res: ReadResult,
    correction: TimeCorrection,
    job: Job,
    ctx: PassContext,
    out: Outcome,
    result: JobResult,
    hold: list[Event] | None = None,
    protobuf: bool = False,
    far: dict[int, int] | None = None,
) -> tuple[list[Event], dict[Any, bool] | None]:
    """The fused path (:mod:`..transform.fastpath`): one loop does every pass, then Chrome JSON is
    encoded here; for protobuf, times stay ns and the caller hands the events (and which threads are
    in order) to the :class:`.pftrace_job.PftraceSink`."""
    anchor = res.anchor_ns if res.deferred and res.anchor_ns is not None else 0
    shift = anchor + correction.offset_ns - job.base_ns
    assert ctx.mapper is not None
    in_order: dict[Any, bool] | None = {} if protobuf else None
    if protobuf:
        ctx.fanned = set()
    kept, out.phases, lo, hi = fastpath.to_output(
        events,
        res,
        source_ns=not res.deferred,
        shift_ns=shift,
        mapper=ctx.mapper,
        ctx=ctx,
        unit_ns=1 if protobuf else 1000,
        hold=hold,
        in_order=in_order,
        far=None if protobuf else far,
        low_ns=EARLIEST_NS - job.base_ns,
    )
    if lo is not None and hi is not None:
        out.min_ts, out.max_ts = job.base_ns + lo, job.base_ns + hi
        if protobuf and lo < 0:  # the protobuf writer cannot go below its base: re-plan it
            raise Rebase(job.base_ns + lo)
    if not protobuf:
        pieces, _, _ = chrome_json.encode_pieces(
            kept, job.base_ns, job.out_format == "json.gz", convert=False
        )
        result.pieces.extend(pieces)
    return kept, in_order


@dataclass
class _Held:
    """A VizTracer report's ``viztracer->proton`` flow starts, written after its rank's Proton files."""

    task: Task
    events: list[Event]
    mapper: IdentityMapper
    res: ReadResult
    out: Outcome
    fast: bool


def _emit_held(
    job: Job,
    held: _Held,
    links: JobLinks,
    result: JobResult,
    pf: PftraceSink | None,
    sink: ShardSink | None = None,
) -> None:
    """Write a report's held flow starts, linked to the rank's Proton scopes, into its outcome."""
    res = dataclasses.replace(held.res, events=held.events, read=0, metadata=0, dropped=0, problems=[])
    sub = Outcome(held.out.index)
    ctx = _context(job, held.task, held.task.correction, held.mapper, links)
    _emit(job, held.task, held.events, res, ctx, sub, result, pf, held.fast, sink=sink)
    out = held.out
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
    if res.dropped:  # rare: a flow start with a bad time; one problem line for the whole file
        out.problems = [p for p in out.problems if p.kind != "dropped_events"]
        total = held.res.dropped + res.dropped
        out.problems.append(
            Problem("dropped_events", held.task.source.url, f"{total} events with invalid fields or values")
        )


def _apply_alignment(
    aligned: PairAlignment, task: Task, events: list[Event], res: ReadResult, out: Outcome, fast: bool
) -> tuple[TimeCorrection, list[Event], bool]:
    """Record an artifact's alignment on its partner; its correction goes on top of the host's."""
    out.clock = aligned.record
    out.problems.extend(clock_problems(aligned))
    correction = stack(task.correction, aligned.correction)
    if fast and correction.fn is not None:  # a drift line: the fused path only adds a constant
        events, bad = to_ns(events, res.anchor_ns or 0)  # the conversion the fused loop would have done
        res.events, res.deferred, res.dropped = events, False, res.dropped + bad
        return correction, events, False
    return correction, events, fast


def _report_dropped(out: Outcome, res: ReadResult, path: str, stats: dict[str, int] | None = None) -> None:
    """One ``dropped_events`` problem per file: what its reader and the passes left out, and why."""
    if any(p.kind == "dropped_events" for p in out.problems):
        return
    stats = stats or {}
    why = []
    if res.dropped:
        why.append(f"{res.dropped} events with invalid fields or values (a time before 2001 is one)")
    if stats.get(OUTLIERS):  # see ..transform.outliers
        why.append(f"{stats[OUTLIERS]} events timed over 92 days away from the file's others")
    if stats.get(UNBOUND):  # see ..transform.flowbind
        why.append(
            f"{stats[UNBOUND]} flow events no slice of their thread can take (Perfetto drops them too)"
        )
    if why:
        out.problems.append(Problem("dropped_events", path, "; ".join(why)))


def _say_skipped(out: Outcome, path: str) -> None:
    """A file left out whole: its problem line says how many events that cost (one line per file)."""
    lost = f"none of its {out.read} events merged"
    mine = [p for p in out.problems if p.path == path]
    if mine:
        mine[-1].detail = f"{mine[-1].detail}; {lost}"
    else:
        out.problems.append(Problem("dropped_events", path, f"{lost} (the reader could not place it)"))


def _read(
    task: Task, out: Outcome, planned: dict[ProcessKey, int], defer: bool
) -> tuple[list[Event], IdentityMapper, ReadResult] | None:
    content = read_content(task.source)
    out.sha256, out.complete = content.sha256, content.complete
    path = task.source.url
    reader = format_for(task.kind)
    owner_pid = task.owner_key.pid if task.owner_key.pid >= 0 else None
    ctx = ReadContext(path, task.source.name, task.anchor_ns, owner_pid, defer_times=defer)
    content_error = content.error
    try:
        with gc_paused():
            res = reader.read(content.data, ctx)
    except NotATrace as exc:
        out.skipped = True
        detail = f"{content_error}; nothing readable before the cut" if content_error else str(exc)
        out.problems.append(Problem("incomplete" if content_error else "not_a_trace", path, detail))
        return None
    del content
    out.complete = out.complete and res.complete
    out.anchor_ns, out.anchor_source, out.meta = res.anchor_ns, res.anchor_source, res.meta
    salvage = "; ".join(p.detail for p in res.problems if p.kind == "incomplete")
    if content_error:
        out.problems.append(
            Problem("incomplete", path, f"{content_error}; {salvage}" if salvage else content_error)
        )
    out.problems.extend(p for p in res.problems if not (p.kind == "incomplete" and content_error))
    if res.skip:
        out.skipped = True
        out.read = out.dropped = res.read - res.metadata
        _say_skipped(out, path)
        return None
    return (
        res.events,
        IdentityMapper(reader, res, ctx, task.host, task.owner_merged, task.owner_key, planned),
        res,
    )
