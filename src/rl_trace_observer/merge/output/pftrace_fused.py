"""The ``.pftrace`` encoder fused with the merge: packets straight from the merge's
:class:`..timeline.model.Event` structs, one thread at a time, with the semantics of
:class:`.pftrace.PftraceWriter` (which it extends).

Why: the dict writer pays ~30 Python calls per slice (a dict per event, a method per packet, a varint
call per number); the merge already holds interned names, merged ids and exact times in its structs.
Here a thread's slices and flows are written in one loop, packets are assembled inline from per-thread
constants (an END without flows is a constant but for its timestamp), and args are compacted for a whole
batch in two C calls. Rare events (``B``/``E``, instants, counters, async slices) go through the dict
writer unchanged.

Order: Perfetto sorts packets by timestamp and keeps file order for equal ones, so threads can be
written one after another. Per thread the order is the merge's: slices by start, the longer first, and
at equal times slices before flows (a flow binds to the slice that is open at its time). Events in ns
relative to the writer's base (``base_ns`` 0 here): floats with integral values from the fused fast path
(:func:`..transform.fastpath.to_output` with ``unit_ns=1``) or ints.
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import attrgetter
from typing import Any

import msgspec
from msgspec import UNSET

from ...common import twins
from ..formats.base.chrome_json import decode_raw_args
from ..timeline.model import BAD_JSON, Event
from ._pbwire import _CONT, SMALL_VARINTS, pack_fixed64, varint
from ._pftrace_sink import BEGIN, END, INSTANT, K_FLOW, K_TERMINATING, OpenSlice
from .pftrace import PftraceWriter

__all__ = ["FusedWriter", "Lanes", "event_dict"]

_TS = attrgetter("ts")
_DUR = attrgetter("dur")
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_K_PACKET, _K_TIMESTAMP, _K_TRACK_EVENT = b"\x0a", b"\x40", b"\x5a"
_K_ANNOTATION, _DA_LEGACY_JSON = b"\x22", b"\x4a"
_HOT = frozenset("Xstf")  # what a thread's loop writes itself; anything else takes the dict writer
_OFF_THREAD = frozenset("Cben")  # counters and async slices: tracks of their own

NATIVE_TWIN = "rl_trace_observer.merge.output._pftrace_native"  # _write_thread in C, byte for byte
Lanes = dict[tuple[Any, Any], list[list[Event]]]  # (pid, tid) -> [slices, other events]


class FusedWriter(PftraceWriter):
    """:class:`.pftrace.PftraceWriter` plus :meth:`write_events` for the merge's structs.

    Where ``_pftrace_native`` is built (and ``RL_TRACE_NATIVE`` allows), its compiled twins of
    :func:`split_lanes`, :func:`order_thread`, :meth:`_write_thread` (which compacts each slice's args
    as :func:`compact_args` would, where it reaches the slice: one walk of the events fewer) and the
    counter path write the same bytes; chosen once per writer."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        twin = self._twin = twins.twin(NATIVE_TWIN)  # the compiled loops, or None
        self._split_lanes = split_lanes if twin is None else twin.split_lanes
        self._order_thread = order_thread if twin is None else twin.order_thread
        if twin is not None:
            self._slice_type = twin.Slice

    def write_events(
        self,
        events: list[Event],
        in_order: dict[tuple[Any, Any], bool] | None = None,
        fanned: set[Any] | None = None,
    ) -> None:
        """Write one artifact's kept events (ns relative to the base, merged pids/tids and flow ids).

        ``in_order``: threads whose slices are already in start order, the longer first (the fast
        path certified them), so they need no sort; None: sort every thread. ``fanned``: ids of flows
        that may have several ends (:func:`fan_ends` gives each end its own link id); None: look.
        """
        if self._closed:
            raise ValueError("pftrace: write_events() after close()")
        twin = self._twin
        lanes, off_thread, cold = self._split_lanes(events)
        # flows paired in the file's order (thread after thread), the order Perfetto reads their ids in
        fan = fan_ends((e for _, rest in lanes.values() for e in rest), fanned)
        ordered = in_order or {}
        for key, (slices, rest) in lanes.items():
            if fan or key in cold:  # the merge's order, then the dict writer
                seq = slices + rest
                seq.sort(key=_order)
                self._write_generic(seq, fan)
                continue
            seq = self._order_thread(slices, rest, ordered.get(key, False))
            if twin is not None:
                twin.write_thread(self, key, seq, event_dict, decode_raw_args, _compact)
            else:
                compact_args(slices)
                self._write_thread(key, seq)
        if off_thread:
            off_thread.sort(key=_order)
            if twin is not None and not fan and all(e.ph == "C" for e in off_thread):
                twin.write_counters(self, off_thread, decode_raw_args)
            else:
                self._write_generic(off_thread, fan)
        if len(self._buf) >= self._buffer_bytes:
            self.flush()

    def _write_generic(self, events: list[Event], fan: dict[int, tuple[str, int]]) -> None:
        write = self.write
        for e in events:
            ev = event_dict(e)
            if fan:
                f = fan.get(id(e))
                if f is not None:
                    ev[f[0]] = f[1]
            write(ev)

    def _event(self, ts_ns: Any, body: bytes) -> None:
        super()._event(int(ts_ns), body)

    def flush(self) -> None:
        """Hand buffered bytes to the file object, keeping the buffer object (loops hold it)."""
        if self._buf:
            self._out.write(self._buf)
            self.stats.bytes += len(self._buf)
            self._buf.clear()

    def _write_thread(self, key: tuple[Any, Any], seq: list[Event]) -> None:
        """A thread's slices and v1 flows, in order: :meth:`_begin` / :meth:`_settle` / :meth:`_pop` /
        :meth:`_flow_v1` of the dict writer, inlined for ``X`` and ``s``/``t``/``f``, and the packets
        assembled from per-thread constants (a BEGIN or END is one ``+=`` of a few pieces)."""
        pid, tid = key
        th = self._threads.get((pid, tid)) or self._thread(pid, tid)
        stack, track, stats = th.stack, th.track, self.stats
        names, cats, arg_names = self._names, self._cats, self._arg_names
        unset, small, cont, slow = UNSET, SMALL_VARINTS, _CONT, varint
        kp, kts, kte = _K_PACKET, _K_TIMESTAMP, _K_TRACK_EVENT
        k_flow, k_term, pack = K_FLOW, K_TERMINATING, pack_fixed64
        new_interned = self._new_interned  # strings interned since the last packet (the list is kept)
        seq_needs = self._seq_needs
        end_body = END + track
        end_tail = seq_needs + kte + small[len(end_body)] + end_body
        end_heads = [kp + small[1 + n + len(end_tail)] + kts for n in range(11)]
        begin_head = BEGIN + track
        begin_fixed = 1 + len(seq_needs) + 1  # timestamp tag, sequence fields, track_event tag
        salts = self._flow_salts
        buf = self._buf
        stats.events += len(seq)
        slices = 0
        for e in seq:
            ph = e.ph
            ts: Any = e.ts
            if ph == "X":
                d: Any = e.dur
                end = ts + d if d > 0 else ts
                if stack:
                    top = stack[-1]
                    if ts < top.start_ns or (
                        ts == top.start_ns <= top.end_ns < end and top.body is not None and not top.is_b
                    ):  # not in the merge's order: the dict writer knows what to do
                        self._begin(event_dict(e), ts, end, False)
                        continue
                    while stack:  # _settle: end what is over (a zero-length slice holds its ns)
                        top = stack[-1]
                        te = top.end_ns
                        if not (te < ts or top.start_ns < te == ts):
                            break
                        stack.pop()
                        slices += 1
                        body = top.body
                        if new_interned or not self._cleared or top.end_flows:
                            if body is not None:
                                self._write_begin(top)
                            self._event(te, END + track + top.end_flows)
                            continue
                        if body is not None:  # a leaf: its BEGIN, held back until now, then its END
                            body = begin_head + body + top.flows
                            t = int(top.start_ns)
                            tv = (
                                cont[t & 0x3FFF] + cont[(t >> 14) & 0x3FFF] + small[t >> 28]
                                if (0x10000000 <= t < 0x40000000000)
                                else slow(t)
                            )
                            n = len(body)
                            nv = small[n] if n < 0x4000 else slow(n)
                            n += begin_fixed + len(tv) + len(nv)
                            buf += (
                                kp + (small[n] if n < 0x4000 else slow(n)) + kts + tv + seq_needs + kte + nv
                            )
                            buf += body
                        t = int(te)
                        tv = (
                            cont[t & 0x3FFF] + cont[(t >> 14) & 0x3FFF] + small[t >> 28]
                            if (0x10000000 <= t < 0x40000000000)
                            else slow(t)
                        )
                        buf += end_heads[len(tv)]
                        buf += tv
                        buf += end_tail
                    if stack:
                        top = stack[-1]
                        body = top.body
                        if body is not None:  # a parent: its BEGIN goes before its first child's
                            if new_interned or not self._cleared:
                                self._write_begin(top)
                            else:
                                top.body = None
                                body = begin_head + body + top.flows
                                t = int(top.start_ns)
                                tv = (
                                    cont[t & 0x3FFF] + cont[(t >> 14) & 0x3FFF] + small[t >> 28]
                                    if (0x10000000 <= t < 0x40000000000)
                                    else slow(t)
                                )
                                n = len(body)
                                nv = small[n] if n < 0x4000 else slow(n)
                                n += begin_fixed + len(tv) + len(nv)
                                buf += (
                                    kp
                                    + (small[n] if n < 0x4000 else slow(n))
                                    + kts
                                    + tv
                                    + seq_needs
                                    + kte
                                    + nv
                                )
                                buf += body
                        if end > top.end_ns and not top.is_b:
                            stats.drop("overlapping_slice")  # the JSON importer drops these too
                            continue
                name = e.name
                if name is unset:
                    name = ""
                ref = names.get(name) or self._intern_name(name)
                cat = e.cat
                if cat is not unset and cat:
                    ref += cats.get(cat) or self._intern_cat(cat)
                a: Any = e.args
                if a is not unset:
                    if a.__class__ is bytes:  # compacted by compact_args: a non-empty object
                        aref = arg_names.get("args") or self._intern(arg_names, "args", 3, 1)
                        n = len(a)
                        ann = aref + _DA_LEGACY_JSON + (small[n] if n < 0x4000 else slow(n)) + a
                        n = len(ann)
                        ref += _K_ANNOTATION + (small[n] if n < 0x4000 else slow(n)) + ann
                    else:
                        args = decode_raw_args(e)  # \u escapes: lone surrogates need the writer's care
                        if args:
                            ref += self._annotations(args)
                entry = OpenSlice(track, ts, end, ref, False)
                if th.waiting:
                    entry.flows = b"".join(k_term + pack(f) for f in th.waiting)
                    th.waiting.clear()
                if e.bind_id is not unset:
                    entry.flows += self._v2_flows(event_dict(e))
                stack.append(entry)
                continue
            # a v1 flow event: _flow_v1, inlined (no fan-out here: such threads take the dict writer)
            ident: Any = e.id
            cat = e.cat if e.cat is not unset else ""
            name = e.name if e.name is not unset else ""
            salt = salts.get((cat, name))
            if salt is None or ident.__class__ is not int or not 0 <= ident < 1 << 63:
                fid = self._flow_id(cat or "", name or "", None if ident is unset else ident)
            else:
                fid = ((ident * 0x9E3779B97F4A7C15) ^ salt) & 0x7FFFFFFFFFFFFFFF or 1
            stats.flow_endpoints += 1
            if ph == "f" and e.bp != "e":
                th.waiting.append(fid)  # binds to the next slice that begins on this thread
                continue
            enc = (k_term if ph == "f" else k_flow) + pack(fid)
            last = stack[-1] if stack else None
            if last is not None and last.start_ns <= ts:
                if ph == "f" and (last.body is None or last.start_ns < ts):
                    last.end_flows += enc
                    continue
                if last.body is not None:
                    last.flows += enc
                    continue
            elif ph == "f":
                stats.drop("flow_no_enclosing_slice")
                continue
            self._settle(th, ts)
            self._event(ts, INSTANT + track + self._common(event_dict(e)) + enc)
            stats.flow_instants += 1
        stats.slices += slices

    def _intern_name(self, name: str) -> bytes:
        self._maybe_reset()
        return self._intern(self._names, str(name), 2, 10)

    def _intern_cat(self, cat: str) -> bytes:
        self._maybe_reset()
        return self._intern(self._cats, str(cat), 1, 3)

    def _maybe_reset(self) -> None:
        if self._interned >= self._intern_limit:
            self._reset_interning()


def order_thread(slices: list[Event], rest: list[Event], in_order: bool) -> list[Event]:
    """A thread's slices and flow events in the order its loop writes them: slices by start, the
    longer first (``slices`` sorted in place, unless ``in_order`` says they are), merged with the
    flow events by start, slices first at equal times."""
    if not in_order:
        slices.sort(key=_DUR, reverse=True)  # two stable sorts: by start, the longer first
        slices.sort(key=_TS)
    if not rest:
        return slices
    rest.sort(key=_TS)
    seq = slices + rest
    seq.sort(key=_TS)  # a merge of two runs: slices first at equal times
    return seq


def _order(e: Event) -> tuple[Any, ...]:
    """The merge's order on a thread: by start; a parent (longer) before its child; slices before the
    flows that bind to them."""
    dur: Any = e.dur if e.dur is not UNSET else 0
    return (e.ts, e.ph not in ("X", "B"), -dur)


def split_lanes(events: list[Event]) -> tuple[Lanes, list[Event], set[tuple[Any, Any]]]:
    """Events per thread (slices apart from the rest, each in the given order), those on tracks of
    their own (counters, async slices, process and global instants), and the threads whose other
    events are not all v1 flows (their loop is the dict writer's)."""
    lanes: Lanes = {}
    off: list[Event] = []
    cold: set[tuple[Any, Any]] = set()
    off_thread, hot, unset = _OFF_THREAD, _HOT, UNSET
    last_pid: Any = unset
    last_tid: Any = unset
    slices: list[Event] = []
    rest: list[Event] = []
    for e in events:
        ph = e.ph
        if ph in off_thread or ((ph == "i" or ph == "I") and (e.s == "g" or e.s == "p")):
            off.append(e)
            continue
        pid, tid = e.pid, e.tid
        if tid != last_tid or pid != last_pid:
            lane = lanes.get((pid, tid))
            if lane is None:
                lane = lanes[(pid, tid)] = [[], []]
            slices, rest = lane
            last_pid, last_tid = pid, tid
        if ph == "X":
            if e.dur is unset:
                e.dur = 0
            slices.append(e)
        else:
            rest.append(e)
            if ph not in hot:
                cold.add((pid, tid))
    return lanes, off, cold


def fan_ends(events: Iterable[Event], fanned: set[Any] | None) -> dict[int, tuple[str, int]]:
    """Flows with one start and several ends (CUDA-graph launches): ``id(event)`` → ("flow_fanout", k)
    for the start, ("flow_seq", j) for its j-th end, in time order. Chains with steps keep one id (a
    step moves the flow on: it is not a fan). ``fanned``: the only ids that can fan (None: any).

    Give ``events`` in the order they are written (at equal times the pairing follows it): an end
    paired with a start the file holds after it would carry an id Perfetto has already closed."""
    if fanned is not None and not fanned:
        return {}
    flows = [
        e
        for e in events
        if (e.ph == "s" or e.ph == "f" or e.ph == "t")
        and e.id is not UNSET
        and (fanned is None or e.id in fanned)
    ]
    if not flows:
        return {}
    flows.sort(key=_TS)
    starts: dict[tuple[Any, Any, Any], list[Any]] = {}  # key -> [start event, ends so far]
    stepped: set[tuple[Any, Any, Any]] = set()
    out: dict[int, tuple[str, int]] = {}
    for e in flows:
        key = (e.cat, e.name, e.id)
        if e.ph == "s":
            starts[key] = [e, 0]
        elif e.ph == "t":
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
        drop = {id(e) for e in flows if (e.cat, e.name, e.id) in stepped}
        out = {k: v for k, v in out.items() if k not in drop}
    return out


def compact_args(slices: list[Event]) -> None:
    """Each slice's args as what the writer embeds: compact JSON ``bytes`` of a non-empty object (no
    whitespace: pretty-printed Kineto args are a third of their size), in two C calls for the batch.
    Args that are no object, empty, or hold ``\\u`` escapes stay as they were (the slow path).

    Only texts with a line break are compacted (as :func:`_args_json` does), so the bytes do not depend
    on what else is in the batch; a lone surrogate's escape, which msgspec cannot read, leaves its
    text as it is."""
    unset = UNSET
    with_args = [e for e in slices if e.args is not unset and e.args.__class__ is not bytes]
    if not with_args:
        return
    raws: list[Any] = [e.args for e in with_args]
    joined = b"[" + b",".join(raws) + b"]"
    escapes = b"\\u" in joined
    compact = raws
    if b"\n" in joined:
        try:
            compact = _RAW_LIST.decode(msgspec.json.format(joined, indent=-1))
        except BAD_JSON:  # a lone surrogate: msgspec reads none of the batch
            compact = [_compact(bytes(r)) for r in raws]
    for e, raw, small in zip(with_args, raws, compact, strict=True):
        text = bytes(raw)
        if small is not raw and b"\n" in text:
            text = bytes(small)
        if text[:1] == b"{" and text != b"{}" and not (escapes and b"\\u" in text):
            e.args = text  # type: ignore[assignment]
        elif text[:1] == b"{" and text != b"{}":
            e.args = msgspec.Raw(text)
        else:
            e.args = UNSET


def _compact(text: bytes) -> bytes:
    try:
        return msgspec.json.format(text, indent=-1)
    except BAD_JSON:
        return text


# the struct fields event_dict copies as they are, in output order (flow_in/out only with a bind_id)
_COPIED = ("name", "cat", "id", "bind_id", "flow_in", "flow_out", "bp", "s", "scope", "cname")
_COPIED_UNBOUND = tuple(f for f in _COPIED if f not in ("bind_id", "flow_in", "flow_out"))


def event_dict(e: Event) -> dict[str, Any]:
    """docs/FORMATS.md §3: the struct as the dict writer's normalised event (ns relative to the base).

    ``args`` stay the source's JSON text (compacted when pretty-printed) for the writer to embed as is;
    counters (the writer reads their values) and text with ``\\u`` escapes (lone surrogates need the
    writer's care) are decoded; non-object args mean no args."""
    unset = UNSET
    ts: Any = e.ts
    ev: dict[str, Any] = {"ph": e.ph, "ts_ns": int(ts), "pid": e.pid, "tid": e.tid}
    if e.dur is not unset:
        d: Any = e.dur
        ev["dur_ns"] = int(d)
    fields = _COPIED if e.bind_id is not unset else _COPIED_UNBOUND
    for field in fields:
        value = getattr(e, field)
        if value is not unset:
            ev[field] = value
    if e.args is not unset:
        ev["args"] = _args_json(e)
    if e.id2 is not unset:
        ev["id2"] = bytes(e.id2).decode()
    return ev


def _args_json(e: Event) -> Any:
    """An event's args for the dict writer: compact JSON text of a non-empty object, else a dict."""
    a: Any = e.args
    raw = a if a.__class__ is bytes else bytes(a)
    if e.ph == "C" or b"\\u" in raw:
        return decode_raw_args(e)
    if b"\n" in raw:
        raw = msgspec.json.format(raw, indent=-1)
    return raw if raw[:1] == b"{" and raw != b"{}" else {}
