"""The native Perfetto protobuf writer: wire format by our own decoder, semantics in the real engine."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl_trace_observer.merge.output import _pbwire as wire
from rl_trace_observer.merge.output.pftrace import PftraceWriter, stable_id, write_pftrace
from rl_trace_observer.testing.perfetto import engine as pe

BASE = 1_700_000_000_000_000_000  # epoch ns: relative times stay small, absolute ones exceed 2**53
SLICES_SQL = (
    "select th.tid, s.name, s.ts, s.dur, s.depth from slice s join thread_track tt on s.track_id = tt.id "
    "join thread th using (utid) order by th.tid, s.ts, s.depth"
)


# ----------------------------------------------------------------------------------- helpers
def X(name: str, ts: int, dur: int, tid: int = 1, pid: int = 10, **extra: Any) -> dict[str, Any]:
    return {
        "ph": "X",
        "name": name,
        "cat": "c",
        "pid": pid,
        "tid": tid,
        "ts_ns": BASE + ts,
        "dur_ns": dur,
        **extra,
    }


def encode(events: list[dict[str, Any]], **kw: Any) -> bytes:
    buf = io.BytesIO()
    with PftraceWriter(buf, base_ns=kw.pop("base_ns", BASE), **kw) as writer:
        writer.write_many(events)
    return buf.getvalue()


def decode_slices(data: bytes) -> list[tuple[int, str, int, int, int]]:
    """Slices as Perfetto builds them: packets sorted by time (stable), one stack per track."""
    names: dict[int, str] = {}
    thread_of: dict[int, int] = {}
    events: list[tuple[int, int, int, int, str]] = []  # ts, order, type, track, name
    for _, _, packet in wire.iter_fields(data):
        assert isinstance(packet, bytes)
        fields = {f: v for f, _, v in wire.iter_fields(packet)}
        if 60 in fields:  # TrackDescriptor
            desc = {f: v for f, _, v in wire.iter_fields(fields[60])}  # type: ignore[arg-type]
            if 4 in desc:
                thread = {f: v for f, _, v in wire.iter_fields(desc[4])}  # type: ignore[arg-type]
                thread_of[desc[1]] = thread[2]  # type: ignore[index]
            continue
        if fields.get(13, 0) & 1:  # type: ignore[operator]
            names.clear()
        for f, _, entry in wire.iter_fields(fields.get(12, b"")):  # type: ignore[arg-type]
            if f == 2:
                item = {g: v for g, _, v in wire.iter_fields(entry)}  # type: ignore[arg-type]
                names[item[1]] = item[2].decode()  # type: ignore[index, union-attr]
        te = {f: v for f, _, v in wire.iter_fields(fields[11])}  # type: ignore[arg-type]
        name = names.get(te.get(10, -1), "")  # type: ignore[arg-type]
        events.append((fields[8], len(events), te[9], te[11], name))  # type: ignore[arg-type]
    stacks: dict[int, list[tuple[str, int]]] = {}
    out = []
    for ts, _, kind, track, name in sorted(events):
        stack = stacks.setdefault(track, [])
        if kind == 1:
            stack.append((name, ts))
        elif kind == 2:
            begun_name, start = stack.pop()
            out.append((thread_of[track], begun_name, start, ts - start, len(stack)))
    return sorted(out)


@st.composite
def nested_threads(draw: st.DrawFn, post_order: bool = False) -> list[dict[str, Any]]:
    """Well-nested X events on 1-3 threads, touching boundaries included, threads interleaved.

    ``post_order``: children before their parent, as VizTracer writes them (on exit); children then
    start strictly after their parent, and a call after a zero-length one strictly after it, which is
    what a tracer's own overhead guarantees.
    """
    per_thread: list[list[dict[str, Any]]] = []
    counter = iter(range(10**6))

    def tree(out: list[dict[str, Any]], tid: int, start: int, end: int, depth: int) -> None:
        me = X(f"n{next(counter)}", start, end - start, tid)
        if not post_order:
            out.append(me)
        cursor = start + 1 if post_order else start
        for _ in range(draw(st.integers(0, 3)) if depth < 4 and end > start else 0):
            if cursor >= end:
                break
            s = draw(st.integers(cursor, end - 1))
            e = draw(st.integers(s, end))
            tree(out, tid, s, e, depth + 1)
            cursor = e if e > s or not post_order else e + 1  # a call after an instant one starts later
        if post_order:
            out.append(me)

    for tid in range(1, draw(st.integers(1, 3)) + 1):
        out: list[dict[str, Any]] = []
        t, gap = 0, 0
        for _ in range(draw(st.integers(1, 4))):
            start = t + draw(st.integers(gap, 3))
            t = start + draw(st.integers(0, 50))
            gap = 1 if post_order and t == start else 0
            tree(out, tid, start, t, 0)
        per_thread.append(out)
    merged: list[dict[str, Any]] = []
    while any(per_thread):
        lane = draw(st.sampled_from([q for q in per_thread if q]))
        merged.append(lane.pop(0))
    return merged


def expected(events: list[dict[str, Any]]) -> list[tuple[int, str, int, int, int]]:
    """Depth by containment, as the generator built it (children start before their parent ends).

    A slice is closed by one starting at its end, except a zero-length one: Perfetto's JSON importer
    nests what starts at the same ns inside it."""
    out = []
    for tid in {e["tid"] for e in events}:
        stack: list[tuple[int, int]] = []
        mine = sorted(
            (e for e in events if e["tid"] == tid),
            key=lambda e: (e["ts_ns"], -e["dur_ns"], int(e["name"][1:])),  # the longer first, as Perfetto
        )
        for e in mine:
            ts, end = e["ts_ns"] - BASE, e["ts_ns"] - BASE + e["dur_ns"]
            while stack and (stack[-1][1] < ts or stack[-1][0] < stack[-1][1] == ts):
                stack.pop()
            out.append((tid, e["name"], ts, e["dur_ns"], len(stack)))
            stack.append((ts, end))
    return sorted(out)


# ----------------------------------------------------------------------------------- no browser
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nested_threads())
def test_nesting_roundtrip_through_own_decoder(events: list[dict[str, Any]]) -> None:
    events.sort(key=lambda e: (e["ts_ns"], -e["dur_ns"]))  # start order, the longer first, as the merge
    assert decode_slices(encode(events)) == expected(events)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nested_threads(post_order=True))
def test_children_before_parents_roundtrip(events: list[dict[str, Any]]) -> None:
    assert decode_slices(encode(events)) == expected(events)


def test_parent_after_its_first_child_with_the_same_start() -> None:
    """VizTracer order with a tie: the parent slides under its still-unwritten first child."""
    events = [X("child", 0, 5), X("parent", 0, 9), X("next", 9, 1)]
    assert decode_slices(encode(events)) == [
        (1, "child", 0, 5, 1),
        (1, "next", 9, 1, 0),
        (1, "parent", 0, 9, 0),
    ]


def test_varint_matches_the_bit_loop() -> None:
    def slow(v: int) -> bytes:
        v &= (1 << 64) - 1
        out = bytearray()
        while v > 0x7F:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
        return bytes(out)

    for v in [
        0,
        1,
        127,
        128,
        16383,
        16384,
        2**28 - 1,
        2**28,
        2**42 - 1,
        2**42,
        2**63,
        2**64 - 1,
        -1,
        -(2**63),
    ]:
        assert wire.varint(v) == slow(v), v
        assert wire.read_varint(wire.varint(v), 0)[0] == v & (2**64 - 1)


def test_stable_ids_are_deterministic_and_typed() -> None:
    assert stable_id("v1", "ac2g", 7) == stable_id("v1", "ac2g", 7)
    assert stable_id("v1", 1) != stable_id("v1", "1")
    assert 0 < stable_id("x") < 2**63


def test_event_before_base_is_an_error() -> None:
    with pytest.raises(ValueError, match="before base_ns"):
        encode([X("early", -1, 5)])


def test_stats_count_what_could_not_be_written() -> None:
    buf = io.BytesIO()
    writer = PftraceWriter(buf, base_ns=BASE)
    writer.write_many(
        [
            X("parent", 0, 10),
            X("crosses", 5, 10),  # partially overlaps its parent: the JSON importer drops it too
            {"ph": "E", "pid": 10, "tid": 1, "ts_ns": BASE + 20},
            {"ph": "P", "pid": 10, "tid": 1, "ts_ns": BASE + 20},
            {"ph": "C", "name": "m", "pid": 10, "ts_ns": BASE + 1, "args": {"value": "high"}},
        ]
    )
    stats = writer.close()
    assert stats.slices == 1
    assert stats.dropped == {
        "overlapping_slice": 1,
        "unmatched_end": 1,
        "unsupported_phase_P": 1,
        "counter_not_a_number": 1,
    }
    assert stats.bytes == len(buf.getvalue())


def test_write_pftrace_is_atomic(tmp_path: Path) -> None:
    def broken() -> Iterator[dict[str, Any]]:
        yield X("a", 0, 1)
        raise RuntimeError("reader failed")

    target = tmp_path / "out.pftrace"
    with pytest.raises(RuntimeError):
        write_pftrace(target, broken(), base_ns=BASE)
    assert list(tmp_path.iterdir()) == []
    stats = write_pftrace(target, [X("a", 0, 1)], base_ns=BASE, processes=[(10, "p", 0)])
    assert target.stat().st_size == stats.bytes and [p.name for p in tmp_path.iterdir()] == ["out.pftrace"]


# ----------------------------------------------------------------------------------- real engine
def chrome_json(path: Path, events: list[dict[str, Any]], base_ns: int = BASE) -> Path:
    """The same events as Chrome JSON (µs with 3 decimals), as the project's JSON writer writes them."""
    out = []
    for e in events:
        ev = {k: v for k, v in e.items() if k not in ("ts_ns", "dur_ns")}
        if "ts_ns" in e:
            ev["ts"] = round((e["ts_ns"] - base_ns) / 1000, 3)
        if "dur_ns" in e:
            ev["dur"] = round(e["dur_ns"] / 1000, 3)
        out.append(ev)
    path.write_text(json.dumps({"traceEvents": out}))
    return path


def kitchen_sink() -> list[dict[str, Any]]:
    """Every mapping the writer does, with ids already namespaced (numeric for v1, as Perfetto needs)."""
    flow = {"cat": "ac2g", "name": "ac2g", "id": 7}
    return [
        {"ph": "M", "name": "process_name", "pid": 10, "tid": 1, "args": {"name": "actor rank 0"}},
        {"ph": "M", "name": "thread_name", "pid": 10, "tid": 1, "args": {"name": "Torch · main"}},
        {"ph": "M", "name": "thread_sort_index", "pid": 10, "tid": 1, "args": {"sort_index": -2}},
        {"ph": "M", "name": "process_name", "pid": 20, "tid": 7, "args": {"name": "GPU 0"}},
        {"ph": "M", "name": "thread_name", "pid": 20, "tid": 7, "args": {"name": "stream 7"}},
        X(
            "step",
            1_000,
            60_000,
            args={"step": 3, "role": "actor", "loss": 0.5, "ok": True, "nest": {"a": [1, 2]}},
        ),
        X("fwd", 1_000, 10_000),  # same start as its parent
        X("op", 1_000, 10_000),  # same start and end as its parent
        X("after", 11_000, 1),  # starts exactly where its sibling ends
        X("launch", 20_000, 3_000),
        {"ph": "s", "pid": 10, "tid": 1, "ts_ns": BASE + 20_000, **flow},
        X("kernel", 21_500, 7_001, pid=20, tid=7),
        {"ph": "f", "bp": "e", "pid": 20, "tid": 7, "ts_ns": BASE + 21_500, **flow},
        X("send", 40_000, 100, bind_id=99, flow_out=True),
        X("recv", 40_500, 100, pid=20, tid=7, bind_id=99, flow_in=True),
        {"ph": "C", "name": "loss", "pid": 10, "tid": 0, "ts_ns": BASE + 5_000, "args": {"value": 1.25}},
        {"ph": "C", "name": "loss", "pid": 10, "tid": 0, "ts_ns": BASE + 6_000, "args": {"value": 2.5}},
        {"ph": "i", "s": "t", "name": "mark", "pid": 10, "tid": 1, "ts_ns": BASE + 30_000},
        {"ph": "B", "name": "wait", "pid": 10, "tid": 2, "ts_ns": BASE + 2_000},
        {"ph": "E", "name": "wait", "pid": 10, "tid": 2, "ts_ns": BASE + 9_000},
    ]


def test_matches_the_json_output_in_perfetto(engine: pe.Engine, tmp_path: Path) -> None:
    events = kitchen_sink()
    pf = tmp_path / "k.pftrace"
    stats = write_pftrace(pf, events, base_ns=BASE)
    queries = [
        SLICES_SQL,
        "select so.name, si.name from flow f join slice so on so.id = f.slice_out "
        "join slice si on si.id = f.slice_in order by 1",
        "select t.name, c.ts, c.value from counter c join counter_track t on t.id = c.track_id order by c.ts",
        "select pid, name from process where name is not null order by pid",
        "select tid, name from thread where name is not null and utid != 0 order by tid",
        "select key, display_value from args join slice using (arg_set_id) where name = 'step' order by key",
    ]
    got = engine.load(pf, queries)
    ref = engine.load(chrome_json(tmp_path / "k.json", events), queries)
    assert got.ok and ref.ok, (got.summary(), ref.summary())
    assert (got.slices, got.flows, got.counters) == (ref.slices, ref.flows, ref.counters) == (10, 2, 2)
    assert stats.slices + stats.instants == got.slices and stats.flow_instants == 0
    for q in queries[:3]:
        assert got.query(q).rows == ref.query(q).rows, q
    assert got.query(queries[3]).rows == ((10, "actor rank 0"), (20, "GPU 0"))
    assert got.query(queries[4]).rows == ((1, "Torch · main"), (7, "stream 7"))
    # Args: the JSON importer's args.<key> rows come back as debug.args.<key>, nested values flattened alike.
    pf_args = [(key.removeprefix("debug."), value) for key, value in got.query(queries[5]).rows]
    assert pf_args == list(ref.query(queries[5]).rows)
    assert dict(pf_args) == {
        "args.step": "3",
        "args.role": "actor",
        "args.loss": "0.5",
        "args.ok": "true",
        "args.nest.a[0]": "1",
        "args.nest.a[1]": "2",
    }


def test_timestamps_are_exact_int64_ns(engine: pe.Engine, tmp_path: Path) -> None:
    odd = 1_700_000_000_123_456_789  # > 2**53 and not a multiple of 1000: JSON µs floats cannot carry it
    events = [{"ph": "X", "name": "x", "pid": 1, "tid": 1, "ts_ns": odd, "dur_ns": 987_654_321_123}]
    pf = write_pftrace(tmp_path / "ns.pftrace", events, base_ns=0) and tmp_path / "ns.pftrace"
    res = engine.load(pf, ["select ts, dur from slice"])
    assert res.ok and res.query("select ts, dur from slice").rows == ((odd, 987_654_321_123),)


def test_interning_reset_keeps_names_right(engine: pe.Engine, tmp_path: Path) -> None:
    events = [X(f"name{i}", i * 10, 5, cat=f"cat{i % 7}", args={f"k{i}": i}) for i in range(200)]
    buf = encode(events, intern_limit=16)
    (tmp_path / "r.pftrace").write_bytes(buf)
    res = engine.load(tmp_path / "r.pftrace", ["select name, category, ts from slice order by ts"])
    assert res.ok, res.summary()
    rows = res.query("select name, category, ts from slice order by ts").rows
    assert rows == tuple((f"name{i}", f"cat{i % 7}", i * 10) for i in range(200))


def test_unbindable_v1_flow_becomes_an_instant(engine: pe.Engine, tmp_path: Path) -> None:
    """Proton writes flows after all scopes: too late to attach, so they land on instants."""
    flow = {"cat": "flow", "name": "launch->kernel", "id": 3, "bp": "e"}
    events = [
        X("scope", 0, 100),
        X("kernel", 150, 50, tid=200000),
        X("later", 300, 10),
        {"ph": "s", "pid": 10, "tid": 1, "ts_ns": BASE + 0, **flow},
        {"ph": "f", "pid": 10, "tid": 200000, "ts_ns": BASE + 150, **flow},
    ]
    buf = io.BytesIO()
    with PftraceWriter(buf, base_ns=BASE) as writer:
        writer.write_many(events)
    assert writer.stats.flow_instants == 1  # the 's'; the 'f' still found its kernel held back
    (tmp_path / "f.pftrace").write_bytes(buf.getvalue())
    sql = (
        "select so.name, so.depth, si.name from flow f join slice so on so.id = f.slice_out "
        "join slice si on si.id = f.slice_in"
    )
    res = engine.load(tmp_path / "f.pftrace", [sql])
    assert res.ok and res.query(sql).rows == (("launch->kernel", 1, "kernel"),)


def test_one_start_many_ends_links_every_end_as_json_does(engine: pe.Engine, tmp_path: Path) -> None:
    """A CUDA-graph launch (one ``s``, an ``f`` per kernel, one id): the merge marks the fan-out
    (``flow_fanout`` on the start, ``flow_seq`` on each end) and each link gets an id of its own; a flow
    end that arrives after its slice's BEGIN is written rides on the slice's END."""
    flow = {"cat": "ac2g", "name": "ac2g", "id": 5}
    events = [
        X("cudaGraphLaunch", 0, 100),
        {"ph": "s", "pid": 10, "tid": 1, "ts_ns": BASE + 0, "flow_fanout": 3, **flow},
        X("k0", 200, 50, pid=20, tid=7),
        {"ph": "f", "bp": "e", "pid": 20, "tid": 7, "ts_ns": BASE + 200, **flow},
        X("k1", 300, 50, pid=20, tid=7),
        X("k1-child", 300, 10, pid=20, tid=7),
        {"ph": "f", "bp": "e", "pid": 20, "tid": 7, "ts_ns": BASE + 320, "flow_seq": 1, **flow},
        X("k2", 400, 50, pid=20, tid=7),
        {"ph": "f", "bp": "e", "pid": 20, "tid": 7, "ts_ns": BASE + 400, "flow_seq": 2, **flow},
    ]
    sql = (
        "select so.name, si.name from flow f join slice so on so.id = f.slice_out "
        "join slice si on si.id = f.slice_in order by 2"
    )
    write_pftrace(tmp_path / "g.pftrace", events, base_ns=BASE)
    got = engine.load(tmp_path / "g.pftrace", [sql])
    ref = engine.load(chrome_json(tmp_path / "g.json", events), [sql])
    assert got.ok and ref.ok, (got.summary(), ref.summary())
    assert got.query(sql).rows == ref.query(sql).rows
    assert [r[1] for r in got.query(sql).rows] == ["k0", "k1-child", "k2"]


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(events=nested_threads())
def test_nesting_in_the_engine(engine: pe.Engine, tmp_path: Path, events: list[dict[str, Any]]) -> None:
    path = tmp_path / "h.pftrace"
    events.sort(key=lambda e: (e["ts_ns"], -e["dur_ns"]))  # start order, the longer first, as the merge
    path.write_bytes(encode(events))
    res = engine.load(path, [SLICES_SQL])
    assert res.ok, res.summary()
    assert sorted(res.query(SLICES_SQL).rows) == expected(events)


def test_shards_with_own_sequences_concatenate(engine: pe.Engine, tmp_path: Path) -> None:
    """Protobuf traces concatenate: writers in parallel processes (one sequence id each, sharded by
    process) can be joined byte for byte, interning included."""
    first = [X("a", 0, 10, pid=1), X("b", 2, 3, pid=1, args={"k": 1})]
    second = [X("a", 1, 10, pid=2), X("c", 5, 3, pid=2, args={"k": 2})]
    joined = encode(first, sequence_id=1) + encode(second, sequence_id=2)
    (tmp_path / "j.pftrace").write_bytes(joined)
    sql = (
        "select p.pid, s.name, s.ts, s.depth from slice s join thread_track tt on s.track_id = tt.id "
        "join thread using (utid) join process p using (upid) order by p.pid, s.ts"
    )
    res = engine.load(tmp_path / "j.pftrace", [sql])
    assert res.ok, res.summary()
    assert res.query(sql).rows == ((1, "a", 0, 0), (1, "b", 2, 1), (2, "a", 1, 0), (2, "c", 5, 1))
