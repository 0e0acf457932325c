"""Rollout request support in the merge: a "requests in flight" counter per replica.

The capture layer writes one ``engine_request`` span per request a server handled
(:mod:`...capture.requests`), on slot lanes so overlapping requests nest. How many were in flight at
any moment is a step function of those spans alone, so the merger derives it here instead of every
server paying a counter event twice per request on its hot path. One series per (process, replica):
``rollout/requests_in_flight{replica=R}`` (the labelled-metric naming of RL-Insight counters, so the
report reads it like any metric), a sample at every time the count changes (equal times: ends
first, so a request that leaves as another arrives is no spike).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import msgspec
from msgspec import UNSET

from ...capture.requests import REQUEST_CAT, SERVER_SPAN
from ..model import Event

COUNTER_NAME = "rollout/requests_in_flight"


class _ReplicaArg(msgspec.Struct, gc=False):
    replica: int | str | None = None


_ARGS = msgspec.json.Decoder(_ReplicaArg)


def _replica(raw: Any) -> Any:
    if raw is UNSET:
        return None
    try:
        return _ARGS.decode(raw).replica
    except msgspec.DecodeError:
        return None


def in_flight_counters(events: list[Event]) -> list[Event]:
    """Counter events for the server request spans among ``events`` (times in integer ns)."""
    changes: dict[tuple[Any, Any], list[tuple[int, int]]] = defaultdict(list)
    for e in events:
        if e.ph != "X" or e.name != SERVER_SPAN or e.cat != REQUEST_CAT:
            continue
        ts, dur = e.ts, e.dur
        if type(ts) is not int or type(dur) is not int:
            continue
        key = (e.pid, _replica(e.args))
        changes[key].append((ts, 1))
        changes[key].append((ts + max(dur, 0), -1))
    out: list[Event] = []
    for (pid, replica), edges in changes.items():
        edges.sort()  # at one time -1 sorts before +1: ends first
        name = COUNTER_NAME if replica is None else f"{COUNTER_NAME}{{replica={replica}}}"
        level = 0
        for i, (ts, delta) in enumerate(edges):
            level += delta
            if i + 1 < len(edges) and edges[i + 1][0] == ts:
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
