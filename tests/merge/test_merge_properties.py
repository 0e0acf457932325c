"""Property tests: every reader recovers exact ns and order; the merged timeline keeps every event
once, keeps per-thread order, and never lets two sources' flow ids collide."""

from __future__ import annotations

import itertools
import json
import random
import re
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl_trace_observer.merge.formats import format_for
from rl_trace_observer.merge.formats.base import ReadContext
from rl_trace_observer.merge.options import MergeOptions
from rl_trace_observer.merge.pipeline import merge
from rl_trace_observer.merge.timeline.model import us_to_ns

BASE = 1_790_857_026_000_000_000  # a Kineto-style anchor (floored wall clock)
BASE_FAR = 0  # absurd times are given relative to the anchor too
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def us(ns: int) -> str:
    """How profilers print times: µs with exactly 3 decimals."""
    return f"{ns // 1000}.{ns % 1000:03d}"


names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
x_events = st.lists(
    st.tuples(names, st.integers(0, 2**43 - 1), st.integers(0, 10**9), st.integers(1, 4)), max_size=30
)


@given(st.integers(0, 2**43 * 1000 - 1))
def test_us_to_ns_recovers_every_3_decimal_value(ns: int) -> None:
    assert us_to_ns(float(us(ns))) == ns


def _x_json(name: str, pid: int, tid: int, ts: str, dur: str, extra: str = "") -> str:
    """One X event with its times as exact decimal text (json.dumps would print float reprs)."""
    return f'{{"ph":"X","name":{json.dumps(name)},"pid":{pid},"tid":{tid},"ts":{ts},"dur":{dur}{extra}}}'


def _chrome(kind: str, events: list[tuple[str, int, int, int]], pid: int) -> bytes:
    raw = ",".join(
        _x_json(n, pid, tid, us(ts), us(dur), f',"args":{{"i":{i}}}')
        for i, (n, ts, dur, tid) in enumerate(events)
    )
    if kind == "torch":
        head = f'{{"schemaVersion":1,"deviceProperties":[],"baseTimeNanoseconds":{BASE},"traceEvents":['
        return (head + raw + "]}").encode()
    if kind == "viztracer":
        return (
            '{"traceEvents":[' + raw + f'],"viztracer_metadata":{{"baseTimeNanoseconds":{BASE}}}}}'
        ).encode()
    return (f'{{"displayTimeUnit":"us","baseTimeNanoseconds":{BASE},"traceEvents":[' + raw + "]}").encode()


@SETTINGS
@given(kind=st.sampled_from(["torch", "viztracer", "proton"]), events=x_events)
def test_chrome_readers_keep_exact_ns_and_order(kind: str, events: list[tuple[str, int, int, int]]) -> None:
    res = format_for(kind).read(_chrome(kind, events, 0 if kind == "proton" else 77), ReadContext("f", "f"))
    assert res.dropped == 0 and res.anchor_ns == BASE
    assert [(e.name, e.ts, e.dur, e.tid) for e in res.events] == [
        (n, BASE + t, d, tid) for n, t, d, tid in events
    ]


@SETTINGS
@given(events=x_events)
def test_legacy_kineto_absolute_microseconds_are_exact(events: list[tuple[str, int, int, int]]) -> None:
    epoch = 1_700_000_000_000_000_000
    raw = ",".join(_x_json(n, 5, tid, us(epoch + ts), us(dur)) for n, ts, dur, tid in events)
    res = format_for("torch").read(
        (f'{{"schemaVersion":1,"traceEvents":[{raw}]}}').encode(), ReadContext("f", "f")
    )
    assert [e.ts for e in res.events] == [epoch + ts for _, ts, _, _ in events]


@SETTINGS
@given(
    spans=st.lists(
        st.tuples(names, st.integers(10**18, 2**62 - 1), st.integers(0, 2**40)), min_size=1, max_size=20
    ),
    cut=st.integers(1, 60),
)
def test_rl_insight_log_exact_and_cut_last_line(spans: list[tuple[str, int, int]], cut: int) -> None:
    lines = [
        b'{"ph":"M","name":"thread_name","pid":3,"tid":1,"args":{"name":"RL-Insight \\u00b7 r","lane":"r"}}'
    ]
    lines += [
        json.dumps(
            {
                "ph": "X",
                "name": n,
                "pid": 3,
                "tid": 1,
                "ts": t / 1000,
                "dur": d / 1000,
                "ts_ns": t,
                "dur_ns": d,
            }
        ).encode()
        for n, t, d in spans
    ]
    whole = b"\n".join(lines) + b"\n"
    res = format_for("rl_insight").read(whole, ReadContext("f", "f"))
    assert [(e.name, e.ts, e.dur) for e in res.events] == spans and res.complete
    partial = whole[: -1 - min(cut, len(lines[-1]))]  # the writer died inside the last line
    res = format_for("rl_insight").read(partial, ReadContext("f", "f"))
    assert [(e.name, e.ts) for e in res.events] == [(n, t) for n, t, _ in spans[:-1]] and not res.complete
    # a time before 2001 (µs, ms or s where ns were due) is that line's invalid value: dropped, counted
    early = (
        whole
        + json.dumps({"ph": "X", "name": "x", "pid": 3, "tid": 1, "ts_ns": cut * 10**15}).encode()
        + b"\n"
    )
    res = format_for("rl_insight").read(early, ReadContext("f", "f"))
    assert [(e.name, e.ts) for e in res.events] == [(n, t) for n, t, _ in spans] and res.dropped == 1


# -------------------------------------------------------------------------------- timeline
flow_ids = st.lists(st.integers(1, 3), min_size=0, max_size=6)  # small ids: sources reuse them


def _proton_file(folder: Path, tp: int, seq: list[tuple[int, int]], ids: list[int]) -> list[tuple[str, int]]:
    """A Proton-shaped rank file; returns (name, ns) of its slices in file order."""
    events: list[dict[str, Any]] = []
    slices = []
    for k, (ts, tid) in enumerate(seq):
        name = f"tp{tp}-s{k}"
        events.append({"ph": "X", "name": name, "pid": 0, "tid": tid, "ts": float(us(ts * 1000)), "dur": 0.5})
        slices.append((name, BASE + ts * 1000))
    for k, fid in enumerate(ids):
        at = 10_000 + 10 * k
        events.append({"ph": "X", "name": f"tp{tp}-l{k}", "pid": 0, "tid": 1, "ts": at, "dur": 1.0})
        events.append({"ph": "X", "name": f"tp{tp}-k{k}", "pid": 0, "tid": 200007, "ts": at + 5, "dur": 1.0})
        events.append(
            {
                "ph": "s",
                "name": "launch->kernel",
                "cat": "flow",
                "pid": 0,
                "tid": 1,
                "ts": at,
                "id": fid,
                "bp": "e",
            }
        )
        events.append(
            {
                "ph": "f",
                "name": "launch->kernel",
                "cat": "flow",
                "pid": 0,
                "tid": 200007,
                "ts": at + 5,
                "id": fid,
                "bp": "e",
            }
        )
        slices += [(f"tp{tp}-l{k}", BASE + at * 1000), (f"tp{tp}-k{k}", BASE + (at + 5) * 1000)]
    doc = {"displayTimeUnit": "us", "baseTimeNanoseconds": BASE, "traceEvents": events}
    (folder / f"p-TP{tp}.proton.chrome_trace").write_text(json.dumps(doc))
    return slices


@SETTINGS
@given(
    ranks=st.lists(
        st.tuples(st.lists(st.tuples(st.integers(0, 9_000), st.sampled_from([1, 2])), max_size=15), flow_ids),
        min_size=1,
        max_size=3,
    )
)
def test_timeline_keeps_each_event_once_in_thread_order_with_unique_flow_ids(
    ranks: list[tuple[list[tuple[int, int]], list[int]]],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "node"
        folder.mkdir()
        expected: dict[int, list[tuple[str, int]]] = {}
        for tp, (seq, ids) in enumerate(ranks):
            expected[tp] = _proton_file(folder, tp, seq, ids)
        res = merge([tmp], str(Path(tmp) / "out.json"), MergeOptions(workers=0))
        assert res.exit_code == 0 or not any(expected.values())
        if not any(expected.values()):
            return
        out = json.loads((Path(tmp) / "out.json").read_text())
    base = out["rl_trace_observer"]["base_ns"]
    events = out["traceEvents"]
    got = [(e["name"], base + round(e["ts"] * 1000)) for e in events if e["ph"] == "X"]
    want = [s for tp in sorted(expected) for s in expected[tp]]
    assert sorted(got) == sorted(want)  # every event exactly once, at its exact ns
    per_thread: dict[tuple[int, int], list[str]] = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            per_thread[(e["pid"], e["tid"])].append(e["name"])
    for names_on_thread in per_thread.values():
        tp = int(names_on_thread[0].split("-")[0][2:])
        order = [n for n, _ in expected[tp] if n in set(names_on_thread)]
        assert names_on_thread == order  # per-thread order kept
        assert {n.split("-")[0] for n in names_on_thread} == {f"tp{tp}"}  # ranks never share a track
    ends: dict[int, list[str]] = defaultdict(list)
    for e in events:
        if e["ph"] in "sf" and e.get("cat") == "flow":
            ends[e["id"]].append(e["ph"])
    assert all(sorted(v) == ["f", "s"] for v in ends.values())  # no id shared by two flows
    assert len(ends) == sum(len(ids) for _, ids in ranks)


def perfetto_keeps(events: list[tuple[str, int, int, int]]) -> set[int]:
    """Which X events (indices) Perfetto's importer keeps, by brute force, written apart from the
    merger's stack (``nesting.victims``): per thread, in start order (the longer first on a tie, then
    file order), a slice stays when it ends inside every kept slice that is open when it starts."""
    kept: set[int] = set()
    for tid in {e[3] for e in events}:
        order = sorted(
            (i for i, e in enumerate(events) if e[3] == tid), key=lambda i: (events[i][1], -events[i][2], i)
        )
        mine: list[int] = []
        for i in order:
            _, ts, dur, _ = events[i]
            if all(
                ts + dur <= events[k][1] + events[k][2]
                for k in mine
                if events[k][1] <= ts < events[k][1] + events[k][2]
            ):
                mine.append(i)
        kept.update(mine)
    return kept


@SETTINGS
@given(
    files=st.lists(
        st.tuples(st.sampled_from(["torch", "viztracer", "proton"]), x_events), min_size=1, max_size=3
    ),
    flows=flow_ids,
)
def test_fast_path_equals_the_general_passes(
    files: list[tuple[str, list[tuple[str, int, int, int]]]], flows: list[int]
) -> None:
    """The fused loop (no filters) and the listed passes (a window covering all) agree byte for byte."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "node"
        folder.mkdir()
        contents: dict[bytes, list[tuple[str, int, int, int]]] = {}  # a file twice is merged once
        for n, (kind, events) in enumerate(files):
            name = {
                "torch": f"t{n}.pt.trace.json",
                "viztracer": f"v{n}.viztracer.json",
                "proton": f"p{n}-TP{n}.proton.chrome_trace",
            }[kind]
            raw = _chrome(kind, events, 0 if kind == "proton" else 77 + n)
            contents.setdefault(raw, events)
            (folder / name).write_bytes(raw)
        _proton_file(folder, 9, [], flows)
        fast = merge([tmp], str(Path(tmp) / "fast.json"), MergeOptions(workers=0))
        slow = merge([tmp], str(Path(tmp) / "slow.json"), MergeOptions(workers=0, time_window=(0, 4e9)))
        assert fast.usable == slow.usable
        if not fast.usable:  # no event at all: neither writes an output
            assert not (Path(tmp) / "fast.json").exists() and not (Path(tmp) / "slow.json").exists()
            return
        a = json.loads((Path(tmp) / "fast.json").read_text())["traceEvents"]
        b = json.loads((Path(tmp) / "slow.json").read_text())["traceEvents"]
    assert fast.manifest["counts"]["flows"] == slow.manifest["counts"]["flows"]
    assert a == b
    # both keep every slice (those Perfetto would drop on overlap tracks), plus the flow file's 2 per flow
    want = sum(len(events) for events in contents.values()) + 2 * len(flows)
    assert fast.manifest["counts"]["slices"] == sum(1 for e in a if e.get("ph") == "X") == want


dense = st.lists(
    st.tuples(st.just("s"), st.integers(0, 60), st.integers(0, 30), st.integers(1, 2)),
    min_size=1,
    max_size=25,
)


def _with_launch_ends(events: list[tuple[str, int, int, int]]) -> bytes:
    """A Kineto file of ``events`` where each slice is followed by a flow end (``bp: "e"``) at its start,
    as Kineto writes a kernel's ``ac2g`` end: id ``1000 + i`` for slice ``i``."""
    raw = []
    for i, (n, ts, dur, tid) in enumerate(events):
        raw.append(_x_json(n, 77, tid, us(ts), us(dur), f',"args":{{"i":{i}}}'))
        end = f'"id":{1000 + i},"pid":77,"tid":{tid},"ts":{us(ts)},"bp":"e"'
        raw.append(f'{{"ph":"f","cat":"ac2g","name":"ac2g",{end}}}')
    head = f'{{"schemaVersion":1,"deviceProperties":[],"baseTimeNanoseconds":{BASE},"traceEvents":['
    return (head + ",".join(raw) + "]}").encode()


@SETTINGS
@given(events=dense, order=st.sampled_from(["file", "start", "exit"]))
def test_overlapping_slices_move_to_overlap_tracks(
    events: list[tuple[str, int, int, int]], order: str
) -> None:
    """Dense, overlapping slices on two threads, in any order, start order (Kineto) or exit order
    (VizTracer), each with a flow end at its start: the fused path and the listed passes agree; every
    slice is written exactly once; each thread's own track keeps exactly what Perfetto's stack rule
    keeps (brute force, :func:`perfetto_keeps`), the rest sit on its overlap tracks; on every track the
    slices nest; and a flow end moves with its slice (the slice starting at its time, where only one does)."""
    if order == "start":
        events = sorted(events, key=lambda e: (e[1], -e[2]))
    elif order == "exit":
        events = sorted(events, key=lambda e: e[1] + e[2])
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "t.pt.trace.json").write_bytes(_with_launch_ends(events))
        fast = merge([tmp], str(Path(tmp) / "fast.json"), MergeOptions(workers=0))
        merge([tmp], str(Path(tmp) / "slow.json"), MergeOptions(workers=0, time_window=(0, 4e9)))
        a = json.loads((Path(tmp) / "fast.json").read_text())["traceEvents"]
        b = json.loads((Path(tmp) / "slow.json").read_text())["traceEvents"]
        threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in a if e.get("name") == "thread_name"}
    assert a == b
    written = [e for e in a if e.get("ph") == "X"]
    assert sorted(e["args"]["i"] for e in written) == list(range(len(events)))  # each exactly once
    assert fast.manifest["counts"]["slices"] == len(events)
    own = {f"Torch · thread {tid}": tid for tid in {e[3] for e in events}}
    home = {e["args"]["i"]: threads[(e["pid"], e["tid"])] for e in written}
    assert {i for i, name in home.items() if name in own} == perfetto_keeps(events)
    for i, name in home.items():  # the others beside their own thread, on a track named after it
        assert name in own or re.fullmatch(rf"Torch · thread {events[i][3]} \(overlap( \d+)?\)", name), name
    moved = len(events) - len(perfetto_keeps(events))
    assert fast.manifest["counts"].get("slices_on_overlap_tracks", 0) == moved
    for track in {(e["pid"], e["tid"]) for e in written}:  # every track nests (in integer ns)
        ends: list[int] = []
        spans = [
            (round(e["ts"] * 1000), round(e["dur"] * 1000)) for e in written if (e["pid"], e["tid"]) == track
        ]
        for ts, dur in sorted(spans, key=lambda s: (s[0], -s[1])):
            while ends and ends[-1] <= ts:
                ends.pop()
            assert not ends or ts + dur <= ends[-1]
            ends.append(ts + dur)
    starts = Counter((tid, ts) for _, ts, _, tid in events)
    for x, f in itertools.pairwise(a):  # each slice's flow end follows it, as written
        if x.get("ph") == "X" and f.get("ph") == "f":
            _, ts, _, tid = events[x["args"]["i"]]
            if starts[(tid, ts)] == 1:
                assert f["tid"] == x["tid"]


KEPT_SQL = (
    "select t.tid, t.name, extract_arg(s.arg_set_id, 'args.i') as i from slice s "
    "join thread_track tt on s.track_id = tt.id join thread t using(utid)"
)


@pytest.mark.perfetto
def test_the_brute_force_rule_is_what_perfetto_keeps(engine: Any, tmp_path: Path) -> None:
    """The oracle above, checked against the real engine: 80 random dense threads (any order, ties,
    zero durations) in one Kineto file. Opened as it is, Perfetto keeps exactly the slices
    ``perfetto_keeps`` names (and says it dropped the rest); merged, it imports with no error, keeps
    those on their own threads and every other slice on an overlap track beside its thread."""
    rng = random.Random(28)
    events: list[tuple[str, int, int, int]] = []
    for tid in range(1, 81):
        case = [("s", rng.randint(0, 60), rng.randint(0, 30), tid) for _ in range(rng.randint(1, 25))]
        order = rng.choice(["file", "start", "exit"])
        if order == "start":
            case.sort(key=lambda e: (e[1], -e[2]))
        elif order == "exit":
            case.sort(key=lambda e: e[1] + e[2])
        events += case
    want = perfetto_keeps(events)
    assert 0 < len(want) < len(events)  # some are dropped: the rule is exercised
    original = tmp_path / "in" / "t.pt.trace.json"
    original.parent.mkdir()
    original.write_bytes(_chrome("torch", events, 77))
    merged = merge([str(original.parent)], str(tmp_path / "merged.json"), MergeOptions(workers=0))
    for path in (original, Path(merged.output)):
        res = engine.load(path, [KEPT_SQL])
        assert res.loaded and (path == original or res.ok), res.summary()  # the original: drops stated
        rows = [(tid, name, int(i)) for tid, name, i in res.queries[0].rows if i is not None]
        own = {i for _, name, i in rows if not name or "(overlap" not in name}
        assert own == want, path.name
        lanes = {tid: {events[i][3] for t, _, i in rows if t == tid} for tid, _, _ in rows}
        assert all(len(v) == 1 for v in lanes.values())  # a track holds slices of one thread, as written
        if path != original:
            assert sorted(i for _, _, i in rows) == list(range(len(events)))  # and none is lost
            assert any("(overlap" in name for _, name, _ in rows)  # the rule is exercised


def _flows_file(slices: list[tuple[int, int, int]], flows: list[tuple[str, int, int]]) -> bytes:
    """A Kineto file: slices (ts, dur, tid) and v1 flow events (ph, ts, tid), all with id 7 + i."""
    raw = [
        _x_json("x", 77, tid, us(ts), us(dur), f',"args":{{"i":{i}}}')
        for i, (ts, dur, tid) in enumerate(slices)
    ]
    raw += [
        f'{{"ph":"{ph}","cat":"c","name":"n","id":{7 + i},"pid":77,"tid":{tid},"ts":{us(ts)},"bp":"e"}}'
        for i, (ph, ts, tid) in enumerate(flows)
    ]
    head = f'{{"schemaVersion":1,"deviceProperties":[],"baseTimeNanoseconds":{BASE},"traceEvents":['
    return (head + ",".join(raw) + "]}").encode()


@SETTINGS
@given(
    slices=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 30), st.integers(1, 3)), max_size=12),
    flows=st.lists(st.tuples(st.sampled_from("stf"), st.integers(0, 80), st.integers(1, 3)), max_size=12),
    flows_first=st.booleans(),
)
def test_flow_events_no_slice_takes_are_left_out_by_both_paths(
    slices: list[tuple[int, int, int]], flows: list[tuple[str, int, int]], flows_first: bool
) -> None:
    """A flow event with no slice of its thread starting at or before it is left out, counted, by the
    fused loop and the listed passes alike (wherever the file puts it); every other one is kept."""
    raw = _flows_file(slices, flows)
    if flows_first:  # the flow events before the slices in the file: judged at the end, not as they come
        doc = json.loads(raw)
        doc["traceEvents"] = [e for e in doc["traceEvents"] if e["ph"] != "X"] + [
            e for e in doc["traceEvents"] if e["ph"] == "X"
        ]
        raw = json.dumps(doc).encode()
    want = sum(1 for _, ts, tid in flows if not any(s <= ts and t == tid for s, _, t in slices))
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "t.pt.trace.json").write_bytes(raw)
        fast = merge([tmp], str(Path(tmp) / "fast.json"), MergeOptions(workers=0))
        slow = merge([tmp], str(Path(tmp) / "slow.json"), MergeOptions(workers=0, time_window=(0, 4e9)))
        if not slices:  # no slice: nothing a flow can bind to, so nothing is written
            assert fast.manifest["counts"].get("unbound_flow_events", 0) in (0, want)
            return
        a = json.loads((Path(tmp) / "fast.json").read_text())["traceEvents"]
        b = json.loads((Path(tmp) / "slow.json").read_text())["traceEvents"]
    assert a == b
    for res in (fast, slow):
        assert res.manifest["counts"].get("unbound_flow_events", 0) == want
        assert res.manifest["counts"]["flows"] == slow.manifest["counts"]["flows"]
    assert sum(1 for e in a if e["ph"] in "stf") == len(flows) - want


@SETTINGS
@given(
    times=st.lists(st.integers(0, 10**6), min_size=7, max_size=20),  # the file's own: the majority
    absurd=st.lists(st.sampled_from([-(10**17), 93 * 86_400 * 10**6, 70 * 365 * 86_400 * 10**6]), max_size=3),
)
def test_events_far_from_their_file_are_left_out_by_both_paths(times: list[int], absurd: list[int]) -> None:
    """Events of one file within a second, plus a few at absurd times (3 years before, 93 days on, 70
    years on): exactly the absurd ones are left out (counted), by the fused loop and the listed passes
    alike, and the timeline starts where the rest does."""
    events = [("x", t * 1000, 1000, 1) for t in times] + [
        ("far", BASE_FAR + a * 1000, 1000, 1) for a in absurd
    ]
    raw = ",".join(_x_json(n, 77, tid, us(ts), us(dur)) for n, ts, dur, tid in events)
    doc = f'{{"schemaVersion":1,"deviceProperties":[],"baseTimeNanoseconds":{BASE},"traceEvents":[{raw}]}}'
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "t.pt.trace.json").write_text(doc)
        fast = merge([tmp], str(Path(tmp) / "fast.json"), MergeOptions(workers=0))
        slow = merge([tmp], str(Path(tmp) / "slow.json"), MergeOptions(workers=0, time_window=(0, 4e9)))
        a = json.loads((Path(tmp) / "fast.json").read_text())["traceEvents"]
        b = json.loads((Path(tmp) / "slow.json").read_text())["traceEvents"]
    assert a == b and sorted(e["name"] for e in a if e["ph"] == "X") == ["x"] * len(times)
    for res in (fast, slow):
        art = res.manifest["artifacts"][0]["events"]
        assert (art["kept"], art["dropped"]) == (len(times), len(absurd))
        assert res.manifest["timeline"]["start_ns"] == BASE + min(times) * 1000
