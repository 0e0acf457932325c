"""Merging rollout request spans: run-scoped flows across processes, the in-flight counter, and the
result as Perfetto reads it (both output formats, real engine; the protobuf output's args are
``debug.args.*``)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trace_observer import config as config_mod
from rl_trace_observer.capture import requests as rq
from rl_trace_observer.capture.recorder import Recorder
from rl_trace_observer.merge.formats.rl_insight.requests import (
    COUNTER_NAME,
    in_flight_counters,
    request_events,
)
from rl_trace_observer.merge.timeline.model import Event
from rl_trace_observer.merge.transform.passes import RUN_FLOW_BIT, PassContext, namespace_ids, run_flow_id

from ..conftest import merge_cli
from ..trace_files import event_logs, spans


def test_run_flow_ids_are_stable_and_apart_from_every_artifact_space() -> None:
    a = run_flow_id("rl-trace:request/abc")
    assert a == run_flow_id("rl-trace:request/abc") and a is not None
    assert RUN_FLOW_BIT <= a < 1 << 63  # Perfetto's JSON importer reads bind ids as int64
    assert run_flow_id("rl-trace:request/abd") != a
    assert run_flow_id("request/abc") is None and run_flow_id(12) is None
    largest_namespaced = ((1 << 22) - 1) << 40 | ((1 << 40) - 1)
    assert largest_namespaced < RUN_FLOW_BIT


def test_namespace_pass_maps_run_scoped_binds_and_counts_them_apart() -> None:
    ctx = PassContext(namespace=7)
    evs = [
        Event(ph="X", name="a", pid=1, tid=1, ts=0, dur=5, bind_id="rl-trace:request/x", flow_out=True),
        Event(ph="X", name="b", pid=1, tid=2, ts=1, dur=5, bind_id=3, flow_out=True),
        Event(ph="X", name="c", pid=1, tid=2, ts=9, dur=1, bind_id=3, flow_in=True),
    ]
    namespace_ids(evs, ctx)
    assert evs[0].bind_id == run_flow_id("rl-trace:request/x")
    assert evs[1].bind_id == evs[2].bind_id and evs[1].bind_id >> 40 == 7
    assert ctx.stats == {"flows": 1, "unpaired_flow_events": 0, "run_flow_endpoints": 1}


def _server_span(pid: int, ts: int, dur: int, replica: Any) -> Event:
    args = msgspec.json.encode({"replica": replica, "request_id": "r"})
    return Event(
        ph="X",
        name=rq.SERVER_SPAN,
        cat=rq.REQUEST_CAT,
        pid=pid,
        tid=1,
        ts=ts,
        dur=dur,
        args=msgspec.Raw(args),
    )


def test_engine_times_become_phase_sub_spans_nested_in_the_server_span() -> None:
    args = {"replica": 0, "request_id": "r1", "engine_ns": [50, 120, 300, 900]}
    server = Event(
        ph="X",
        name=rq.SERVER_SPAN,
        cat=rq.REQUEST_CAT,
        pid=3,
        tid=9,
        ts=100,
        dur=700,
        args=msgspec.Raw(msgspec.json.encode(args)),
    )
    phases = [e for e in request_events([server]) if e.ph == "X"]
    assert [(p.name, p.ts, p.dur, p.tid, p.cat) for p in phases] == [
        ("queue", 100, 20, 9, rq.PHASE_CAT),  # queued before it arrived: clipped to the span
        ("prefill", 120, 180, 9, rq.PHASE_CAT),
        ("decode", 300, 500, 9, rq.PHASE_CAT),  # the last token after return: clipped too
    ]
    assert all(msgspec.json.decode(p.args) == {"request_id": "r1"} for p in phases)  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None)
@given(
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.lists(st.one_of(st.none(), st.integers(0, 3 * 10**6)), min_size=4, max_size=4),
)
def test_phase_sub_spans_always_nest_in_order(ts: int, dur: int, edges: list[int | None]) -> None:
    args = msgspec.json.encode({"request_id": "r", "engine_ns": edges})
    server = Event(
        ph="X", name=rq.SERVER_SPAN, cat=rq.REQUEST_CAT, pid=1, tid=1, ts=ts, dur=dur, args=msgspec.Raw(args)
    )
    phases = [e for e in request_events([server]) if e.ph == "X"]
    prev_end = ts
    for p in phases:
        assert prev_end <= p.ts and p.dur >= 0 and p.ts + p.dur <= ts + dur  # type: ignore[operator]
        prev_end = p.ts + p.dur  # type: ignore[operator]


def test_in_flight_counter_steps_with_the_server_spans() -> None:
    evs = [
        _server_span(5, 0, 10, 0),
        _server_span(5, 5, 5, 0),
        _server_span(5, 10, 3, 0),
        _server_span(5, 2, 1, 1),
    ]
    evs.append(Event(ph="X", name="other", cat="x", pid=5, tid=1, ts=0, dur=100))
    counters = in_flight_counters(evs)
    series = [(c.name, c.ts, msgspec.json.decode(c.args)["value"]) for c in counters]  # type: ignore[arg-type]
    r0 = f"{COUNTER_NAME}{{replica=0}}"
    assert [s for s in series if s[0] == r0] == [(r0, 0, 1), (r0, 5, 2), (r0, 10, 1), (r0, 13, 0)]
    r1 = f"{COUNTER_NAME}{{replica=1}}"
    assert [s for s in series if s[0] == r1] == [(r1, 2, 1), (r1, 3, 0)]
    assert all(c.ph == "C" and c.pid == 5 and c.tid == 0 for c in counters)
    assert in_flight_counters([]) == []


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 300)), max_size=60))
def test_in_flight_counter_equals_a_brute_force_count(spans: list[tuple[int, int]]) -> None:
    counters = in_flight_counters([_server_span(1, ts, dur, 0) for ts, dur in spans])
    values = [(c.ts, msgspec.json.decode(c.args)["value"]) for c in counters]  # type: ignore[arg-type]
    # one sample at every time a request starts or ends (where the count may change), in order
    assert [ts for ts, _ in values] == sorted({t for s, d in spans for t in (s, s + d)})
    for ts, value in values:  # a request counts from its start until (not including) its end
        assert value == sum(1 for s, d in spans if s <= ts < s + d)
    if values:
        assert values[-1][1] == 0


# ------------------------------------------------------------------- two processes, merged for real
def _recorder(out: Path, pid: int) -> Recorder:
    return Recorder(config_mod.load({"RL_TRACE_OUTPUT_DIR": str(out)}), host="node", pid=pid)


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[str]]]:
    """An agent-loop process and two replica processes, with 12 overlapping requests."""
    out = tmp_path_factory.mktemp("requests-run")
    agent, servers = _recorder(out, 1001), {0: _recorder(out, 2001), 1: _recorder(out, 2002)}
    rng = random.Random(7)
    rids = [f"req-{i}" for i in range(12)]
    t = 1_800_000_000_000_000_000
    for i, rid in enumerate(rids):  # hand-built through the same event builder as the live API
        replica = i % 2
        start = t + i * 1_000_000
        srv_start = start + 100_000
        srv_end = srv_start + rng.randrange(1_000_000, 3_000_000)  # < 4 ms: one lane never overlaps
        for rec, name, lo, hi, flow, args in (
            (servers[replica], rq.SERVER_SPAN, srv_start, srv_end, "flow_in", {"replica": replica}),
            (agent, rq.CLIENT_SPAN, start, srv_end + 50_000, "flow_out", {"server": f"10.0.0.{replica}"}),
        ):
            pool = rq._Slots(rec, "requests " if name == rq.CLIENT_SPAN else f"replica_{replica} requests ")
            slot = i % 4  # four lanes, each holding requests that never overlap on it
            req = rq.Request(rid, lo, pool, slot, {"request_id": rid, **args})
            with mock.patch.object(rq, "_time_ns", lambda end=hi: end):  # the span ends at ``hi``
                rq._write_span(req, name, flow)
    for rec in (agent, *servers.values()):
        rec.close()
    yield out, rids


FLOW_SQL = """
select coalesce(extract_arg(a.arg_set_id, 'args.request_id'),
                extract_arg(a.arg_set_id, 'debug.args.request_id')) as client_rid,
       b.name as to_name, p.name as pname,
       coalesce(extract_arg(b.arg_set_id, 'args.request_id'),
                extract_arg(b.arg_set_id, 'debug.args.request_id')) as server_rid
from flow f join slice a on f.slice_out = a.id join slice b on f.slice_in = b.id
join thread_track tt on b.track_id = tt.id join thread t using(utid) join process p using(upid)
"""
COUNTER_SQL = """
select t.name, max(c.value) as peak, count(*) as n from counter c join counter_track t on c.track_id = t.id
where t.name like 'rollout/requests_in_flight%' group by t.name order by t.name
"""
SAMPLES_SQL = """
select t.name, c.ts, cast(c.value as int) as value from counter c join counter_track t on c.track_id = t.id
where t.name like 'rollout/requests_in_flight%' order by t.name, c.ts
"""


def _expected_samples(run_dir: Path) -> dict[int, list[tuple[int, int]]]:
    """Per replica, (ns after its first sample, requests in flight) at every server span start and end,
    counted by brute force from the servers' own event logs."""
    served: dict[int, list[tuple[int, int]]] = {0: [], 1: []}
    for evs in event_logs(run_dir).values():
        for e in spans(evs):
            if e["name"] == rq.SERVER_SPAN:
                served[e["args"]["replica"]].append((e["ts_ns"], e["ts_ns"] + e["dur_ns"]))
    out = {}
    for replica, reqs in served.items():
        times = sorted({t for r in reqs for t in r})
        out[replica] = [(t - times[0], sum(1 for lo, hi in reqs if lo <= t < hi)) for t in times]
    return out


@pytest.mark.perfetto
@pytest.mark.parametrize("suffix", [".json.gz", ".pftrace"])
def test_each_request_is_one_flow_from_client_to_its_server(
    engine: Any, two_processes: tuple[Path, list[str]], tmp_path: Path, suffix: str
) -> None:
    run_dir, rids = two_processes
    out = tmp_path / f"merged{suffix}"
    proc = merge_cli(str(run_dir), "-o", str(out), "--strict")
    assert proc.returncode == 0, proc.stderr
    res = engine.load(out, queries=[FLOW_SQL, COUNTER_SQL, SAMPLES_SQL])
    assert res.ok and res.error_stats == (), res.summary()
    flows = res.queries[0].check().dicts()
    assert sorted(f["client_rid"] for f in flows) == sorted(rids)
    for f in flows:
        assert f["to_name"] == rq.SERVER_SPAN and f["server_rid"] == f["client_rid"]
        replica = int(f["client_rid"].split("-")[1]) % 2
        assert f"pid {2001 + replica}" in f["pname"]
    counters = res.queries[1].check().rows
    assert [row[0] for row in counters] == [
        f"{COUNTER_NAME}{{replica=0}} value",
        f"{COUNTER_NAME}{{replica=1}} value",
    ]
    assert all(row[1] >= 1 for row in counters)
    samples: dict[int, list[tuple[int, int]]] = {0: [], 1: []}
    for name, ts, value in res.queries[2].check().rows:  # every sample, at its exact time
        samples[int(name.split("replica=")[1][0])].append((ts, value))
    got = {r: [(ts - rows[0][0], v) for ts, v in rows] for r, rows in samples.items()}
    assert got == _expected_samples(run_dir)
    import json

    manifest = json.loads(Path(f"{out}.manifest.json").read_text())
    assert manifest["counts"]["run_flow_endpoints"] == 2 * len(rids)
