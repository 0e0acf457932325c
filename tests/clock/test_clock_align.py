"""The merge-side clock plan and causality checks, on hand-built process records and events."""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trace_observer.common.clock_offsets import OffsetPoint
from rl_trace_observer.merge.clock.causality import (
    MAX_DETAILED,
    check_durations,
    check_nesting,
    check_stage_alignment,
)
from rl_trace_observer.merge.clock.hosts import IDENTITY, plan
from rl_trace_observer.merge.clock.model import Correction

from ..conftest import clean_env, run_python

T = 1_780_000_000_000_000_000
S = 1_000_000_000  # one second in ns
MS = 1_000_000


def record(
    host: str, pid: int, offsets: Sequence[Any] = (), snaps: Sequence[dict[str, Any]] = ()
) -> dict[str, Any]:
    return {
        "schema": "rl-trace-process/1",
        "hostname": host,
        "pid": pid,
        "clock_offsets": list(offsets),
        "clock_snapshots": list(snaps),
    }


def meas(wall: int, offset: int, unc: int = 100_000, ref: str = "ref:1", **extra: Any) -> dict[str, Any]:
    return {
        "reference": ref,
        "method": "ray_ntp",
        "offset_ns": offset,
        "uncertainty_ns": unc,
        "round_trip_ns": 2 * unc,
        "rounds": 4,
        "wall_ns": wall,
        **extra,
    }


REF = record("ref", 1, [{"reference": "ref:1", "method": "reference", "offset_ns": 0, "uncertainty_ns": 0}])


def snap(reason: str, wall: int, mono: int, **extra: Any) -> dict[str, Any]:
    return {"reason": reason, "wall_ns": wall, "mono_ns": mono, "perf_ns": mono, "read_ns": 100, **extra}


# ------------------------------------------------------------------------ plan
def test_empty_and_single_host_need_nothing() -> None:
    cp = plan([])
    assert cp.mode == "wall" and cp.problems == [] and cp.manifest_section()["hosts"] == {}
    assert cp.correction_for("x", 1) is IDENTITY and cp.worst_uncertainty_ns is None
    one = plan([record("solo", 5, snaps=[snap("start", T, 10)])])
    assert one.problems == [] and one.manifest_section()["hosts"]["solo"]["method"] == "unmeasured"
    assert one.host_label("solo") == "clock unmeasured"


def test_unmeasured_hosts_are_problems() -> None:
    cp = plan([record("a", 1), record("b", 2)], mode="aligned")
    assert {p["host"] for p in cp.problems if "not measured" in p["detail"]} == {"a", "b"}
    assert any("no host has clock measurements" in p["detail"] for p in cp.problems)
    cp = plan([REF, record("a", 2, [meas(T, 5_000_000)]), record("c", 3)])
    assert cp.mode == "aligned" and cp.unmeasured_hosts == ["c"]
    assert cp.trace_metadata()["clock_unmeasured_hosts"] == ["c"]
    assert [p["host"] for p in cp.problems] == ["c"] and all(p["kind"] == "clock" for p in cp.problems)


def test_constant_offset_correction_and_what_the_trace_states() -> None:
    cp = plan([REF, record("a", 2, [meas(T, 37_000_000, 150_000)]), record("a", 3)])
    fix = cp.correction_for("a", 3)  # a process with no measurement of its own: its host's
    assert fix.constant_ns == 37_000_000 and fix(T + 37_000_000) == T
    assert cp.correction_for("ref") is IDENTITY or cp.correction_for("ref")(T) == T
    section = cp.manifest_section()
    a = section["hosts"]["a"]
    assert a["method"] == "ray_ntp" and a["offset_ns"] == 37_000_000 and a["uncertainty_ns"] == 150_000
    assert a["samples"] == 1 and a["drift_ppm"] is None and a["applied"] and a["processes"] == [2]
    assert section["reference"] == {"host": "ref", "pid": 1} and section["worst_uncertainty_ns"] == 150_000
    assert section["hosts"]["ref"]["method"] == "reference" and section["hosts"]["ref"]["offset_ns"] == 0
    assert cp.trace_metadata() == {
        "clock_alignment": "aligned",
        "clock_reference_host": "ref",
        "clock_worst_uncertainty_ns": 150_000,
        "clock_unmeasured_hosts": [],
        "clock_tolerance_ns": 1_000_000,
    }
    assert cp.host_args("a")["clock_offset_ns"] == 37_000_000 and cp.host_args("a")["clock_applied"]
    assert cp.host_label("a") == "clock +37.000 ms ±0.150 ms"
    assert cp.host_label("ref") == "clock reference"
    assert cp.host_args("nowhere") == {"clock_method": "unmeasured", "clock_applied": False}
    assert cp.problems == []


def test_drift_between_bracketing_measurements_and_beyond_them() -> None:
    # 50 ppm: +50 µs per second, measured at 0 s and 10 s (±100 µs): slopes 30-70 ppm fit both.
    cp = plan([REF, record("d", 2, [meas(T, 1_000_000), meas(T + 10 * S, 1_500_000)])])
    fix = cp.correction_for("d")
    assert fix(T) == T - 1_000_000 and fix.offset_at(T) == (1_000_000, 100_000)
    assert fix(T + 4 * S) == T + 4 * S - 1_200_000  # interpolated inside the bracket
    # + 2·1 ppm·4 s·6 s/10 s for a drift wandering within the allowance (1 ppm)
    assert fix.offset_at(T + 4 * S)[1] == 100_001 + 4_800
    # Outside: carried on with the fitted 50 ppm; the bound grows by (72 − 50) ppm per second (the
    # slopes the measurements allow, widened by twice the allowance).
    assert fix(T - S) == T - S - 950_000
    assert 122_000 <= fix.offset_at(T - S)[1] <= 122_002
    assert fix(T + 20 * S) == T + 20 * S - 2_000_000
    assert 320_000 <= fix.offset_at(T + 20 * S)[1] <= 320_002
    assert fix.bound_over(T - S, T + 20 * S) == fix.offset_at(T + 20 * S)[1]
    assert fix.bound_over(T, T + 10 * S) == fix.uncertainty_ns == 100_001 + 5_000  # the gap's middle
    host = cp.manifest_section()["hosts"]["d"]
    assert host["drift_ppm"] == pytest.approx(50, abs=1e-6) and host["drift_consistent"]
    assert host["drift_range_ppm"][0] <= 50 <= host["drift_range_ppm"][1]
    assert host["offset_range_ns"] == [1_000_000, 1_500_000]
    assert host["measured_range_ns"] == [T, T + 10 * S] and host["uncertainty_ns"] == 105_001
    (ex,) = host["extrapolation"]
    assert ex["fitted"] and ex["drift_ppm"] == pytest.approx(50) and ex["drift_range_ppm"] == [28.0, 72.0]
    assert host["ranges"] == []  # no process record says when this host's data lies


@settings(max_examples=200, deadline=None)
@given(
    first=st.integers(-(10**9), 10**9),
    ppms=st.lists(st.integers(-1000, 1000), min_size=0, max_size=5),
    gaps=st.lists(st.integers(1, 100 * S), min_size=6, max_size=6),
    jumps=st.sets(st.integers(0, 4)),
    probes=st.lists(
        st.one_of(st.integers(-50 * S, 700 * S), st.sampled_from([0, 1, 100 * S, 100 * S + 1])),
        min_size=2,
        max_size=8,
    ),
)
def test_corrections_keep_event_order_and_travel_to_workers(
    first: int, ppms: list[int], gaps: list[int], jumps: set[int], probes: list[int]
) -> None:
    """Offsets drift by up to 1000 ppm between measurements (real oscillators: under 100). The
    correction never reverses the order of two events (except across a jump, where it cannot
    know better), survives pickling unchanged, and its worst bound over a range is the worst of
    every timestamp in it."""
    walls, offsets = [T], [first]
    for ppm, gap in zip(ppms, gaps, strict=False):
        walls.append(walls[-1] + gap)
        offsets.append(offsets[-1] + gap * ppm // 1_000_000)
    breaks = frozenset(j for j in jumps if j < len(walls) - 1)
    corr = Correction([OffsetPoint(w, o, 1000) for w, o in zip(walls, offsets, strict=True)], breaks)
    shipped = pickle.loads(pickle.dumps(corr))  # corrections travel to merge worker processes
    ts_sorted = sorted(T + p for p in probes)
    for ts in ts_sorted:
        assert shipped(ts) == corr(ts) == ts - corr.offset_at(ts)[0]  # the fast path is the same
        assert shipped.offset_at(ts) == corr.offset_at(ts)
        if corr.constant_ns is not None:
            assert ts - corr.constant_ns == corr(ts)
        assert abs(corr.host_time(corr(ts)) - ts) <= 2
    if not breaks:
        fixed = [corr(ts) for ts in ts_sorted]
        assert fixed == sorted(fixed)
    lo, hi = ts_sorted[0], ts_sorted[-1]
    assert all(corr.offset_at(ts)[1] <= corr.bound_over(lo, hi) for ts in ts_sorted)
    assert corr.bound_over(lo, hi) in {corr.offset_at(t)[1] for t in _bound_candidates(corr, lo, hi)}


def _bound_candidates(corr: Correction, lo: int, hi: int) -> list[int]:
    mids = [(a.wall_ns + b.wall_ns) // 2 + k for a, b in itertools.pairwise(corr.points) for k in (0, 1)]
    return [lo, hi, *(min(max(m, lo), hi) for m in mids)]


def test_measurements_over_tolerance_are_left_out_when_better_exist() -> None:
    recs = [REF, record("n", 2, [meas(T, 10_000_000, 50_000), meas(T + S, 10_000_000, 40_000_000)])]
    cp = plan(recs, tolerance_us=1000)
    assert cp.correction_for("n").points == [OffsetPoint(T, 10_000_000, 50_000)]
    assert cp.problems == []
    bad = plan([REF, record("n", 2, [meas(T, 10_000_000, 4_000_000)])], tolerance_us=1000)
    assert bad.correction_for("n").constant_ns == 10_000_000  # still the best we know
    assert any("±4000 µs, over the tolerance of 1000 µs" in p["detail"] for p in bad.problems)
    assert not plan([REF, record("n", 2, [meas(T, 10_000_000, 4_000_000)])], tolerance_us=5000).problems


def test_wall_mode_keeps_raw_times_and_says_which_hosts_are_off() -> None:
    recs = [REF, record("a", 2, [meas(T, 37_000_000)]), record("b", 3, [meas(T, 200_000, 100_000)])]
    cp = plan(recs, mode="wall")
    assert cp.mode == "wall" and cp.correction_for("a", 2)(T) == T
    assert [p["host"] for p in cp.problems] == ["a"]  # b is off by 0.2 ± 0.1 ms: within 1 ms
    assert "--clock aligned" in cp.problems[0]["detail"]
    assert cp.manifest_section()["hosts"]["a"]["applied"] is False
    assert cp.host_label("a").startswith("clock raw, off +37.000 ms")
    assert cp.worst_uncertainty_ns == 37_100_000  # raw placement is off by the whole offset
    assert plan(recs, mode="aligned").worst_uncertainty_ns == 100_000


def test_jump_inside_a_profiled_window_is_a_problem_outside_is_not() -> None:
    step = [snap("step_begin", T, 1000, step=1), snap("step_end", T + S, 1000 + S, step=1)]
    jumped = snap("artifact", T + 2 * S - 300_000_000, 1000 + 2 * S)  # 300 ms back, after the step
    cp = plan([REF, record("h", 2, [meas(T, 0)], [snap("start", T - S, 1000 - S), *step, jumped])])
    (j,) = cp.manifest_section()["hosts"]["h"]["jumps"]
    assert not j["inside_profiled_window"] and j["jump_ns"] == -300_000_000
    assert cp.problems == []
    inside = [step[0], snap("artifact", T + S // 2 + 5_000_000, 1000 + S // 2), step[1]]
    cp = plan([REF, record("h", 2, [meas(T, 0)], inside)])
    assert len(cp.problems) == 2 and all("inside a profiled window" in p["detail"] for p in cp.problems)
    # An unfinished step (process killed) is open-ended; no windows at all is treated as inside.
    cp = plan([REF, record("h", 2, [meas(T, 0)], [step[0], jumped])])
    assert any("profiled window" in p["detail"] for p in cp.problems)
    cp = plan([REF, record("h", 2, [meas(T, 0)], [snap("start", T, 0), snap("artifact", T + 5 * S, S)])])
    assert cp.manifest_section()["hosts"]["h"]["profiled_windows_known"] is False
    assert any("profiled window" in p["detail"] for p in cp.problems)


def test_no_drift_line_across_a_jump() -> None:
    offs = [meas(T, 0, mono_ns=100), meas(T + 10 * S, 250_000_000, mono_ns=100 + 10 * S - 250_000_000)]
    snaps = [snap("a", T, 100), snap("b", T + 10 * S, 100 + 10 * S - 250_000_000)]
    fix = plan([REF, record("h", 2, offs, snaps)]).correction_for("h")
    assert fix.breaks == frozenset({0})
    assert fix(T + S) == T + S  # nearer the first measurement: its offset, not 25 ms of invented drift
    assert fix(T + 9 * S) == T + 9 * S - 250_000_000
    # Each side is one measurement: no drift known, so its bound grows by 500 ppm towards the jump.
    assert fix.offset_at(T + S) == (0, 100_000 + 500_000 + 1)


def test_each_side_of_a_jump_has_its_own_drift() -> None:
    """Two measurements on each side of a +250 ms step, drifting 50 ppm: a drift per side, carried
    on outside the measured range and up to the middle of the jump's bracket, never across it."""
    pts = [
        OffsetPoint(T + i * 10 * S, 50_000 * 10 * i + (250 * MS if i >= 2 else 0), 10_000) for i in range(4)
    ]
    # a too-close pair (1 µs apart, 5 µs apart in offset) is combined into one point first
    close = OffsetPoint(T + 10 * S + 1_000, 500_000 + 5_000, 20_000)
    corr = Correction([*pts, close], frozenset({2}))  # bracket 2 (after the close pair is combined)
    assert len(corr.points) == 4 and corr.breaks == frozenset({1})
    before, after = corr.extrapolations
    assert before.fitted and after.fitted
    assert before.drift == pytest.approx(50e-6) and after.drift == pytest.approx(50e-6)
    assert corr(T - 10 * S) == T - 10 * S + 500_000  # the first side's drift, backwards
    assert corr(T + 12 * S) == T + 12 * S - 600_000  # the jump's bracket, nearer side: carried on
    assert corr(T + 18 * S) == T + 18 * S - (250 * MS + 900_000)
    assert corr(T + 40 * S) == T + 40 * S - (250 * MS + 2_000_000)  # the last side's drift


def test_malformed_and_foreign_reference_entries() -> None:
    junk: list[Any] = [
        "nope",
        {"offset_ns": "1", "uncertainty_ns": 1, "wall_ns": T, "reference": "ref:1"},
        {"offset_ns": 1, "uncertainty_ns": -1, "wall_ns": T, "reference": "ref:1"},
        {"offset_ns": 1, "uncertainty_ns": 1, "wall_ns": T},  # no reference
        {"offset_ns": True, "uncertainty_ns": 1, "wall_ns": T, "reference": "ref:1"},
    ]
    recs: list[Any] = [
        REF,
        record("a", 2, [*junk, meas(T, 7)]),
        {"hostname": 5, "clock_offsets": [1, 2]},
        "x",
    ]
    cp = plan(recs)
    assert cp.correction_for("a").constant_ns == 7
    assert any("7 malformed clock_offsets entries" in p["detail"] for p in cp.problems)
    other = plan([REF, record("a", 2, [meas(T, 7)]), record("b", 3, [meas(T, 9, ref="elsewhere:4")])])
    assert other.reference_host == "ref"
    assert any("several reference hosts (elsewhere besides ref)" in p["detail"] for p in other.problems)
    assert other.manifest_section()["hosts"]["b"]["method"] == "unmeasured"


def test_reference_known_only_from_measurements_and_per_process_clocks() -> None:
    # The reference process wrote no record; two processes on host "t" each measured their own clock.
    cp = plan([record("t", 2, [meas(T, 1_000_000)]), record("t", 3, [meas(T, 3_000_000)])])
    assert cp.reference_host == "ref" and cp.reference_pid == 1
    assert cp.correction_for("t", 2).constant_ns == 1_000_000
    assert cp.correction_for("t", 3).constant_ns == 3_000_000
    assert cp.manifest_section()["hosts"]["t"]["processes"] == [2, 3]


def test_merge_side_imports_no_framework() -> None:
    code = (
        "import sys, rl_trace_observer.merge.clock.hosts, rl_trace_observer.merge.clock.causality\n"
        "bad = [m for m in ('ray', 'torch', 'verl') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    run_python(code, clean_env())


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="clock mode"):
        plan([], mode="fuzzy")
    with pytest.raises(ValueError, match="tolerance"):
        plan([], tolerance_us=-1)


# ------------------------------------------------------------------- causality
def x(name: str, start: int, dur: int, pid: int = 1, tid: int = 1) -> dict[str, Any]:
    return {"ph": "X", "name": name, "pid": pid, "tid": tid, "ts_ns": start, "dur_ns": dur}


def test_durations_and_nesting() -> None:
    assert check_durations([]).checked == 0
    rep = check_durations([x("ok", 0, 5), x("bad", 10, -3), {"ph": "i", "ts_ns": 1}])
    assert (rep.checked, rep.failed) == (2, 1) and "negative duration" in rep.problems[0]["detail"]
    good = [x("p", 0, 100), x("c", 10, 20), x("c2", 40, 60), x("sib", 100, 10), x("other", 5, 500, tid=2)]
    rep = check_nesting(good, 0)
    assert (rep.checked, rep.failed) == (2, 0)
    rep = check_nesting([x("p", 0, 100_000), x("c", 50_000, 60_000)], 0)
    assert rep.failed == 1 and "ends 10.0 µs after it" in rep.problems[0]["detail"]
    assert check_nesting([x("p", 0, 100_000), x("c", 50_000, 60_000)], 10_000).failed == 0  # within tolerance


def test_stage_alignment_between_sources() -> None:
    spans = [x("actor_update", 1000 * S, 2 * S), x("train_batch", 990 * S, 20 * S)]
    torch_ok = [x("actor_update", 1000 * S + 5_000, 2 * S - 10_000, tid=7), x("unrelated", 0, 5)]
    rep = check_stage_alignment(spans, torch_ok, 1_000_000)
    assert (rep.checked, rep.failed) == (1, 0)
    torch_off = [x("actor_update", 1000 * S + 157_000_000, 2 * S - 10_000, tid=7)]
    rep = check_stage_alignment(spans, torch_off, 1_000_000)
    assert rep.failed == 1 and "156990.0 µs apart" in rep.problems[0]["detail"]
    strict = check_stage_alignment(spans, torch_ok, 1_000, edges=True)
    assert strict.failed == 1  # nested, but the ends are 5 µs apart: too far for edge matching
    assert check_stage_alignment([], torch_off, 0).checked == 0


def test_many_failures_are_summarised_and_folded_into_the_plan() -> None:
    events = [x(f"e{i}", i * 10, -1) for i in range(MAX_DETAILED + 5)]
    rep = check_durations(events, path="t.json")
    assert rep.failed == MAX_DETAILED + 5 and len(rep.problems) == MAX_DETAILED + 1
    cp = plan([])
    cp.add_causality(rep)
    assert cp.manifest_section()["causality"] == {"checked": MAX_DETAILED + 5, "failed": MAX_DETAILED + 5}
    assert len(cp.problems) == MAX_DETAILED + 1 and cp.problems[0]["path"] == "t.json"
