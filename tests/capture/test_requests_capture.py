"""The capture API for rollout requests, weight sync and staleness (``capture/requests.py``).

Real recorder, real event log on disk; the lane property is checked with hypothesis over random
interleavings of requests beginning and ending.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trace_observer import config as config_mod
from rl_trace_observer.capture import configure, get_recorder, reset, staleness
from rl_trace_observer.capture import requests as rq

from ..trace_files import read_jsonl


@pytest.fixture
def rec(tmp_path: Path) -> Iterator[Any]:
    out = tmp_path / "out"
    reset()
    recorder = configure(config_mod.load({"RL_TRACE_OUTPUT_DIR": str(out)}))
    try:
        yield recorder
    finally:
        reset()


def events(recorder: Any) -> list[dict[str, Any]]:
    recorder.events.flush()
    return read_jsonl(recorder.events.path)


def lanes(evs: list[dict[str, Any]]) -> dict[int, str]:
    return {e["tid"]: e["args"]["lane"] for e in evs if e["ph"] == "M"}


def test_everything_is_a_no_op_when_capture_is_off(tmp_path: Path) -> None:
    reset()
    try:
        configure(config_mod.load({}))
        assert rq.begin_client("a") is None and rq.begin_server("a", replica=0) is None
        rq.end_client(None)
        rq.end_server(None)
        with rq.weight_sync("update_weights") as ph:
            ph.args["bytes"] = 1
        staleness.record_consumption(1, 0, [("k", 0, 0)])
        assert not rq.enabled()
        configure(config_mod.load({"RL_TRACE_OUTPUT_DIR": str(tmp_path), "RL_TRACE_REQUESTS": "0"}))
        assert rq.begin_client("a") is None and not rq.enabled()
        rq.mark_version(3, replica=0)
        rec = get_recorder()
        assert rec is not None and rec.events.written == 0 and not rec.events.path.exists()
    finally:
        reset()


def test_requests_switch_is_read_and_validated() -> None:
    assert config_mod.load({}).requests is True
    assert config_mod.load({"RL_TRACE_REQUESTS": "0"}).requests is False
    bad = config_mod.load({"RL_TRACE_REQUESTS": "maybe"})
    assert bad.requests is True and len(bad.problems) == 1 and "treating it as 1" in bad.problems[0]


def test_client_and_server_spans_share_a_run_scoped_bind_id(rec: Any) -> None:
    client = rq.begin_client("sess", session="sess", turn=1, prompt_tokens=7)
    assert client is not None
    client.id = client.args["request_id"] = "rid-1"  # VERL's client learns the id it sends in the call
    server = rq.begin_server("rid-1", replica=3, version=5)
    rq.end_server(server, response_tokens=4, status="completed", version_end=None)
    rq.end_client(client, response_tokens=4, server="10.0.0.1:8000")
    evs = events(rec)
    c = next(e for e in evs if e.get("name") == rq.CLIENT_SPAN)
    s = next(e for e in evs if e.get("name") == rq.SERVER_SPAN)
    assert c["bind_id"] == s["bind_id"] == "rl-trace:request/rid-1"
    assert c["flow_out"] is True and "flow_in" not in c and s["flow_in"] is True and "flow_out" not in s
    assert c["args"] == {
        "session": "sess",
        "turn": 1,
        "prompt_tokens": 7,
        "request_id": "rid-1",
        "response_tokens": 4,
        "server": "10.0.0.1:8000",
    }
    assert s["args"] == {
        "replica": 3,
        "version": 5,
        "request_id": "rid-1",
        "response_tokens": 4,
        "status": "completed",
    }
    assert c["cat"] == s["cat"] == rq.REQUEST_CAT and c["ts_ns"] <= s["ts_ns"]
    assert s["ts_ns"] + s["dur_ns"] <= c["ts_ns"] + c["dur_ns"]
    names = lanes(evs)
    assert names[c["tid"]] == "requests 0" and names[s["tid"]] == "replica_3 requests 0"
    assert "requests 0" not in rec.record()["lanes"]  # slot lanes stay out of the process record


def test_overlapping_requests_take_the_lowest_free_slot(rec: Any) -> None:
    a, b, c = (rq.begin_client(x) for x in "abc")
    rq.end_client(b)
    d = rq.begin_client("d")  # reuses b's slot 1, not a fourth lane
    for r in (a, c, d):
        rq.end_client(r)
    names = lanes(evs := events(rec))
    by_id = {e["args"]["request_id"]: names[e["tid"]] for e in evs if e["ph"] == "X"}
    assert by_id == {"a": "requests 0", "b": "requests 1", "c": "requests 2", "d": "requests 1"}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 50)), min_size=1, max_size=120))
def test_a_slot_lane_never_holds_two_overlapping_requests(tmp_path_factory: Any, script: list[Any]) -> None:
    """Whatever the interleaving, spans on one lane never overlap (so Perfetto nests them), and the
    number of lanes is the peak concurrency."""
    out = tmp_path_factory.mktemp("slots")
    reset()
    try:
        recorder = configure(config_mod.load({"RL_TRACE_OUTPUT_DIR": str(out)}))
        open_: list[Any] = []
        peak = 0
        for begin, pick in script:
            if begin or not open_:
                open_.append(rq.begin_client(f"r{len(open_)}-{pick}"))
                peak = max(peak, len(open_))
            else:
                rq.end_client(open_.pop(pick % len(open_)))
            time.sleep(0)  # distinct clock readings are not needed: equal ns still may not overlap
        while open_:
            rq.end_client(open_.pop())
        evs = events(recorder)
        per: dict[int, list[tuple[int, int]]] = {}
        for e in evs:
            if e["ph"] == "X":
                per.setdefault(e["tid"], []).append((e["ts_ns"], e["ts_ns"] + e["dur_ns"]))
        for spans in per.values():
            spans.sort()
            assert all(prev_end <= start for (_, prev_end), (start, _) in itertools.pairwise(spans))
        assert len(lanes(evs)) == peak
    finally:
        reset()


def test_thousands_in_flight_cost_a_slot_each_and_nothing_per_request(rec: Any) -> None:
    sides = len(rq._pools)
    inflight = [rq.begin_client(f"r{i}") for i in range(5000)]
    pool = inflight[0].pool
    assert pool.free == [] and next(pool.counter) == 5000  # 5000 distinct slots handed out
    for r in inflight:
        rq.end_client(r)
    assert sorted(pool.free) == list(range(5000)) and len(rq._pools) <= sides + 1  # no per-request table
    assert sum(1 for e in events(rec) if e["ph"] == "X") == 5000


def test_past_max_slots_requests_share_one_overflow_lane(rec: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rq, "MAX_SLOTS", 2)
    reqs = [rq.begin_client(str(i)) for i in range(4)]
    assert [r.slot for r in reqs] == [0, 1, 2, 2]
    for r in reqs:
        rq.end_client(r)
    assert sorted(reqs[0].pool.free) == [0, 1]  # the overflow slot is never handed out as free
    assert sorted(set(lanes(events(rec)).values())) == ["requests 0", "requests 1", "requests overflow"]


def test_engine_phases_go_into_the_server_span(rec: Any) -> None:
    req = rq.begin_server("x", replica=0)
    assert req is not None
    t0 = req.start_ns
    phases = rq.EnginePhases(t0 - 5_000, t0 + 1_000, t0 + 3_000, t0 + 10_000)  # queued before arrival
    time.sleep(0.001)
    rq.end_server(req, phases=phases)
    evs = events(rec)
    (server,) = [e for e in evs if e["ph"] == "X"]  # one event: the merger draws the phases
    assert server["args"]["engine_ns"] == [t0 - 5_000, t0 + 1_000, t0 + 3_000, t0 + 10_000]
    end = server["ts_ns"] + server["dur_ns"]  # how the merger and the report clip them into the span:
    assert rq.phase_spans(rq.EnginePhases(*server["args"]["engine_ns"]), server["ts_ns"], end) == [
        ("queue", t0, t0 + 1_000),
        ("prefill", t0 + 1_000, t0 + 3_000),
        ("decode", t0 + 3_000, t0 + 10_000),
    ]


def test_vllm_arrival_is_a_fifth_edge_and_its_phases_sum_to_the_e2e_latency() -> None:
    """vLLM's e2e latency starts at the front end's arrival: with it, engine_input + queue + prefill +
    decode cover arrival → last token without gap or overlap; without it, the four edges as before."""
    stats = SimpleNamespace(
        arrival_time=1_700_000_000.25, queued_ts=10.0, scheduled_ts=10.5, first_token_ts=11.0,
        last_token_ts=12.0, num_preemptions=2,
    )  # fmt: skip
    offset = 1_700_000_000_250_000_000 - 9_990_000_000  # queued 10 ms after arrival
    ph = rq.phases_from_vllm(stats, wall_minus_mono_ns=offset)
    assert ph is not None and ph.arrival_ns is not None
    assert abs(ph.arrival_ns - 1_700_000_000_250_000_000) < 1_000  # an epoch float: ~0.2 µs resolution
    spans = rq.phase_spans(ph, ph.arrival_ns, ph.last_token_ns + 5)
    assert [n for n, _, _ in spans] == ["engine_input", "queue", "prefill", "decode"]
    assert all(a[2] == b[1] for a, b in itertools.pairwise(spans))
    assert sum(hi - lo for _, lo, hi in spans) == ph.last_token_ns - ph.arrival_ns
    assert rq.preemptions_from_vllm(stats) == 2 and rq.preemptions_from_vllm(SimpleNamespace()) == 0
    assert rq.phases_from_vllm(SimpleNamespace(arrival_time=5.0, queued_ts=1.0), wall_minus_mono_ns=0) == (
        rq.EnginePhases(1_000_000_000)  # an arrival that is no epoch time is dropped
    )
    late = SimpleNamespace(arrival_time=1_700_000_000.000002, queued_ts=1.0)  # 2 µs "after" queued
    ph = rq.phases_from_vllm(late, wall_minus_mono_ns=1_700_000_000_000_000_000 - 1_000_000_000)
    assert ph is not None and ph.arrival_ns == ph.queued_ns  # a conversion error, not time: kept, empty
    assert rq.phase_spans(ph, ph.queued_ns - 5, ph.queued_ns + 5)[0] == (
        "engine_input",
        ph.queued_ns,
        ph.queued_ns,
    )


def test_phase_clipping_keeps_order_and_drops_what_is_outside() -> None:
    spans = rq.phase_spans(rq.EnginePhases(10, 50, 40, 200), 0, 100)  # first token "before" scheduled
    assert spans == [("queue", 10, 50), ("decode", 50, 100)]
    assert rq.phase_spans(rq.EnginePhases(None, 5, None, 9), 0, 100) == []


def test_vllm_and_sglang_metrics_convert_to_wall_ns() -> None:
    stats = SimpleNamespace(queued_ts=10.0, scheduled_ts=10.5, first_token_ts=11.0, last_token_ts=0.0)
    ph = rq.phases_from_vllm(stats, wall_minus_mono_ns=1_000)
    assert ph == rq.EnginePhases(10_000_001_000, 10_500_001_000, 11_000_001_000, None)
    assert rq.phases_from_vllm(None) is None
    assert rq.phases_from_vllm(SimpleNamespace(queued_ts=0.0)) is None
    assert rq.phases_from_sglang({"queue_time": 0.25}, 100) == rq.EnginePhases(100, 250_000_100)
    assert rq.phases_from_sglang({"queue_time": "x"}, 0) is None and rq.phases_from_sglang(None, 0) is None


def test_wall_minus_mono_keeps_the_tightest_bracket() -> None:
    """A thread paused between its clock reads must not shift engine phases: of three (mono, wall,
    mono) brackets the tightest wins, the one paused for 450 µs does not."""
    from rl_trace_observer.capture.clock import wall_minus_mono_ns

    true_offset = 5_000_000
    monos = iter([1_000, 451_000, 500_000, 500_200, 600_000, 600_100])  # pause, then two tight brackets
    walls = iter([true_offset + 1_000, true_offset + 500_100, true_offset + 600_050])
    got = wall_minus_mono_ns(3, wall=lambda: next(walls), mono=lambda: next(monos))
    assert got == true_offset  # the 100 ns bracket; the first would have said 225 µs off
    live = wall_minus_mono_ns()
    assert abs(live - (time.time_ns() - time.monotonic_ns())) < 50_000_000  # the real clocks, sanely


def test_weight_sync_phases_nest_and_carry_what_they_learned(rec: Any) -> None:
    with rq.weight_sync("update_weights", version=2, backend="naive"):
        with rq.weight_sync("load_weights", replica=1) as ph:
            ph.args["bytes"] = 1024
        with pytest.raises(RuntimeError), rq.weight_sync("resume_kv_cache", replica=1):
            raise RuntimeError("boom")
    rq.mark_version(2, replica=1)
    evs = events(rec)
    names = lanes(evs)
    got = {e["name"]: e for e in evs if e.get("cat") == rq.SYNC_CAT}
    assert names[got["update_weights"]["tid"]] == "weight_sync"
    assert names[got["load_weights"]["tid"]] == names[got["weight_version"]["tid"]] == "replica_1 weight_sync"
    assert got["load_weights"]["args"] == {"replica": 1, "bytes": 1024}
    assert got["resume_kv_cache"]["args"]["error"] == "RuntimeError"
    assert got["update_weights"]["args"] == {"version": 2, "backend": "naive"}
    assert got["weight_version"]["ph"] == "i" and got["weight_version"]["args"] == {
        "version": 2,
        "replica": 1,
    }
    top = got["update_weights"]
    for name in ("load_weights", "resume_kv_cache"):
        inner = got[name]
        assert (
            top["ts_ns"] <= inner["ts_ns"]
            and inner["ts_ns"] + inner["dur_ns"] <= top["ts_ns"] + top["dur_ns"]
        )


def test_consumption_records_lags_and_caps_per_sample_events(
    rec: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(staleness, "MAX_SAMPLE_EVENTS", 3)
    samples = [("a", 4, 5), ("b", 5, 5), ("c", 3, 4), ("d", None, None), ("e", "5", 5)]
    staleness.record_consumption(6, 5, samples, start_ns=1_000, end_ns=3_000, partition="train")
    evs = events(rec)
    (span,) = [e for e in evs if e.get("name") == "consume_samples"]
    assert (span["ts_ns"], span["dur_ns"]) == (1_000, 2_000)
    assert span["args"] == {
        "step": 6,
        "trainer_version": 5,
        "samples": 5,
        "lag_steps": {"0": 2, "1": 1, "2": 1},
        "unknown_version": 1,
        "max_lag_steps": 2,
        "mean_lag_steps": 0.75,
        "partition": "train",
    }
    points = [e for e in evs if e.get("name") == "sample_staleness"]
    assert [p["args"]["key"] for p in points] == ["a", "b", "c"]  # capped; the histogram has all
    assert points[0]["args"] == {"key": "a", "min_version": 4, "max_version": 5, "lag_steps": 1, "step": 6}


def test_a_failing_write_is_swallowed_and_the_slot_returned(
    rec: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    req = rq.begin_client("x")
    assert req is not None

    def boom(event: dict[str, Any]) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(rec, "write_event", boom)
    rq.end_client(req)  # no exception reaches the caller
    assert req.pool.free == [0]
