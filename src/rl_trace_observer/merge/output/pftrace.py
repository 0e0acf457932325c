"""Streaming native Perfetto protobuf writer (TrackEvent), hand-encoded: no protobuf dependency.

Why protobuf: int64 ns timestamps survive exactly (JSON carries float µs), names, categories and
argument keys are interned once per sequence, and files are several times smaller than JSON.

Input is the normalised merge event of docs/FORMATS.md §3 plus explicit :meth:`process` / :meth:`thread`
calls. Every timestamp is written as ``ts_ns - base_ns`` on the default trace clock: no
``timestamp_clock_id`` (REALTIME packets without a ClockSnapshot are all dropped by Perfetto), so the
JSON writer using the same ``base_ns`` shows identical times.

How Chrome semantics map onto TrackEvent (checked in the Perfetto v52 engine):
- ``X`` becomes a BEGIN/END pair on the thread track. Perfetto sorts packets by timestamp and keeps file
  order for equal timestamps, so a per-thread stack writes ENDs child-first and a parent's BEGIN before
  its children's. Input in Perfetto's order per thread (by start, the longer first: what the merge
  hands it) is exact; children-before-parents input (VizTracer
  writes on exit) is exact unless a parent starts at the same ns as an earlier-written child: readers
  that hold a file should sort each thread by (ts, -dur). A slice that partially overlaps the enclosing
  one is dropped, as the JSON importer does (``slice_drop_overlapping_complete_event``). The newest
  slice's BEGIN is held back until the next event on its thread, so a flow event that follows it
  (Kineto's ``ac2g``) can still be attached.
- ``B``/``E``, ``i``/``I`` (thread, process or global scope), ``C`` (one counter track per arg, named
  ``"<name> <arg>"`` like the JSON importer), ``b``/``e``/``n`` (one async track per (pid, cat, id)).
- Flows: v2 (``bind_id`` + ``flow_out``/``flow_in``) attach to their slice; v1 ``s``/``t``/``f`` attach to
  the held-back slice when it encloses them, else to an instant at the flow's time on that thread
  (``stats.flow_instants``: Proton writes its flows after all scopes, so only a reader that binds them to
  slices as ``bind_id`` avoids those instants). Ids are hashed to 63 bits (v1 keyed by (cat, name, id)
  like the JSON importer), so upstream namespacing carries over.
- Args become ONE debug annotation ``args`` carrying JSON, which Perfetto expands to ``debug.args.<key>``
  rows flattened exactly like the JSON importer's ``args.<key>`` rows (nested values included).
- pid 0 is Perfetto's idle-process placeholder in protobuf traces (not in JSON): give Proton's pid 0 a
  real process id upstream.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ...common.atomic import atomic_output
from ._pbwire import fan_id, pack_double, pack_fixed64, stable_id, uint
from ._pftrace_sink import (
    BEGIN,
    COUNTER,
    END,
    INSTANT,
    K_DOUBLE_VALUE,
    K_FLOW,
    K_TERMINATING,
    OpenSlice,
    PacketSink,
    PftraceStats,
    ThreadState,
)

__all__ = ["PftraceStats", "PftraceWriter", "fan_id", "stable_id", "write_pftrace"]

_GLOBAL_TRACK_KEY = "global-instants"
_UNKNOWN_END = 1 << 62  # a B slice's end is unknown until its E


class PftraceWriter(PacketSink):
    """Writes TracePackets to a binary file object as events arrive (memory bounded by open slices).

    ``base_ns`` must be <= every ``ts_ns`` (the merged timeline's origin). Call :meth:`close` (or use
    ``with``) to write the slices still open; it does not close ``out``. Writers with different
    ``sequence_id`` s (e.g. one per worker process, sharded by process) can be concatenated byte for byte.
    """

    _slice_type: Any = OpenSlice  # what a thread's stack holds (the compiled encoder brings its own)

    def __enter__(self) -> PftraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _reset_interning(self) -> None:
        for th in self._threads.values():
            if th.stack and th.stack[-1].body is not None:
                self._write_begin(th.stack[-1])  # held BEGINs use the old ids: write them first
        super()._reset_interning()

    # ------------------------------------------------------------------ events
    def write(self, ev: Mapping[str, Any]) -> None:
        """Write one normalised merge event (unknown phases are counted in ``stats.dropped``)."""
        if self._closed:
            raise ValueError("pftrace: write() after close()")
        self.stats.events += 1
        if self._interned >= self._intern_limit:
            self._reset_interning()
        ph = ev.get("ph")
        if ph == "X":
            ts, dur = ev["ts_ns"], ev.get("dur_ns") or 0
            self._begin(ev, ts, ts + dur if dur > 0 else ts, False)
        elif ph == "B":
            self._begin(ev, ev["ts_ns"], _UNKNOWN_END, True)
        elif ph == "E":
            self._end_b(ev)
        elif ph in ("i", "I", "R"):
            self._instant(ev)
        elif ph == "C":
            self._counter(ev)
        elif ph in ("s", "t", "f"):
            self._flow_v1(ev)
        elif ph in ("b", "e", "n"):
            self._async(ev, ph)
        elif ph == "M":
            self._metadata(ev)
        else:
            self.stats.drop(f"unsupported_phase_{ph}")

    def write_many(self, events: Iterable[Mapping[str, Any]]) -> None:
        for ev in events:
            self.write(ev)

    def _v2_flows(self, ev: Mapping[str, Any]) -> bytes:
        """``bind_id`` with ``flow_out`` starts (or continues) a flow; ``flow_in`` alone ends it."""
        bind = ev.get("bind_id")
        if bind is None:
            return b""
        fid = pack_fixed64(stable_id("v2", bind))
        self.stats.flow_endpoints += 1
        if ev.get("flow_out"):
            return K_FLOW + fid
        if ev.get("flow_in"):
            return K_TERMINATING + fid
        self.stats.flow_endpoints -= 1
        return b""

    def _settle(self, th: ThreadState, ts: int) -> None:
        """Before an event at ``ts``: end the slices that are over, write the held-back BEGIN.

        A slice is over at its end, except a zero-length one: Perfetto's JSON importer nests what starts
        at the same ns inside it (two instants at one ns stack up), so the protobuf trace does too."""
        stack = th.stack
        while stack and (stack[-1].end_ns < ts or stack[-1].start_ns < stack[-1].end_ns == ts):
            self._pop(stack)
        if stack and stack[-1].body is not None:
            self._write_begin(stack[-1])

    def _begin(self, ev: Mapping[str, Any], ts: int, end_ns: int, is_b: bool) -> None:
        th = self._threads.get((ev["pid"], ev["tid"])) or self._thread(ev["pid"], ev["tid"])
        stack = th.stack
        at = len(stack)  # where the new slice goes on the stack
        if stack:
            top = stack[-1]
            if ts < top.start_ns:  # out of order on this thread: let Perfetto's sort place it
                self.stats.reordered += 1
                while stack:
                    self._pop(stack)
                at = 0
            elif (
                ts == top.start_ns <= top.end_ns < end_ns and top.body is not None and not (is_b or top.is_b)
            ):
                # A parent that arrives after its first child (VizTracer writes slices on exit): its
                # BEGIN is still unwritten, so the parent can slide under it and be written first.
                self.stats.reordered += 1
                at -= 1
            else:
                self._settle(th, ts)
                at = len(stack)
            if at and end_ns > stack[at - 1].end_ns and not (is_b or stack[at - 1].is_b):
                self.stats.drop("overlapping_slice")  # the JSON importer drops these too
                return
        entry = self._slice_type(th.track, ts, end_ns, self._common(ev), is_b)
        if th.waiting:
            entry.flows = b"".join(K_TERMINATING + pack_fixed64(f) for f in th.waiting)
            th.waiting.clear()
        if "bind_id" in ev:
            entry.flows += self._v2_flows(ev)
        stack.insert(at, entry)
        if at < len(stack) - 1:  # slid under its child: its BEGIN must precede the child's in the file
            self._write_begin(entry)

    def _write_begin(self, entry: OpenSlice) -> None:
        body = entry.body
        assert body is not None
        entry.body = None
        self._event(entry.start_ns, BEGIN + entry.track + body + entry.flows)

    def _pop(self, stack: list[OpenSlice], end_ns: int | None = None, extra: bytes = b"") -> None:
        entry = stack.pop()
        if entry.body is not None:
            self._write_begin(entry)
        self._event(entry.end_ns if end_ns is None else end_ns, END + entry.track + extra + entry.end_flows)
        self.stats.slices += 1

    def _end_b(self, ev: Mapping[str, Any]) -> None:
        th = self._thread(ev["pid"], ev["tid"])
        ts = ev["ts_ns"]
        stack = th.stack
        while stack and not stack[-1].is_b and stack[-1].end_ns <= ts:
            self._pop(stack)
        if not stack or not stack[-1].is_b:
            self.stats.drop("unmatched_end")
            return
        args = ev.get("args")
        self._pop(stack, ts, self._annotations(args) if args else b"")

    def _instant(self, ev: Mapping[str, Any]) -> None:
        ts, pid, scope = ev["ts_ns"], ev["pid"], ev.get("s", "t")
        if scope == "g":
            track = self._child_track((_GLOBAL_TRACK_KEY,), -1, "Global instants")
        elif scope == "p":
            if pid not in self._processes:
                self.process(pid)
            track = uint(11, stable_id("process", pid))
        else:
            th = self._thread(pid, ev["tid"])
            self._settle(th, ts)
            track = th.track
        self._event(ts, INSTANT + track + self._common(ev) + self._v2_flows(ev))
        self.stats.instants += 1

    def _counter(self, ev: Mapping[str, Any]) -> None:
        pid, name, cid = ev["pid"], str(ev.get("name", "")), ev.get("id")
        prefix = name if cid is None else f"{name} id: {cid}"
        for key, value in (ev.get("args") or {}).items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                self.stats.drop("counter_not_a_number")
                continue
            track = self._child_track(("counter", pid, prefix, key), pid, f"{prefix} {key}", counter=True)
            self._event(ev["ts_ns"], COUNTER + track + K_DOUBLE_VALUE + pack_double(float(value)))
            self.stats.counters += 1

    def _flow_v1(self, ev: Mapping[str, Any]) -> None:
        """Bind to the thread's topmost slice, as Perfetto's JSON importer does (the newest slice not
        yet closed by a later one, even when it has ended): a start or step on its held-back BEGIN, an
        end on its BEGIN when they coincide, else on its END. A start or step that cannot bind becomes
        an instant at its time; an end with no slice on its thread is dropped (the JSON importer's
        ``flow_no_enclosing_slice``).

        ``flow_fanout`` (k > 1 ends after this start) and ``flow_seq`` (the j-th of them) give each
        link its own id: one TrackEvent flow id links one source to one end."""
        ph, ts = ev["ph"], ev["ts_ns"]
        fid = self._flow_id(ev.get("cat") or "", ev.get("name") or "", ev.get("id"))
        seq = ev.get("flow_seq")
        if seq:
            fid = fan_id(fid, seq)
        th = self._thread(ev["pid"], ev["tid"])
        self.stats.flow_endpoints += 1
        if ph == "f" and ev.get("bp") != "e":
            th.waiting.append(fid)  # binds to the next slice that begins on this thread
            return
        enc = (K_TERMINATING if ph == "f" else K_FLOW) + pack_fixed64(fid)
        fanout = ev.get("flow_fanout") or 0
        if fanout > 1 and ph != "f":
            enc += b"".join(K_FLOW + pack_fixed64(fan_id(fid, j)) for j in range(1, fanout))
        top = th.stack[-1] if th.stack else None
        if top is not None and top.start_ns <= ts:
            if ph == "f" and (top.body is None or top.start_ns < ts):
                # Perfetto links a flow when it meets its end: a BEGIN earlier than the flow's own time
                # may come before the flow's start, the END never does (time order, ends >= the end)
                top.end_flows += enc
                return
            if top.body is not None:
                top.flows += enc
                return
        elif ph == "f":
            self.stats.drop("flow_no_enclosing_slice")
            return
        self._settle(th, ts)
        body = INSTANT + th.track + self._common(ev) + enc
        self._event(ts, body)
        self.stats.flow_instants += 1

    def _flow_id(self, cat: str, name: str, ident: Any) -> int:
        """v1 flows are keyed by (cat, name, id), as in Perfetto's JSON importer; ints take a fast path."""
        salt = self._flow_salts.get((cat, name))
        if salt is None:
            salt = self._flow_salts[(cat, name)] = stable_id("v1", cat, name)
        if type(ident) is int and 0 <= ident < 1 << 63:
            return ((ident * 0x9E3779B97F4A7C15) ^ salt) & 0x7FFFFFFFFFFFFFFF or 1
        return stable_id("v1", cat, name, ident)

    def _async(self, ev: Mapping[str, Any], ph: str) -> None:
        pid, cat = ev["pid"], str(ev.get("cat") or "")
        key = ("async", pid, cat, ev.get("id"), ev.get("id2"))
        track = self._child_track(key, pid, str(ev.get("name", "")))
        if ph == "e":
            args = ev.get("args")
            body = END + track + (self._annotations(args) if args else b"")
            self.stats.slices += 1
        else:
            body = (BEGIN if ph == "b" else INSTANT) + track + self._common(ev)
            self.stats.instants += ph == "n"
        self._event(ev["ts_ns"], body)

    def _metadata(self, ev: Mapping[str, Any]) -> None:
        name, args, pid = ev.get("name"), ev.get("args") or {}, ev.get("pid")
        if not isinstance(pid, int):
            self.stats.drop("metadata_without_pid")
        elif name == "process_name":
            self.process(pid, str(args.get("name", "")))
        elif name == "process_sort_index":
            self.process(pid, None, args.get("sort_index"))
        elif name == "thread_name":
            self.thread(pid, ev["tid"], str(args.get("name", "")))
        elif name == "thread_sort_index":
            self.thread(pid, ev["tid"], None, args.get("sort_index"))
        else:
            self.stats.drop(f"metadata_{name}")

    def close(self) -> PftraceStats:
        """End every open slice at its own end (an unterminated ``B`` is dropped), flush, return stats."""
        if not self._closed:
            for th in self._threads.values():
                while th.stack and not th.stack[-1].is_b:
                    self._pop(th.stack)
                if th.stack:  # B without E below: Perfetto would show it unfinished; count instead
                    self.stats.drop("unterminated_begin")
                    for entry in th.stack:
                        if entry.body is not None:
                            self._write_begin(entry)
                    th.stack.clear()
                if th.waiting:
                    self.stats.dropped["unbound_flow"] = self.stats.dropped.get("unbound_flow", 0) + len(
                        th.waiting
                    )
            self._closed = True
        self.flush()
        return self.stats


def write_pftrace(
    path: str | os.PathLike[str],
    events: Iterable[Mapping[str, Any]],
    *,
    base_ns: int,
    processes: Iterable[tuple[int, str | None, int | None]] = (),
    threads: Iterable[tuple[int, int, str | None, int | None]] = (),
) -> PftraceStats:
    """Write a whole ``.pftrace`` atomically (temp file beside it, then rename)."""
    with atomic_output(Path(path)) as f:
        writer = PftraceWriter(f, base_ns=base_ns)
        for pid, name, sort_index in processes:
            writer.process(pid, name, sort_index)
        for pid, tid, name, sort_index in threads:
            writer.thread(pid, tid, name, sort_index)
        writer.write_many(events)
        return writer.close()
