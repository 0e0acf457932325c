"""One unit of parallel work: read a file (or a TokenSpeed rank's files), run the passes, serialise.

A job runs in a worker process and returns bytes ready for the output (JSON pieces, deflated
pieces, or a protobuf sequence of its own) plus the identities it declared and its counts. At most
one file's events are alive at a time in a worker: they are serialised and released before the
next file of the job is read.
"""

from __future__ import annotations

import io
from collections import Counter
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import msgspec
from msgspec import UNSET

from . import fastpath, memory, spill
from .clock_probe import SpanSummary, stage_spans
from .identity import ProcessDecl, ThreadDecl, process_title
from .model import Event, Problem, ProcessKey
from .pair_align import align_pairs
from .pair_extract import match_keyed, scan_viztracer_scope_starts
from .pair_pipeline import clock_problems, proton_scope_starts_of, stack
from .passes import IdentityMapper, PassContext, TimeCorrection, run_passes
from .readers import ReadContext, ReadResult, reader_for
from .readers import chrome_json as chrome_reader
from .readers.chrome_json import NotATrace, decode_raw_args, gc_paused
from .sources import Source, read_content
from .writers import chrome_json

SLICE_PHASES = ("X", "B", "i", "I", "b", "n")


@dataclass
class Task:
    """One file of a job, with everything the planner decided about it."""

    index: int
    source: Source
    kind: str
    host: str
    owner_key: ProcessKey
    owner_merged: int
    anchor_ns: int | None
    namespace: int
    correction: TimeCorrection


@dataclass
class Job:
    tasks: list[Task]
    base_ns: int
    out_format: str  # "json", "json.gz" or "pftrace"
    planned: dict[ProcessKey, int]
    titles: dict[int, str]  # merged pid -> process name, for writers that name processes themselves
    windows: tuple[tuple[int | None, int | None], ...] = ()
    min_dur_ns: int = 0
    scope_namespace: int = 0
    sequence_id: int = 1
    weight: int = 0
    spill_path: str | None = None  # where a worker process leaves big outputs (see .spill)
    clock_mode: str = "auto"  # the user's --clock: "wall" keeps raw placement (pairs are only reported)
    clock_tolerance_ns: int = 1_000_000


@dataclass
class Outcome:
    index: int
    sha256: str | None = None
    complete: bool = True
    read: int = 0
    kept: int = 0
    dropped: int = 0
    filtered: int = 0
    anchor_ns: int | None = None
    anchor_source: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)
    phases: dict[str, int] = field(default_factory=dict)
    min_ts: int | None = None
    max_ts: int | None = None
    skipped: bool = False
    spans: list[SpanSummary] = field(default_factory=list)  # for the clock causality checks
    clock: dict[str, Any] | None = None  # per-artifact alignment record (manifest timeline.clock.artifacts)


@dataclass
class JobResult:
    outcomes: list[Outcome]
    processes: dict[int, ProcessDecl]
    threads: dict[tuple[int, int], ThreadDecl]
    pieces: list[Any]
    writer_stats: dict[str, Any] = field(default_factory=dict)


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
    scopes: set[int] | None = None
    pairs = {t.kind for t in job.tasks} >= {"proton", "viztracer"}  # a TokenSpeed rank's two reports
    pf = _PftraceSink(job) if job.out_format == "pftrace" else None
    spilled = 0
    deflated: list[tuple[int, int]] = []  # (crc32, length) of each spilled deflate piece
    partner = _scope_partner(job.tasks) if pairs else None
    for task in job.tasks:
        out = Outcome(task.index)
        result.outcomes.append(out)
        fast = pf is None and not job.windows and job.min_dur_ns <= 0 and task.correction.fn is None
        read = _read(task, out, job.planned, fast)
        if read is None:
            continue
        events, mapper, res = read
        correction = task.correction
        if partner is not None and task.kind == "proton":
            correction, events, fast = _align_proton(task, events, res, partner, job, out, fast)
        ctx = PassContext(
            correction=correction,
            windows=job.windows,
            min_dur_ns=job.min_dur_ns,
            mapper=mapper,
            namespace=task.namespace,
            scope_namespace=job.scope_namespace,
            collect_scopes=pairs and task.kind == "proton",
            scopes=scopes
            if task.kind == "proton"
            else (scopes or set())
            if task.kind == "viztracer"
            else None,
        )
        kept = _fast(events, res, correction, job, ctx, out, result) if fast else run_passes(events, ctx)
        out.spans = stage_spans(kept, task.kind, job.base_ns if fast else None)  # clock checks
        if ctx.collect_scopes:
            scopes = ctx.scopes
        out.read, out.dropped = (
            res.read - res.metadata,
            res.dropped + ctx.stats.get("unlinked_scope_flows", 0),
        )
        _report_dropped(out, res, task.source.url)
        out.stats = ctx.stats
        out.filtered = ctx.stats.get("filtered", 0)
        out.kept = len(kept)
        if not fast:  # the fused loop counted them
            out.phases = dict(Counter(map(attrgetter("ph"), kept)))
        result.processes.update(mapper.processes)
        result.threads.update(mapper.threads)
        if pf is not None:
            pf.add(kept, mapper, out)
        elif not fast:
            pieces, lo, hi = chrome_json.encode_pieces(kept, job.base_ns, job.out_format == "json.gz")
            result.pieces.extend(pieces)
            if kept:
                out.min_ts, out.max_ts = lo, hi
        if _in_worker:
            memory.keep_arenas(events)
        del kept, events, res
        spilled += _spill(job, result, spilled, deflated)
    if pf is not None:
        result.pieces, result.writer_stats = pf.close()
        spilled += _spill(job, result, spilled, deflated)
    if spilled:
        assert job.spill_path is not None
        result.pieces = [spill.Spilled(job.spill_path, spilled, tuple(deflated))]
    return result


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
) -> list[Event]:
    """The fused path (see :mod:`.fastpath`): one loop does every pass, then the events are encoded."""
    anchor = res.anchor_ns if res.deferred and res.anchor_ns is not None else 0
    shift = anchor + correction.offset_ns - job.base_ns
    assert ctx.mapper is not None
    kept, out.phases, lo, hi = fastpath.to_output(
        events, res, source_ns=not res.deferred, shift_ns=shift, mapper=ctx.mapper, ctx=ctx
    )
    pieces, _, _ = chrome_json.encode_pieces(kept, job.base_ns, job.out_format == "json.gz", convert=False)
    result.pieces.extend(pieces)
    if lo is not None and hi is not None:
        out.min_ts, out.max_ts = job.base_ns + lo, job.base_ns + hi
    return kept


def _scope_partner(tasks: list[Task]) -> tuple[str, dict[int, list[int]]] | None:
    """The rank's VizTracer flow starts by scope_id, raw ns as its reader will place them (issue 8)."""
    viz = next((t for t in tasks if t.kind == "viztracer"), None)
    if viz is None:
        return None
    try:
        scan = scan_viztracer_scope_starts(read_content(viz.source).data)
        return viz.source.url, scan.absolute(viz.anchor_ns)
    except ValueError:  # unreadable or unanchored: its own read reports why; Proton keeps the host clock
        return None


def _align_proton(
    task: Task,
    events: list[Event],
    res: ReadResult,
    partner: tuple[str, dict[int, list[int]]],
    job: Job,
    out: Outcome,
    fast: bool,
) -> tuple[TimeCorrection, list[Event], bool]:
    """Align a Proton file on its VizTracer partner; its correction goes on top of the host's."""
    viz_url, viz_starts = partner
    starts = proton_scope_starts_of(events, res.anchor_ns or 0, deferred=res.deferred)
    al = align_pairs(
        match_keyed(viz_starts, starts),
        artifact=task.source.url,
        partner=viz_url,
        pairing="scope_id",
        tolerance_ns=job.clock_tolerance_ns,
        apply=job.clock_mode != "wall",
    )
    out.clock = al.record
    out.problems.extend(clock_problems(al))
    correction = stack(task.correction, al.correction)
    if fast and correction.fn is not None:  # a drift line: the fused path only adds a constant
        res.events, res.deferred = chrome_reader.normalise(events, res.anchor_ns or 0, res), False
        return correction, res.events, False
    return correction, events, fast


def _report_dropped(out: Outcome, res: ReadResult, path: str) -> None:
    if res.dropped and not any(p.kind == "dropped_events" for p in out.problems):
        out.problems.append(
            Problem("dropped_events", path, f"{res.dropped} events with invalid fields or values")
        )


def _read(
    task: Task, out: Outcome, planned: dict[ProcessKey, int], defer: bool
) -> tuple[list[Event], IdentityMapper, ReadResult] | None:
    content = read_content(task.source)
    out.sha256, out.complete = content.sha256, content.complete
    path = task.source.url
    reader = reader_for(task.kind)
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
        return None
    return (
        res.events,
        IdentityMapper(reader, res, ctx, task.host, task.owner_merged, task.owner_key, planned),
        res,
    )


class _PftraceSink:
    """Writes a job's events as its own protobuf sequence (interning is per sequence)."""

    def __init__(self, job: Job) -> None:
        from .writers.pftrace import PftraceWriter

        self.job = job
        self.buf = io.BytesIO()
        self.writer = PftraceWriter(self.buf, base_ns=job.base_ns, sequence_id=job.sequence_id)
        self.declared: set[int] = set()

    def add(self, events: list[Event], mapper: IdentityMapper, out: Outcome) -> None:
        w = self.writer
        for pid, decl in sorted(mapper.processes.items()):
            if pid not in self.declared:
                self.declared.add(pid)
                w.process(pid, process_title(decl, self.job.titles), pid)
        for (pid, tid), th in sorted(mapper.threads.items()):
            w.thread(pid, tid, th.name, th.sort_index)
        events.sort(key=_order)
        if events:
            starts: list[Any] = [e.ts for e in events]
            out.min_ts, out.max_ts = starts[0], max(starts)
        w.write_many(_normalised(e) for e in events)

    def close(self) -> tuple[list[Any], dict[str, Any]]:
        stats = self.writer.close()
        return [self.buf.getvalue()], {
            "slices": stats.slices,
            "instants": stats.instants,
            "counters": stats.counters,
            "dropped": dict(stats.dropped),
        }


def _order(e: Event) -> tuple[Any, ...]:
    """Per thread: by start; a parent (longer) before its child; slices before flows that bind to them."""
    dur: Any = e.dur if e.dur is not UNSET else 0
    return (e.ts, e.ph not in ("X", "B"), -dur)


def _normalised(e: Event) -> dict[str, Any]:
    """docs/FORMATS.md §3: the event as a dict with exact ``ts_ns``/``dur_ns``.

    ``args`` stay the source's JSON text (compacted when pretty-printed) for the writer to embed as is:
    decoding them only to encode them again was a fifth of the ``.pftrace`` path's time. Counters (the writer
    reads their values) and text with ``\\u`` escapes (lone surrogates need the writer's care) are
    decoded as before; non-object args mean no args, as :func:`..readers.chrome_json.decode_raw_args` says.
    """
    unset = UNSET
    ev: dict[str, Any] = {"ph": e.ph, "ts_ns": e.ts, "pid": e.pid, "tid": e.tid}
    if e.dur is not unset:
        ev["dur_ns"] = e.dur
    if e.name is not unset:
        ev["name"] = e.name
    if e.cat is not unset:
        ev["cat"] = e.cat
    if e.id is not unset:
        ev["id"] = e.id
    if e.bind_id is not unset:
        ev["bind_id"] = e.bind_id
        if e.flow_in is not unset:
            ev["flow_in"] = e.flow_in
        if e.flow_out is not unset:
            ev["flow_out"] = e.flow_out
    if e.bp is not unset:
        ev["bp"] = e.bp
    if e.s is not unset:
        ev["s"] = e.s
    if e.scope is not unset:
        ev["scope"] = e.scope
    if e.cname is not unset:
        ev["cname"] = e.cname
    if e.args is not unset:
        ev["args"] = _args_json(e)
    if e.id2 is not unset:
        ev["id2"] = bytes(e.id2).decode()
    return ev


def _args_json(e: Event) -> Any:
    """An event's args for the writer: compact JSON text of a non-empty object, else a dict."""
    raw = bytes(e.args)  # type: ignore[arg-type]
    if e.ph == "C" or b"\\u" in raw:
        return decode_raw_args(e)
    if b"\n" in raw:
        raw = msgspec.json.format(raw, indent=-1)
    return raw if raw[:1] == b"{" and raw != b"{}" else {}
