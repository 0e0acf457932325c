"""Rollout request support in the merge: what a server's request spans imply, drawn at merge time.

The capture layer writes one ``engine_request`` span per request a server handled
(:mod:`....capture.requests`), on slot lanes so overlapping requests nest. Two things follow from
those spans alone, so the merger derives them here instead of every server paying extra events on
its hot path:

- the engine's phases: a span whose args carry ``engine_ns`` = [queued, scheduled, first token,
  last token(, arrival)] gets ``(engine_input /) queue`` / ``prefill`` / ``decode`` sub-spans on its
  lane, clipped into it by the capture layer's own rule (``phase_spans``), so they nest;
- a "requests in flight" counter per (process, replica): ``rollout/requests_in_flight{replica=R}``
  (the labelled-metric naming of RL-Insight counters, so the report reads it like any metric), a
  sample at every time the count changes (equal times: ends first, so a request that leaves as
  another arrives is no spike).

Runs in the reader, before clock correction: what it adds is corrected with everything else.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import msgspec
from msgspec import UNSET

from ....capture.requests import PHASE_CAT, REQUEST_CAT, SERVER_SPAN, EnginePhases, phase_spans
from ...timeline.model import BAD_JSON, Event

COUNTER_NAME = "rollout/requests_in_flight"


class _ServerArgs(msgspec.Struct, gc=False):
    replica: int | str | None = None
    request_id: str | None = None
    engine_ns: list[int | None] | None = None


_ARGS = msgspec.json.Decoder(_ServerArgs)
_EMPTY = _ServerArgs()


def _args(raw: Any) -> _ServerArgs:
    if raw is UNSET:
        return _EMPTY
    try:
        return _ARGS.decode(raw)
    except BAD_JSON:
        return _EMPTY


def request_events(events: list[Event]) -> list[Event]:
    """Phase sub-spans and in-flight counter samples for the server request spans among ``events``
    (times in integer ns); empty when there are none."""
    changes: dict[tuple[Any, Any], list[tuple[int, int]]] = defaultdict(list)
    out: list[Event] = []
    for e in events:
        if e.ph != "X" or e.name != SERVER_SPAN or e.cat != REQUEST_CAT:
            continue
        ts, dur = e.ts, e.dur
        if type(ts) is not int or type(dur) is not int:
            continue
        end = ts + max(dur, 0)
        args = _args(e.args)
        changes[(e.pid, args.replica)] += [(ts, 1), (end, -1)]
        edges = args.engine_ns
        if edges is not None and 4 <= len(edges) <= 5:
            label = msgspec.json.encode({"request_id": args.request_id})
            for name, lo, hi in phase_spans(EnginePhases(*edges), ts, end):
                out.append(
                    Event(
                        ph="X",
                        name=name,
                        cat=PHASE_CAT,
                        pid=e.pid,
                        tid=e.tid,
                        ts=lo,
                        dur=hi - lo,
                        args=msgspec.Raw(label),
                    )
                )
    for (pid, replica), steps in changes.items():
        steps.sort()  # at one time -1 sorts before +1: ends first
        name = COUNTER_NAME if replica is None else f"{COUNTER_NAME}{{replica={replica}}}"
        level = 0
        for i, (ts, delta) in enumerate(steps):
            level += delta
            if i + 1 < len(steps) and steps[i + 1][0] == ts:
                continue  # one sample per time: the level after every change at it
            out.append(
                Event(
                    ph="C",
                    name=name,
                    cat=REQUEST_CAT,
                    pid=pid,
                    tid=0,
                    ts=ts,
                    args=msgspec.Raw(b'{"value":%d}' % level),
                )
            )
    return out


def in_flight_counters(events: list[Event]) -> list[Event]:
    """Only the counter samples of :func:`request_events` (tests, and readers that want no phases)."""
    return [e for e in request_events(events) if e.ph == "C"]
