"""The report's rollout section: long-tail statistics (unit + hypothesis) and the section built from
hand-made span records, rendered in the terminal and HTML."""

from __future__ import annotations

import io
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from rl_trace_observer.analysis.report import html, terminal
from rl_trace_observer.analysis.report.rollout import (
    latency_stats,
    percentile,
    rollout_section,
    sync_step,
    tail_window,
)
from rl_trace_observer.capture import requests as rq

MS = 1_000_000


@dataclass
class S:
    name: str
    cat: str
    start_ns: int
    dur_ns: int
    args: dict[str, Any] = field(default_factory=dict)
    pid: Any = 1
    tid: Any = 1

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.dur_ns


values = st.lists(st.integers(0, 10**12), min_size=1, max_size=200)


@settings(max_examples=200, deadline=None)
@given(values, st.sampled_from([0.5, 0.9, 0.95, 0.99]))
def test_percentile_is_the_inclusive_linear_interpolation(xs: list[int], q: float) -> None:
    got = percentile(xs, q)
    if len(xs) > 1:
        expected = statistics.quantiles(xs, n=100, method="inclusive")[round(q * 100) - 1]
        assert math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-3)
    else:
        assert got == xs[0]
    assert min(xs) <= got <= max(xs)


@settings(max_examples=200, deadline=None)
@given(values)
def test_latency_stats_are_ordered_and_bounded(xs: list[int]) -> None:
    s = latency_stats(xs)
    assert s is not None
    assert min(xs) <= s["p50"] <= s["p95"] <= s["p99"] <= s["max"] == max(xs)
    assert min(xs) <= s["mean"] <= max(xs)
    assert latency_stats([]) is None


@settings(max_examples=200, deadline=None)
@given(values)
def test_tail_window_starts_when_90_percent_had_finished(ends: list[int]) -> None:
    window = tail_window(ends)
    assert window is not None
    t90, last = window
    assert min(ends) <= t90 <= last == max(ends)
    finished = sum(1 for e in ends if e <= t90)
    pos = 0.9 * (len(ends) - 1)
    assert finished >= math.floor(pos) + 1  # at least 90 % (nearest rank below) are done at t90
    tail = [e for e in ends if e > t90]
    assert len(tail) <= len(ends) - (math.floor(pos) + 1)
    if len(ends) > 1:  # t90 is the stdlib's inclusive 90th percentile, rounded to the ns
        assert abs(t90 - statistics.quantiles(ends, n=10, method="inclusive")[8]) <= 0.5 + 1e-3
    else:
        assert t90 == ends[0]


def test_tail_of_ten_requests_is_the_slow_one() -> None:
    ends = [10, 11, 12, 13, 14, 15, 16, 17, 18, 100]
    t90, last = tail_window(ends) or (0, 0)
    assert (t90, last) == (26, 100)  # 18 + 0.1 * (100 - 18), rounded
    assert tail_window([]) is None


# ------------------------------------------------------------------------------- the section
def _request(
    rid: str, step: int, replica: int, start: int, dur: int, *, slow: bool = False, **extra: Any
) -> list[S]:
    client = S(
        rq.CLIENT_SPAN,
        rq.REQUEST_CAT,
        start,
        dur,
        {
            "request_id": rid,
            "step": step,
            "uid": f"u{rid}",
            "session_id": 0,
            "turn": 1,
            "prompt_tokens": 10,
            "server": f"10.0.0.{replica}:1",
            **extra,
        },
        pid=1,
    )
    s0, s1 = start + MS // 10, start + dur - MS // 10  # the server span inside the client's
    args = {
        "request_id": rid,
        "replica": replica,
        "response_tokens": 100 if slow else 10,
        "version": step - 1,
    }
    server = S(rq.SERVER_SPAN, rq.REQUEST_CAT, s0, s1 - s0, args, pid=100 + replica)
    edges = (("queue", s0, s0 + 2000), ("prefill", s0 + 2000, s0 + 4000), ("decode", s0 + 4000, s1))
    phases = [
        S(name, rq.PHASE_CAT, lo, hi - lo, {"request_id": rid}, pid=100 + replica) for name, lo, hi in edges
    ]
    return [client, server, *phases]  # the phases as the merger draws them under the server span


def _trace() -> tuple[list[S], list[tuple[int | None, int, int]], list[tuple[str, int, int]]]:
    spans: list[S] = []
    base = 1_000 * MS
    for i in range(10):  # step 1: ten requests, r9 is slow
        spans += _request(f"r{i}", 1, i % 2, base + i * MS, (400 if i == 9 else 20) * MS, slow=i == 9)
    spans += _request("v0", 1, 0, base, 5 * MS, validate=True)  # validation: counted apart
    spans.append(
        S(rq.SERVER_SPAN, rq.REQUEST_CAT, base + 50 * MS, 3 * MS, {"request_id": "lonely", "replica": 1})
    )
    trainer = base + 1000 * MS
    spans += [
        S("update_weights", rq.SYNC_CAT, trainer, 100 * MS, {"version": 1, "backend": "naive"}, pid=7),
        S("pause", rq.SYNC_CAT, trainer + MS, 5 * MS, {}, pid=7),
        S("load_weights", rq.SYNC_CAT, trainer + 10 * MS, 50 * MS, {"replica": 0, "bytes": 400}, pid=100),
        S("load_weights", rq.SYNC_CAT, trainer + 10 * MS, 80 * MS, {"replica": 1, "bytes": 400}, pid=101),
        S("resume_kv_cache", rq.SYNC_CAT, trainer + 92 * MS, 2 * MS, {"replica": 1}, pid=101),
        S("sleep", rq.SYNC_CAT, trainer + 500 * MS, 2 * MS, {"replica": 1}, pid=101),  # outside the sync
        S(
            "consume_samples",
            rq.STALENESS_CAT,
            base,
            420 * MS,
            {
                "step": 1,
                "trainer_version": 0,
                "samples": 10,
                "lag_steps": {"0": 9, "1": 1},
                "max_lag_steps": 1,
                "mean_lag_steps": 0.1,
                "unknown_version": 0,
            },
            pid=7,
        ),
        S("global_step", "verl", base, 3000 * MS, {"step": 1}, pid=7),  # not ours: ignored here
    ]
    windows = [(1, base, base + 3000 * MS)]
    training = [("update", base + 380 * MS, base + 390 * MS)]  # the trainer worked 10 ms of the tail
    return spans, windows, training


def test_section_from_span_records() -> None:
    spans, windows, training = _trace()
    ro = rollout_section(spans, windows, training)
    assert ro is not None
    assert (ro["requests"], ro["validation_requests"], ro["linked"]) == (11, 1, 11)
    assert ro["client_spans"] == 11 and ro["server_spans"] == 12
    (step,) = ro["steps"]
    assert step["step"] == 1 and step["requests"] == 11  # the server-only request ended in step 1
    assert step["latency_ns"]["max"] == 400 * MS and step["latency_ns"]["p50"] == 20 * MS
    tail = step["tail"]
    assert tail["request_ids"] == ["r9"] and tail["end_ns"] == 1_000 * MS + 9 * MS + 400 * MS
    assert tail["trainer_ns"]["update"] == 10 * MS
    assert tail["trainer_ns"]["idle"] == tail["dur_ns"] - 10 * MS
    reps = {r["replica"]: r for r in step["replicas"]}
    assert reps[1]["requests"] == 6 and reps[1]["response_tokens"] == 140 and reps[0]["response_tokens"] == 50
    assert step["imbalance"]["requests"] == round(6 / 5.5, 3)
    slowest = ro["slowest"][0]
    assert (slowest["request_id"], slowest["replica"], slowest["turn"], slowest["turns"]) == ("r9", 1, 1, 1)
    assert slowest["seen_by"] == "both" and slowest["decode_ns"] == 399_800_000 - 4000
    assert (slowest["queue_ns"], slowest["prefill_ns"]) == (2000, 2000)
    assert step["phases_ns"]["queue"]["p50"] == 2000
    (sync,) = ro["weight_sync"]["syncs"]
    assert sync["version"] == 1 and sync["trainer_phases_ns"] == {"pause": 5 * MS}
    assert sync["step"] == 1  # the window holding its start
    later = rollout_section(spans, [(7, sync["start_ns"] + 1, windows[0][2])], training)
    assert later is not None and later["weight_sync"]["syncs"][0]["step"] is None  # starts before it
    assert sync["slowest_replica"] == 1
    by_rep = {r["replica"]: r for r in sync["replicas"]}
    assert by_rep[1]["dur_ns"] == 82 * MS and by_rep[1]["phases_ns"] == {
        "load_weights": 80 * MS,
        "resume_kv_cache": 2 * MS,
    }
    assert by_rep[0]["bytes"] == 400
    assert ro["weight_sync"]["phase_totals_ns"]["replica"]["sleep"] == 2 * MS
    (stale,) = ro["staleness"]
    assert stale["lag_steps"] == {"0": 9, "1": 1} and stale["wait_ns"] == 420 * MS


def test_a_request_no_server_answered_counts_under_the_replica_its_address_serves() -> None:
    """A client span whose server never answered (failed, or cut by the run's end) is counted under the
    replica that answered other requests at that address; an address nobody answered at names itself."""
    spans, windows, training = _trace()
    cut = _request("cut", 1, 1, 1_000 * MS + 30 * MS, 5 * MS, status="error: ConnectionResetError")[:1]
    lost = _request("lost", 1, 7, 1_000 * MS + 31 * MS, 5 * MS, status="error: ConnectionResetError")[:1]
    ro = rollout_section([*spans, *cut, *lost], windows, training)
    assert ro is not None
    (step,) = ro["steps"]
    reps = {r["replica"]: r for r in step["replicas"]}
    assert set(reps) == {0, 1, "10.0.0.7:1"}
    assert reps[1]["requests"] == 7 and reps["10.0.0.7:1"]["requests"] == 1
    assert ro["failed"] == 2


def test_no_rollout_spans_no_section() -> None:
    assert rollout_section([S("actor_update", "rl_insight", 0, 1)], []) is None


def test_rendered_in_terminal_and_html_with_escaping() -> None:
    spans, windows, training = _trace()
    spans += _request("<b>x</b>", 1, 0, 1_000 * MS, 500 * MS)  # the slowest: shown, escaped
    summary = {"rollout": rollout_section(spans, windows, training)}
    page = html._rollout_section(summary)
    assert "Rollout: requests, long tail" in page and "Slowest requests" in page
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page
    buf = io.StringIO()
    terminal._rollout(Console(file=buf, width=200), summary, 10, compact=False)
    text = buf.getvalue()
    for title in (
        "Rollout requests per step",
        "Replicas per step",
        "Slowest requests",
        "Weight sync",
        "Staleness",
    ):
        assert title in text
    assert "r9" in text and "<b>x</b>" in text  # the terminal shows text as text
    assert html._rollout_section({"rollout": None}) == ""


@pytest.mark.parametrize("steps", [1, 3])
def test_requests_without_a_step_argument_take_the_window_they_ended_in(steps: int) -> None:
    windows = [(s, s * 100 * MS, (s + 1) * 100 * MS) for s in range(1, steps + 1)]
    spans = [
        S(
            rq.SERVER_SPAN,
            rq.REQUEST_CAT,
            s * 100 * MS + 10 * MS,
            20 * MS,
            {"request_id": f"r{s}", "replica": 0},
        )
        for s in range(1, steps + 1)
    ]
    ro = rollout_section(spans, windows)
    assert ro is not None and [st["step"] for st in ro["steps"]] == list(range(1, steps + 1))


@given(
    st.lists(st.tuples(st.integers(0, 500), st.integers(1, 500)), min_size=1, max_size=6),
    st.integers(-100, 7000),
)
def test_a_sync_is_the_step_holding_its_start_or_else_the_next_steps(
    gaps_lengths: list[tuple[int, int]], start: int
) -> None:
    """A sync between two steps feeds the next step's rollout: it is that step's; before the first
    step or after the last it is no step's."""
    windows, t = [], 0
    for n, (gap, length) in enumerate(gaps_lengths, 1):
        windows.append((n, t + gap, t + gap + length))
        t += gap + length
    got = sync_step(windows, start)
    holding = [w for w, lo, hi in windows if lo <= start < hi]
    later = [w for w, lo, _ in windows if lo > start]
    if holding:
        assert got == holding[0]
    elif start < windows[0][1] or start >= windows[-1][2]:
        assert got is None
    else:
        assert got == later[0]
