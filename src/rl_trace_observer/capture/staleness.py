"""Sample staleness where a trainer takes a batch: the last part of the rollout capture API
(:mod:`.requests` has requests and weight sync). Stdlib only; a no-op when request capture is off
(``RL_TRACE_REQUESTS``); never raises into the trainer.

One ``consume_samples`` span per batch (the trainer's wait for it, on lane ``staleness``) with the
lag distribution, and one ``sample_staleness`` instant per sample (lane ``staleness samples``, at
most :data:`MAX_SAMPLE_EVENTS` per batch) with its oldest/newest policy version and its lag in steps
= the trainer's policy version − the oldest version that produced any of its tokens.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from .requests import STALENESS_CAT, _active, _instant, _problem

CONSUME_SPAN = "consume_samples"
SAMPLE_EVENT = "sample_staleness"
MAX_SAMPLE_EVENTS = 4096  # per consumed batch: the span's histogram still counts every sample
STALENESS_LANE = "staleness"
SAMPLES_LANE = "staleness samples"  # instants apart from the spans: nothing to nest


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError, OverflowError):
        return None


def record_consumption(
    step: Any,
    trainer_version: Any,
    samples: Iterable[tuple[Any, Any, Any]],
    *,
    start_ns: int | None = None,
    end_ns: int | None = None,
    **fields: Any,
) -> None:
    """The trainer took ``samples`` — ``(key, min_version, max_version)`` each — at ``step`` while
    holding policy ``trainer_version``; ``start_ns``/``end_ns``: when it waited for them."""
    rec = _active()
    if rec is None:
        return
    try:
        end = time.time_ns() if end_ns is None else end_ns
        start = end if start_ns is None else start_ns
        tv = _as_int(trainer_version)
        tid = rec.lane_tid(SAMPLES_LANE)
        lags: dict[str, int] = {}
        n = unknown = 0
        for key, lo, hi in samples:
            n += 1
            low = _as_int(lo)
            lag = tv - low if tv is not None and low is not None else None
            if lag is None:
                unknown += 1
            else:
                lags[str(lag)] = lags.get(str(lag), 0) + 1
            if n <= MAX_SAMPLE_EVENTS:
                args = {"key": str(key), "min_version": low, "max_version": _as_int(hi), "lag_steps": lag}
                args["step"] = step
                rec.write_event(_instant(rec, SAMPLE_EVENT, STALENESS_CAT, tid, end, args))
        known = [(int(k), c) for k, c in lags.items()]
        summary: dict[str, Any] = {
            "step": step,
            "trainer_version": tv,
            "samples": n,
            "lag_steps": dict(sorted(lags.items(), key=lambda kv: int(kv[0]))),
            "unknown_version": unknown,
            "max_lag_steps": max((k for k, _ in known), default=None),
            "mean_lag_steps": (sum(k * c for k, c in known) / sum(c for _, c in known)) if known else None,
            **fields,
        }
        rec.span(CONSUME_SPAN, start, end, lane=STALENESS_LANE, cat=STALENESS_CAT, args=summary)
    except Exception as exc:
        _problem(rec, "staleness", exc)
