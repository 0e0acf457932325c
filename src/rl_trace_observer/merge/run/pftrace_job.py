"""A job's events as its own protobuf packet sequence (``.pftrace`` output; interning is per sequence).

Why a module of its own: the worker stays about reading and passes; this is the bridge from the merge's
:class:`.model.Event` structs to :class:`.writers.pftrace.PftraceWriter`'s normalised dicts.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

import msgspec
from msgspec import UNSET

from ..compress import deflate_piece
from ..identity import process_title
from ..model import Event, Rebase
from ..readers.chrome_json import decode_raw_args

if TYPE_CHECKING:
    from ..transform.passes import IdentityMapper
    from .jobs import Job, Outcome

__all__ = ["PftraceSink"]


class PftraceSink:
    """Writes a job's events as its own protobuf sequence (interning is per sequence)."""

    def __init__(self, job: Job) -> None:
        from ..writers.pftrace import PftraceWriter

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
            if starts[0] < self.job.base_ns:  # the writer cannot go below its base: re-plan it
                raise Rebase(starts[0])
        fans = _fanouts(events)
        if fans:
            w.write_many(_with_fanout(_normalised(e), fans.get(id(e))) for e in events)
        else:
            w.write_many(_normalised(e) for e in events)

    def close(self) -> tuple[list[Any], dict[str, Any]]:
        """The job's packets as one piece (deflated for ``.pftrace.gz``: in the worker, in parallel)."""
        stats = self.writer.close()
        data = self.buf.getvalue()
        piece: Any = deflate_piece(data) if self.job.out_format == "pftrace.gz" else data
        return [piece], {
            "slices": stats.slices,
            "instants": stats.instants,
            "counters": stats.counters,
            "dropped": dict(stats.dropped),
        }


def _order(e: Event) -> tuple[Any, ...]:
    """Per thread: by start; a parent (longer) before its child; slices before flows that bind to them."""
    dur: Any = e.dur if e.dur is not UNSET else 0
    return (e.ts, e.ph not in ("X", "B"), -dur)


def _fanouts(events: list[Event]) -> dict[int, tuple[str, int]]:
    """Flows with one start and several ends (CUDA-graph launches): ``id(event)`` → ("flow_fanout", k)
    for the start, ("flow_seq", j) for its j-th end, in the time order the events are written.
    Chains with steps keep one id (a step moves the flow on: it is not a fan)."""
    starts: dict[tuple[Any, Any, Any], list[Any]] = {}  # key -> [start event, ends so far]
    stepped: set[tuple[Any, Any, Any]] = set()
    out: dict[int, tuple[str, int]] = {}
    for e in events:
        ph = e.ph
        if (ph != "s" and ph != "f" and ph != "t") or e.id is UNSET:
            continue
        key = (e.cat, e.name, e.id)
        if ph == "s":
            starts[key] = [e, 0]
        elif ph == "t":
            stepped.add(key)
        else:
            src = starts.get(key)
            if src is not None:
                if src[1]:
                    out[id(e)] = ("flow_seq", src[1])
                src[1] += 1
                if src[1] > 1:
                    out[id(src[0])] = ("flow_fanout", src[1])
    if stepped:
        drop = {id(e) for e in events if (e.cat, e.name, e.id) in stepped}
        out = {k: v for k, v in out.items() if k not in drop}
    return out


def _with_fanout(ev: dict[str, Any], fan: tuple[str, int] | None) -> dict[str, Any]:
    if fan is not None:
        ev[fan[0]] = fan[1]
    return ev


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
