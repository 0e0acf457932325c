"""AReaL's session files (``sessions-r<rank>.jsonl``) as request spans under their rank and role.

One line per rollout session, written by ``SessionTracer.flush`` (areal 1.0.4) when the session is
finalized, or at a forced flush while still pending: ``task_id, session_id, rank, role, status
(pending / accepted / rejected / failed / dropped), reason, submit_ts, finalized_ts, total_s,
generate_s, reward_s, toolcall_s, phases {name: [{start_ts, end_ts}]}, counters``. Every time is
``time.time()``: wall-clock seconds, so the file needs no anchor.

Each session becomes the capture layer's client request span (``rollout_request`` in
``rl_trace.request``, what the report's rollout section reads: counts, latency, tail), from submit
to finalize, with its phases (generate / reward / toolcall, each execution) as
``rl_trace.request_phase`` sub-spans clipped into it, and an instant at the end of a session AReaL
rejected (``status: rejected``: the workflow's ``should_accept_fn`` refused it — where AReaL filters
stale-weight samples — or it returned nothing: ``reason`` says which) or that failed. Overlapping
sessions take separate slot lanes, so each lane nests.
"""

from __future__ import annotations

import heapq
import math
from typing import Any

import msgspec

from ....capture.requests import CLIENT_SPAN, PHASE_CAT, REQUEST_CAT
from ...files.sources import Head
from ...timeline.model import Event, Problem
from ...timeline.times import EARLIEST_NS, MAX_TS_NS
from ..base import MANIFEST_ENTRY, Format, Hints, ReadContext, ReadResult, SharesPid, SourcePid
from .layout import SESSION_NAME, session_place
from .lines import LineCounts, decode_lines, split_lines

REJECTED = "rejected"
ENDED_BADLY = ("rejected", "failed", "dropped")
STATUS_CAT = "areal.session_status"
LANE_PREFIX = "AReaL sessions"


class _Phase(msgspec.Struct, gc=False):
    start_ts: float | None = None
    end_ts: float | None = None


class SessionLine(msgspec.Struct, gc=False):
    """One line of a session file; only ``session_id`` and ``submit_ts`` are required."""

    session_id: int | str
    submit_ts: float
    task_id: int | str | None = None
    rank: int | None = None
    role: str | None = None
    status: str = "pending"
    reason: str | None = None
    finalized_ts: float | None = None
    phases: dict[str, list[_Phase]] = {}
    counters: dict[str, int | float] = {}


_DECODER = msgspec.json.Decoder(SessionLine)
_encode = msgspec.json.Encoder()


def wall_ns(seconds: float | None) -> int | None:
    """``time.time()`` seconds as epoch ns; None when absent or not a plausible time."""
    if seconds is None or not math.isfinite(seconds):
        return None
    ns = round(seconds * 1e9)
    return ns if EARLIEST_NS <= ns < MAX_TS_NS else None


def read_sessions(data: bytes) -> tuple[list[SessionLine], LineCounts]:
    """The sessions a file holds, each with a plausible submit time; bad lines counted by reason."""
    decoded, counts = decode_lines(data, _DECODER)
    out = []
    for number, s in decoded:
        if wall_ns(s.submit_ts) is None:
            counts.drop("with a submit_ts that is no time", number)
        else:
            out.append(s)
    return out, counts


def session_end_ns(s: SessionLine) -> tuple[int, bool]:
    """(end, finalized): its finalize time, else the last phase time it reached (still open)."""
    start = wall_ns(s.submit_ts)
    assert start is not None
    end = wall_ns(s.finalized_ts)
    if end is not None and end >= start:
        return end, True
    seen = [wall_ns(t) for runs in s.phases.values() for p in runs for t in (p.start_ts, p.end_ts)]
    return max([start] + [t for t in seen if t is not None]), False


def request_id(s: SessionLine, role: str | None, rank: int | None) -> str:
    return f"areal/{role or '-'}/r{rank if rank is not None else '-'}/s{s.session_id}"


def _raw(value: dict[str, Any]) -> msgspec.Raw:
    return msgspec.Raw(_encode.encode(value))


class _Slots:
    """Lanes for overlapping spans: each span takes the lowest lane free at its start."""

    def __init__(self) -> None:
        self._busy: list[tuple[int, int]] = []  # (end, lane)
        self._free: list[int] = []
        self.used = 0

    def take(self, start: int, end: int) -> int:
        while self._busy and self._busy[0][0] <= start:
            heapq.heappush(self._free, heapq.heappop(self._busy)[1])
        lane = heapq.heappop(self._free) if self._free else self.used
        self.used = max(self.used, lane + 1)
        heapq.heappush(self._busy, (end, lane))
        return lane


def session_events(
    sessions: list[SessionLine], pid: int | str, role: str | None, rank: int | None
) -> tuple[list[Event], int]:
    """The spans of every session, and how many slot lanes they took."""
    out: list[Event] = []
    slots = _Slots()
    ordered = sorted(sessions, key=lambda s: s.submit_ts)
    for s in ordered:
        start = wall_ns(s.submit_ts)
        assert start is not None
        end, finalized = session_end_ns(s)
        lane = slots.take(start, end)
        rid = request_id(s, role or s.role, rank if rank is not None else s.rank)
        args: dict[str, Any] = {"request_id": rid, "session_id": s.session_id, "task_id": s.task_id}
        args.update({"status": s.status, "source": "areal session"})
        if s.reason is not None:
            args["reason"] = s.reason
        if s.status == REJECTED:
            args["rejected"] = True
        if not finalized:
            args["open"] = True  # flushed before it was finalized (a forced flush at exit)
        if s.counters:
            args["counters"] = s.counters
        out.append(
            Event(
                ph="X",
                name=CLIENT_SPAN,
                cat=REQUEST_CAT,
                pid=pid,
                tid=lane,
                ts=start,
                dur=end - start,
                args=_raw(args),
            )
        )
        for phase, runs in sorted(s.phases.items()):
            for n, run in enumerate(runs):
                lo, hi = wall_ns(run.start_ts), wall_ns(run.end_ts)
                if lo is None:
                    continue
                lo = min(max(lo, start), end)
                hi = min(max(hi if hi is not None else end, lo), end)
                phase_args = {"request_id": rid, "run": n}
                out.append(
                    Event(
                        ph="X",
                        name=phase,
                        cat=PHASE_CAT,
                        pid=pid,
                        tid=lane,
                        ts=lo,
                        dur=hi - lo,
                        args=_raw(phase_args),
                    )
                )
        if s.status in ENDED_BADLY:
            mark = {"request_id": rid, "status": s.status, "reason": s.reason}
            out.append(
                Event(
                    ph="i",
                    name=f"{s.status}: {s.reason or '-'}",
                    cat=STATUS_CAT,
                    pid=pid,
                    tid=lane,
                    ts=end,
                    s="t",
                    args=_raw(mark),
                )
            )
    return out, slots.used


def status_counts(sessions: list[SessionLine]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for s in sessions:
        key = s.status if s.reason is None else f"{s.status}: {s.reason}"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def line_problems(path: str, counts: LineCounts) -> list[Problem]:
    """``incomplete`` for a torn last line, ``dropped_events`` naming the bad lines."""
    out = []
    if counts.torn:
        out.append(Problem("incomplete", path, "last line is cut (the writer was killed mid-line?)"))
    rest = LineCounts(bad=dict(counts.bad), where={k: list(v) for k, v in counts.where.items()})
    if counts.torn:
        rest.bad["not JSON"] -= 1
        if not rest.bad["not JSON"]:
            del rest.bad["not JSON"]
    if rest.bad:
        out.append(Problem("dropped_events", path, rest.summary()))
    return out


class AReaLSessions(Format, SharesPid):
    kind = "areal_sessions"
    stack = "areal"
    label = "AReaL sessions"
    order = 13
    pid_from = "areal_perf"  # a session file names no pid: it is its perf trace's process's

    def sniff(self, head: Head) -> int:
        first = next((line for _, line, _ in split_lines(head.data[:4096])), b"")
        shaped = b'"session_id"' in first and b'"submit_ts"' in first and first.startswith(b"{")
        if SESSION_NAME.match(head.source.name):
            return 95 if shaped or not first else 60
        return 80 if shaped else 0

    def hints(self, head: Head) -> Hints:
        place = session_place(head.source.path)
        h = Hints(rank=place.rank, role=place.role)
        first = next((line for _, line, _ in split_lines(head.data)), None)
        if first is not None:
            try:
                s = _DECODER.decode(first)
            except (msgspec.DecodeError, RecursionError):
                return h
            h.start_ns = wall_ns(s.submit_ts)
            h.rank = h.rank if h.rank is not None else s.rank
            h.role = h.role or s.role
        return h

    def pid_key(self, path: str) -> Any:
        return session_place(path).key

    def read(self, data: bytes, ctx: ReadContext) -> ReadResult:
        res = ReadResult(anchor_ns=0, anchor_source="wall clock (time.time() in AReaL's session file)")
        sessions, counts = read_sessions(data)
        place = session_place(ctx.path)
        role = place.role or next((s.role for s in sessions if s.role), None)
        rank = (
            place.rank
            if place.rank is not None
            else next((s.rank for s in sessions if s.rank is not None), None)
        )
        pid: int | str = (
            ctx.owner_pid
            if ctx.owner_pid is not None
            else f"AReaL {role or ''} rank {rank}".replace("  ", " ")
        )
        res.events, lanes = session_events(sessions, pid, role, rank)
        res.read = len(res.events) + counts.dropped  # events made of its lines (a session gives several)
        res.dropped = counts.dropped
        res.dropped_why = dict(counts.bad)
        res.complete = not counts.torn
        res.problems = line_problems(ctx.path, counts)
        res.thread_names = {(pid, n): f"{LANE_PREFIX} {n}" for n in range(lanes)}
        if isinstance(pid, str):
            res.process_names = {pid: pid}
        if rank is not None:
            res.meta["rank"] = rank
        res.meta[MANIFEST_ENTRY] = {
            "areal_sessions": {"sessions": len(sessions), "status": status_counts(sessions)}
        }
        return res

    def lane_of(self, pid: SourcePid, tid: Any, result: ReadResult) -> str:
        return result.thread_names.get((pid, tid)) or f"{LANE_PREFIX} {tid}"
