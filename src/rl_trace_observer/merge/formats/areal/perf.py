"""AReaL's perf traces (``traces-r<rank>.jsonl``): Chrome-trace events, one JSON object a line.

``PerfTracer`` (areal 1.0.4, ``areal/utils/perf_tracer.py``) appends ``X`` spans (``trace_scope`` /
``@trace_perf``; ``dur`` at least 1 µs), ``i`` instants and ``M`` process/thread names, with ``pid``
the OS pid, ``cat`` one of compute / comm / io / sync / scheduler / instr / misc (or any text) and
``args.rank`` (``args.role``, ``args.global_step`` where the caller gave it). ``ts`` are whole µs
since ``perf_counter_ns()`` at ``configure()`` (``reset()`` takes a new origin): no absolute time.

Where the file is placed in time, best first:

1. its process record's anchor: ``RL_TRACE_AREAL=1`` wraps ``perf_tracer.configure`` and registers the
   file with the wall-clock ns of its origin (:mod:`....integrations.areal`), exact to the µs;
2. else its session file (same trial, role and rank, :mod:`.layout`): read as its partner, the file is
   placed by the rollout-batch spans that contain its sessions, with a bound (:mod:`.pairing`);
3. else it is not merged (``unanchored``): a perf_counter origin is no time, and guessing one would
   put a rank beside the others at a place the data cannot support.

AReaL's ``global_step`` arguments give each step a ``global_step`` span (the step rule's preferred
marker, :mod:`...timeline.steps`), from the first to the last span naming that step, so the report
and the span tables number steps as AReaL does.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...clock.pairs import PairAlignment, PairCorrection
from ...files.sources import Head, Source, read_content
from ...timeline.model import Event, Problem, us_to_ns
from ...timeline.steps import Marker, marker
from ...timeline.times import EARLIEST_NS
from ..base import (
    MANIFEST_ENTRY,
    AlignsOnPartner,
    Format,
    Hints,
    MarksSteps,
    ReadContext,
    ReadResult,
    SharesPid,
)
from ..base.chrome_json import finish
from .layout import PERF_NAME, perf_place
from .lines import decode_lines, split_lines
from .pairing import CONTAINER_SUFFIX, bracket, middle
from .sessions import line_problems

PROVISIONAL_NS = EARLIEST_NS  # where an unanchored file waits for its session file to place it
PROVISIONAL = "provisional: placed on its session file"
RECORD_ANCHOR = "process record (perf_tracer.configure anchor)"
STEP_SPAN = "global_step"
STEP_CAT = "areal.step"
STEP_TID = 0  # no OS thread has native id 0: the steps lane of the process
PAIRING = "sessions inside rollout batches"


class _StepArgs(msgspec.Struct, gc=False):
    global_step: int | None = None


_LINE = msgspec.json.Decoder(Event)
_STEP = msgspec.json.Decoder(_StepArgs)
_encode = msgspec.json.Encoder()


def _step_of(e: Event) -> int | None:
    raw = e.args
    if not isinstance(raw, msgspec.Raw) or b'"global_step"' not in bytes(raw):
        return None
    try:
        return _STEP.decode(raw).global_step
    except (msgspec.DecodeError, RecursionError):
        return None


def step_spans(events: list[Event]) -> list[Event]:
    """One ``global_step`` span per step AReaL's spans name, over all of them (times in ns)."""
    found: dict[tuple[Any, int], list[int]] = {}
    for e in events:
        if e.ph != "X" or not isinstance(e.ts, int) or not isinstance(e.dur, int):
            continue
        step = _step_of(e)
        if step is None:
            continue
        lo_hi = found.setdefault((e.pid, step), [e.ts, e.ts + e.dur])
        lo_hi[0], lo_hi[1] = min(lo_hi[0], e.ts), max(lo_hi[1], e.ts + e.dur)
    return [
        Event(
            ph="X",
            name=STEP_SPAN,
            cat=STEP_CAT,
            pid=pid,
            tid=STEP_TID,
            ts=lo,
            dur=hi - lo,
            args=msgspec.Raw(_encode.encode({"step": step, "source": "AReaL global_step"})),
        )
        for (pid, step), (lo, hi) in sorted(found.items(), key=lambda kv: kv[1][0])
    ]


def _text(value: int | None) -> str:
    return "-" if value is None else str(value)


class AReaLPerf(Format, MarksSteps, AlignsOnPartner, SharesPid):
    kind = "areal_perf"
    stack = "areal"
    label = "AReaL"
    order = 12
    partner = "areal_sessions"
    partner_label = "AReaL session file"
    markers_rank = 1  # as a profiler trace's: RL-Insight's logs, where a run has them, come first
    markers_relative = True

    def sniff(self, head: Head) -> int:
        first = next((line for _, line, _ in split_lines(head.data[:4096])), b"")
        chrome_line = first.startswith(b"{") and b'"ph"' in first and b'"traceEvents"' not in first
        if PERF_NAME.match(head.source.name):
            return 95 if chrome_line or not first else 60
        if chrome_line and b"Rank " in head.data and b', Process"' in head.data:  # its process_name
            return 80
        return 0

    def hints(self, head: Head) -> Hints:
        place = perf_place(head.source.path)
        h = Hints(rank=place.rank, role=place.role)
        for _, line, _ in split_lines(head.data):
            try:
                e = _LINE.decode(line)
            except (msgspec.DecodeError, RecursionError):
                continue
            if isinstance(e.pid, int):
                h.pid = e.pid
                break
        return h

    def pid_key(self, path: str) -> Any:
        return perf_place(path).key

    def step_markers(self, src: Source) -> tuple[Marker, ...] | None:
        """The ``global_step`` spans its reader makes, in ns after its origin (``markers_relative``:
        the planner adds the anchor its process record gives)."""
        try:
            data = read_content(src).data
        except Exception:  # unreadable here: its reader reports it
            return ()
        if b'"global_step"' not in data:
            return ()
        decoded, _ = decode_lines(data, _LINE)
        spans = []
        for _, e in decoded:
            if e.ph == "X" and isinstance(e.ts, int | float) and isinstance(e.dur, int | float):
                e.ts, e.dur = us_to_ns(e.ts), us_to_ns(e.dur)
                spans.append(e)
        out = []
        for s in step_spans(spans):
            assert isinstance(s.ts, int) and isinstance(s.dur, int)
            found = marker(STEP_SPAN, s.ts, s.ts + s.dur, msgspec.json.decode(bytes(s.args)))  # type: ignore[arg-type]
            if found is not None:
                out.append(found)
        return tuple(out)

    def read(self, data: bytes, ctx: ReadContext) -> ReadResult:
        decoded, counts = decode_lines(data, _LINE)
        res = ReadResult(read=counts.lines, dropped=counts.dropped, complete=not counts.torn)
        res.dropped_why.update(counts.bad)
        res.problems = line_problems(ctx.path, counts)
        place = perf_place(ctx.path)
        if ctx.anchor_ns is not None:
            anchor, res.anchor_source = ctx.anchor_ns, RECORD_ANCHOR
            res.meta[MANIFEST_ENTRY] = {"areal_clock": {"method": "anchor"}}
        elif ctx.partner is not None:
            anchor, res.anchor_source = PROVISIONAL_NS, PROVISIONAL
        else:
            res.skip = True
            res.problems.append(
                Problem(
                    "unanchored",
                    ctx.path,
                    "AReaL perf trace: ts count from perf_counter at configure(); no anchor "
                    "(RL_TRACE_AREAL=1 records one) and no session file of "
                    f"role {place.role or '-'} rank {_text(place.rank)} to place it",
                )
            )
            return res
        res.anchor_ns = anchor
        events = [e for _, e in decoded]
        res.metadata = sum(1 for e in events if e.ph == "M")
        before = res.dropped
        finish(events, anchor, res, defer=False)
        if res.dropped > before:  # decoded, but no time or phase the timeline can take
            res.dropped_why["no usable ts, dur or phase"] = res.dropped - before
        steps = step_spans(res.events)
        res.events.extend(steps)
        res.read += len(steps)  # events this file gave, as RL-Insight's derived request phases count
        for pid in {e.pid for e in steps}:
            if isinstance(pid, int | str):
                res.thread_names[(pid, STEP_TID)] = "AReaL steps"
        if place.rank is not None:
            res.meta["rank"] = place.rank
        return res

    def align_on(
        self,
        partner: tuple[str, ReadResult],
        url: str,
        events: list[Event],
        res: ReadResult,
        tolerance_ns: int,
        apply: bool,
    ) -> PairAlignment | None:
        """Place an unanchored file on its session file (always: it has no clock of its own to keep);
        for an anchored one, measure how far the sessions would have put it (a check, not applied)."""
        partner_url, sessions_res = partner
        containers = [
            (e.ts, e.ts + e.dur)
            for e in events
            if e.ph == "X"
            and isinstance(e.name, str)
            and e.name.endswith(CONTAINER_SUFFIX)
            and isinstance(e.ts, int)
            and isinstance(e.dur, int)
        ]
        sessions = [
            (e.ts, e.ts + e.dur)
            for e in sessions_res.events
            if e.ph == "X"
            and e.name == "rollout_request"
            and isinstance(e.ts, int)
            and isinstance(e.dur, int)
            and b'"open"' not in bytes(e.args or b"")
        ]
        provisional = res.anchor_source == PROVISIONAL
        record: dict[str, Any] = {
            "artifact": url,
            "partner": partner_url,
            "pairing": PAIRING,
            "containers": len(containers),
            "sessions": len(sessions),
        }
        problems: list[dict[str, Any]] = []
        found = bracket(containers, sessions)
        first_event = min((e.ts for e in events if isinstance(e.ts, int) and e.ph != "M"), default=None)
        first_session = min((s for s, _ in sessions), default=None)
        guess = first_session - first_event if first_session is not None and first_event is not None else 0
        if found is None or not found.ranges:
            why = (
                f"no {CONTAINER_SUFFIX} span and finalized session to pair"
                if found is None
                else f"no offset puts all {found.sessions} sessions inside its "
                f"{found.containers} rollout-batch spans"
            )
            record["method"] = "first event at the first session (guess)" if provisional else "none"
            if provisional:
                problems.append(
                    {"path": url, "detail": f"AReaL perf trace placed by a guess, error unbounded: {why}"}
                )
                record["offset_ns"] = guess
                res.meta[MANIFEST_ENTRY] = {"areal_clock": {"method": "guess", "bound_ns": None, "why": why}}
                return PairAlignment(PairCorrection(-guess), record, problems)
            record["why"] = why
            return PairAlignment(None, record, problems)
        chosen = found.pick(guess)
        offset, bound = middle(chosen)
        record.update(
            {"method": PAIRING, "offset_ns": offset, "bound_ns": bound, "ranges": len(found.ranges)}
        )
        if len(found.ranges) > 1:
            problems.append(
                {
                    "path": url,
                    "detail": f"{len(found.ranges)} separate offsets fit the sessions into rollout batches; "
                    "took the one nearest the first session",
                }
            )
        if provisional:
            res.meta[MANIFEST_ENTRY] = {"areal_clock": {"method": PAIRING, "bound_ns": bound}}
            return PairAlignment(PairCorrection(-offset), record, problems)
        # anchored: how far the sessions' placement is from the anchor's (0 = the anchor is inside it)
        lo, hi = chosen
        outside = lo if lo > 0 else (-hi if hi < 0 else 0)
        record["anchor_outside_ns"] = outside
        if outside > tolerance_ns:
            problems.append(
                {"path": url, "detail": f"its anchor puts sessions outside rollout batches by {outside} ns"}
            )
        res.meta[MANIFEST_ENTRY] = {"areal_clock": {"method": "anchor", "sessions_bound_ns": bound}}
        return PairAlignment(None, record, problems)
