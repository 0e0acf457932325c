"""The synthetic TokenSpeed writer: files shaped like the real VizTracer/Proton outputs, deterministic."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trace_observer.testing.perfetto import engine as pe
from rl_trace_observer.testing.tokenspeed import (
    GPU_LANE_BASE,
    MIN_DURATION_US,
    RankFiles,
    TokenSpeedSpec,
    rank_tag,
    write_profile,
)


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = orjson.loads(path.read_bytes())
    return data


def abs_ns(base: int, ts_us: float) -> int:
    return base + round(ts_us * 1000)


def scope_pairs(rank: RankFiles) -> list[tuple[int, int, int]]:
    """(scope_id, VizTracer flow start, Proton scope start) in absolute ns as the files place them."""
    viz = load(rank.viztracer)
    vbase = viz["viztracer_metadata"]["baseTimeNanoseconds"]
    starts = {e["id"]: abs_ns(vbase, e["ts"]) for e in viz["traceEvents"] if e["ph"] == "s"}
    pairs = []
    for part in rank.proton:
        doc = load(part)
        for e in doc["traceEvents"]:
            if e.get("cat") == "scope":
                sid = e["args"]["scope_id"]
                pairs.append((sid, starts[sid], abs_ns(doc["baseTimeNanoseconds"], e["ts"])))
    return pairs


def check_rank(rank: RankFiles, spec: TokenSpeedSpec) -> None:
    """Everything the module docstring promises about one rank's files."""
    viz = load(rank.viztracer)
    assert list(viz) == ["traceEvents", "viztracer_metadata", "file_info"]
    assert isinstance(viz["viztracer_metadata"]["baseTimeNanoseconds"], int)
    slices = [e for e in viz["traceEvents"] if e["ph"] == "X"]
    assert all(e["cat"] == "FEE" and re.fullmatch(r".+ \(.+\.py:\d+\)", e["name"]) for e in slices)
    assert all(e["dur"] >= MIN_DURATION_US for e in slices)
    ends = [e["ts"] + e["dur"] for e in slices]
    assert ends == sorted(ends)  # written on exit: children before parents
    flows = [e for e in viz["traceEvents"] if e["ph"] == "s"]
    assert {(e["name"], e["cat"], e["bp"]) for e in flows} == {
        ("viztracer->proton", "tokenspeed.proton", "e")
    }
    assert len(flows) == rank.scope_links and not [e for e in viz["traceEvents"] if e["ph"] == "f"]

    scope_ids: list[int] = []
    for number, part in enumerate(rank.proton):
        raw = part.read_bytes()
        doc = orjson.loads(raw)
        assert raw.endswith(b"]}\n") and list(doc) == sorted(doc)
        assert ("baseTimeNanoseconds" in doc) is spec.anchored and doc["displayTimeUnit"] == "us"
        if spec.flush_parts > 1:
            assert part.name == f"{spec.profile_id}-{rank.tag}.proton.part_{number}.chrome_trace"
        events = doc["traceEvents"]
        assert {e["pid"] for e in events} == {0}
        assert all(list(e) == sorted(e) for e in events)
        names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
        assert names[rank.pid] == f"CPU Thread {rank.pid}"
        assert all(names[GPU_LANE_BASE + s] == f"GPU Stream {s}" for s in spec.streams)
        kinds = [e.get("cat", "meta") for e in events]
        assert kinds == sorted(kinds, key=["meta", "scope", "flow", "kernel"].index)  # Proton's dump order
        scopes = {e["args"]["scope_id"]: e for e in events if e.get("cat") == "scope"}
        kernels = [e for e in events if e.get("cat") == "kernel"]
        assert min(e["ts"] for e in events if "ts" in e) == 0.0  # µs since the dump's first event
        for s, f in zip(events[kinds.index("flow") :: 2], events[kinds.index("flow") + 1 :: 2], strict=False):
            if s.get("cat") != "flow":
                break
            assert (s["ph"], f["ph"], s["id"], s["name"]) == ("s", "f", f["id"], "launch->kernel")
            scope = scopes[s["id"]]
            assert (s["tid"], s["ts"]) == (rank.pid, scope["ts"]) and f["tid"] >= GPU_LANE_BASE
            assert f["ts"] > scope["ts"] and any(k["ts"] == f["ts"] and k["tid"] == f["tid"] for k in kernels)
        scope_ids += list(scopes)
    assert scope_ids == list(range(len(scope_ids)))  # launch/scope ids restart at 0 in every process


def test_names_follow_tokenspeed(tmp_path: Path) -> None:
    assert rank_tag(0) == "TP0"
    assert rank_tag(3, dp=1, cp=2, stage="DECODE") == "DP1-CP2-TP3-DECODE"
    spec = TokenSpeedSpec(profile_id="run7", ranks=2, dp_rank=1, stage="EXTEND", events_per_rank=200)
    files = write_profile(tmp_path, spec)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "run7-DP1-TP0-EXTEND.proton.chrome_trace",
        "run7-DP1-TP0-EXTEND.viztracer.json",
        "run7-DP1-TP1-EXTEND.proton.chrome_trace",
        "run7-DP1-TP1-EXTEND.viztracer.json",
    ]
    for rank in files:
        check_rank(rank, spec)


def test_flow_and_scope_ids_are_reused_across_ranks(tmp_path: Path) -> None:
    ranks = write_profile(tmp_path, TokenSpeedSpec(ranks=3, events_per_rank=300))
    ids = [{e["id"] for e in load(r.proton[0])["traceEvents"] if e.get("cat") == "flow"} for r in ranks]
    assert ids[0] == ids[1] == ids[2] and 0 in ids[0]


def test_deterministic_by_seed(tmp_path: Path) -> None:
    def contents(seed: int, where: str) -> list[bytes]:
        files = write_profile(tmp_path / where, TokenSpeedSpec(seed=seed, events_per_rank=300))
        return [p.read_bytes() for r in files for p in (r.viztracer, *r.proton)]

    assert contents(1, "a") == contents(1, "b")
    assert contents(1, "a") != contents(2, "c")


@pytest.mark.parametrize("offset_us", [40.0, -25.0, 0.0])
def test_injected_proton_clock_error_is_in_the_files(tmp_path: Path, offset_us: float) -> None:
    (rank,) = write_profile(tmp_path, TokenSpeedSpec(ranks=1, proton_offsets_us=(offset_us,)))
    gaps = [proton - viz for _, viz, proton in scope_pairs(rank)]
    # TokenSpeed takes its VizTracer timestamp 0.4-1.5 µs before entering the Proton scope.
    assert all(400 <= gap - rank.proton_offset_ns <= 1500 for gap in gaps)
    assert rank.proton_offset_ns == round(offset_us * 1000)
    late = sum(gap < 0 for gap in gaps)  # flows Perfetto would drop: the end lands before the start
    assert late == (len(gaps) if offset_us < -1.5 else 0)


def test_drift_grows_over_the_run_and_parts_have_own_anchors(tmp_path: Path) -> None:
    spec = TokenSpeedSpec(ranks=1, steps=6, flush_parts=3, proton_drift_ppm=200.0, events_per_rank=3000)
    (rank,) = write_profile(tmp_path, spec)
    assert len(rank.proton) == 3 and len(set(rank.proton_base_ns)) == 3
    pairs = scope_pairs(rank)
    first, last = pairs[0], pairs[-1]
    elapsed = last[1] - first[1]
    growth = (last[2] - last[1]) - (first[2] - first[1])
    assert abs(growth - elapsed * 200e-6) < 1200  # the slope is the drift, within the 0.4-1.5 µs jitter
    check_rank(rank, spec)


def test_unanchored_upstream_proton(tmp_path: Path) -> None:
    spec = TokenSpeedSpec(ranks=1, anchored=False, events_per_rank=200)
    (rank,) = write_profile(tmp_path, spec)
    assert rank.proton_base_ns == (None,) and "baseTimeNanoseconds" not in load(rank.proton[0])
    check_rank(rank, spec)


@settings(max_examples=25, deadline=None)
@given(
    ranks=st.integers(1, 3),
    steps=st.integers(1, 5),
    events=st.integers(10, 800),
    parts=st.integers(1, 3),
    anchored=st.booleans(),
    streams=st.sampled_from([(7,), (7, 9)]),
    seed=st.integers(0, 2**16),
)
def test_structure_holds_for_any_spec(
    ranks: int, steps: int, events: int, parts: int, anchored: bool, streams: tuple[int, ...], seed: int
) -> None:
    spec = TokenSpeedSpec(
        ranks=ranks,
        steps=steps,
        events_per_rank=events,
        flush_parts=min(parts, steps),
        anchored=anchored,
        streams=streams,
        seed=seed,
    )
    with tempfile.TemporaryDirectory() as tmp:
        for rank in write_profile(tmp, spec):
            check_rank(rank, spec)
            assert rank.events == sum(len(load(p)["traceEvents"]) for p in (rank.viztracer, *rank.proton))
        assert not [p for p in Path(tmp).iterdir() if p.name.endswith(".tmp")]


@pytest.mark.perfetto
def test_perfetto_reads_each_file_and_sees_the_reused_ids(tmp_path: Path) -> None:
    reason = pe.unavailable_reason()
    if reason:
        pytest.skip(reason)
    ranks = write_profile(tmp_path, TokenSpeedSpec(ranks=2, events_per_rank=600))
    merged = tmp_path / "naive.json"
    both = [e for r in ranks for e in load(r.proton[0])["traceEvents"]]
    merged.write_bytes(orjson.dumps({"traceEvents": both}))
    with pe.Engine() as engine:
        for rank in ranks:
            proton = engine.load(rank.proton[0])
            assert proton.ok and proton.flows == rank.launch_flows, proton.summary()
            assert proton.slices == 2 * rank.launch_flows
            viz = engine.load(rank.viztracer)
            assert viz.ok and viz.slices == sum(
                1 for e in load(rank.viztracer)["traceEvents"] if e["ph"] == "X"
            )
        naive = engine.load(merged)
        assert naive.stat("flow_duplicate_id") > 0  # both ranks are pid 0 with the same launch ids
