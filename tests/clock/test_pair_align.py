"""Per-artifact alignment inside one process (merge.clock.pairs, merge.clock.pair_events).

Ground truth comes from the synthetic TokenSpeed writer (``RankFiles.proton_offset_ns`` and the
drift it injected) and from hand-built pairs with known offsets and partner delays.
"""

from __future__ import annotations

import json
import pickle
import random
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trace_observer.common.clock_offsets import OffsetPoint
from rl_trace_observer.merge.clock.model import Correction
from rl_trace_observer.merge.clock.pair_events import (
    match_keyed,
    proton_scope_starts,
    scan_viztracer_scope_starts,
    stage_pairs,
    tokenspeed_pairs,
    viztracer_scope_starts,
)
from rl_trace_observer.merge.clock.pairs import (
    AFTER,
    BEFORE,
    MIN_DRIFT_PAIRS,
    Pair,
    PairCorrection,
    align_pairs,
    chain,
)
from rl_trace_observer.testing.tokenspeed import TokenSpeedSpec, write_profile

from ..conftest import clean_env, need, run_python

T0 = 1_767_225_600_000_000_000
US = 1_000
MS = 1_000_000


def load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = orjson.loads(path.read_bytes())
    return doc


def align(pairs: list[Pair], **kw: Any) -> Any:
    return align_pairs(pairs, artifact="b.proton.chrome_trace", partner="b.viztracer.json", pairing="t", **kw)


def slack(p: Pair, corr: Any) -> int:
    b = corr(p.b_ns)
    return b - p.a_ns if p.order == AFTER else p.a_ns - b


# ----------------------------------------------------------------------------------- TokenSpeed files
@pytest.mark.parametrize("drift_ppm", [0.0, 200.0, -150.0])
def test_recovers_injected_proton_errors_within_the_residual(tmp_path: Path, drift_ppm: float) -> None:
    spec = TokenSpeedSpec(
        ranks=3, steps=6, events_per_rank=6000, proton_offsets_us=(40, -25, 0), proton_drift_ppm=drift_ppm
    )
    for rank in write_profile(tmp_path, spec):
        pairs = tokenspeed_pairs(load(rank.viztracer), load(rank.proton[0]))
        assert len(pairs) == rank.scope_links
        res = align(pairs)
        rec, corr = res.record, res.correction
        assert corr is not None and rec["applied"] and not res.problems, res.problems
        assert rec["pairs"] == rank.scope_links and rec["acausal_pairs"] == 0 and rec["outliers"] == 0
        # the truth: Proton's clock is off by offset + drift × (true time − start); true ≈ the VizTracer time
        for p in pairs:
            truth = rank.proton_offset_ns + drift_ppm * 1e-6 * (p.a_ns - spec.start_wall_ns)
            assert abs(corr.offset_at(p.b_ns) - truth) <= rec["residual_ns"]
            assert corr(p.b_ns) > p.a_ns  # every flow ends after it starts
        assert 0 < rec["residual_ns"] <= 1500  # TokenSpeed's scope entry jitter is 0.4-1.5 µs
        if drift_ppm:
            assert rec["method"] == "pairs_tight_drift" and abs(rec["drift_ppm"] - drift_ppm) < 2
        else:
            assert rec["method"] == "pairs_tight" and rec["offset_ns"] == corr.constant_ns
        raw_late = sum(p.b_ns < p.a_ns for p in pairs)
        assert rec["raw_acausal_pairs"] == raw_late
        if not drift_ppm:  # with drift the rank injected 0 µs drifts late, too
            assert raw_late == (len(pairs) if rank.proton_offset_ns < 0 else 0)


def test_every_proton_part_aligns_on_its_own(tmp_path: Path) -> None:
    spec = TokenSpeedSpec(ranks=1, steps=6, flush_parts=3, proton_offsets_us=(-30,), events_per_rank=3000)
    (rank,) = write_profile(tmp_path, spec)
    viz = load(rank.viztracer)
    total = 0
    for part in rank.proton:
        pairs = tokenspeed_pairs(viz, load(part))
        res = align(pairs)
        assert res.correction is not None and abs(res.record["offset_ns"] - rank.proton_offset_ns) <= 1500
        total += len(pairs)
    assert total == rank.scope_links


def test_byte_scan_finds_the_same_flow_starts_as_a_full_parse(tmp_path: Path) -> None:
    (rank,) = write_profile(tmp_path, TokenSpeedSpec(ranks=1, events_per_rank=2000))
    doc = load(rank.viztracer)
    scan = scan_viztracer_scope_starts(rank.viztracer.read_bytes())
    assert scan.anchor_ns == rank.viztracer_base_ns and scan.unusable == 0
    assert scan.absolute() == viztracer_scope_starts(doc["traceEvents"], rank.viztracer_base_ns)
    assert sum(map(len, scan.relative.values())) == rank.scope_links


flow_event = st.fixed_dictionaries(
    {
        "ph": st.sampled_from(["s", "s", "f"]),
        "name": st.just("viztracer->proton"),
        "cat": st.sampled_from(["tokenspeed.proton", "tokenspeed.proton", "other"]),
        "ts": st.integers(0, 10**12).map(lambda n: n / 1000),
        "id": st.integers(0, 2**40) | st.just("1:0"),
        "pid": st.integers(1, 2**22),
    },
    optional={"args": st.fixed_dictionaries({"scope_id": st.integers(0, 2**40)}), "bp": st.just("e")},
)


@settings(max_examples=60, deadline=None)
@given(
    events=st.lists(flow_event, max_size=30),
    noise=st.lists(st.sampled_from(["X", "i"]), max_size=10),
    seed=st.integers(0, 2**16),
    anchor=st.integers(0, 2**62) | st.none(),
)
def test_byte_scan_matches_a_parse_for_any_flow_events(
    events: list[dict[str, Any]], noise: list[str], seed: int, anchor: int | None
) -> None:
    """Any key order, args before or after the name, other events around: the scan equals a parse."""
    rng = random.Random(seed)
    shuffled = [dict(rng.sample(list(e.items()), len(e))) for e in events]
    others = [{"ph": ph, "name": "f (a.py:1)", "ts": 1.5, "dur": 2.0, "cat": "FEE"} for ph in noise]
    body = shuffled + others
    rng.shuffle(body)
    doc: dict[str, Any] = {"traceEvents": body}
    if anchor is not None:
        doc["viztracer_metadata"] = {"version": "1.1.1", "baseTimeNanoseconds": anchor}
    data = json.dumps(doc, separators=(",", ":") if seed % 2 else (", ", ": ")).encode()
    scan = scan_viztracer_scope_starts(data)
    assert scan.anchor_ns == anchor
    assert scan.relative == viztracer_scope_starts(body, 0)
    flow_starts = [e for e in events if e["ph"] == "s" and e["cat"] == "tokenspeed.proton"]
    assert scan.unusable == sum(1 for e in flow_starts if "args" not in e and not isinstance(e["id"], int))


def test_byte_scan_rejects_what_is_not_a_report() -> None:
    with pytest.raises(ValueError, match="not a readable VizTracer report"):
        scan_viztracer_scope_starts(b'{"traceEvents": [')
    with pytest.raises(ValueError, match="no anchor given"):
        scan_viztracer_scope_starts(b'{"traceEvents": []}').absolute()
    assert scan_viztracer_scope_starts(b'{"traceEvents": []}').absolute(5) == {}


def test_extractors_take_normalised_events_and_pair_repeats_in_order() -> None:
    viz = [
        {"ph": "s", "name": "viztracer->proton", "cat": "tokenspeed.proton", "id": 1, "ts_ns": T0 + 100},
        {"ph": "s", "name": "viztracer->proton", "cat": "tokenspeed.proton", "id": 1, "ts_ns": T0 + 900},
        {"ph": "s", "name": "viztracer->proton", "cat": "tokenspeed.proton", "id": 2, "ts": 0.5},
        {"ph": "s", "name": "other", "cat": "tokenspeed.proton", "id": 3, "ts": 0.5},
    ]
    proton = [
        {"ph": "X", "cat": "scope", "ts": 0.95, "dur": 1.0, "args": {"scope_id": 1}},
        {"ph": "X", "cat": "scope", "ts": 0.15, "dur": 1.0, "args": {"scope_id": 1}},
        {"ph": "X", "cat": "kernel", "ts": 0.2, "dur": 1.0, "args": {"scope_id": 2}},
        {"ph": "X", "cat": "scope", "ts": 0.2, "dur": 1.0, "args": {}},
    ]
    a = viztracer_scope_starts(viz, T0)
    assert a == {1: [T0 + 100, T0 + 900], 2: [T0 + 500]}
    b = proton_scope_starts(proton, T0)
    assert b == {1: [T0 + 950, T0 + 150]}
    pairs = match_keyed(a, b)
    assert [(p.a_ns - T0, p.b_ns - T0, p.key) for p in pairs] == [(100, 150, 1), (900, 950, (1, 1))]


def test_tokenspeed_pairs_need_both_anchors() -> None:
    with pytest.raises(ValueError, match="Proton trace has no baseTimeNanoseconds"):
        tokenspeed_pairs({"traceEvents": [], "viztracer_metadata": {"baseTimeNanoseconds": 1}}, {})


# ----------------------------------------------------------------------------------- estimator
@settings(max_examples=150, deadline=None)
@given(
    delays=st.lists(st.integers(0, 200 * US), min_size=1, max_size=60),
    offset=st.integers(-50 * MS, 50 * MS),
    margin=st.integers(0, 5),
    seed=st.integers(0, 2**16),
)
def test_constant_fit_is_causal_and_off_by_exactly_the_smallest_delay(
    delays: list[int], offset: int, margin: int, seed: int
) -> None:
    rng = random.Random(seed)
    times = sorted(rng.randrange(0, 10**10) for _ in delays)
    pairs = [
        Pair(T0 + t, T0 + t + d + offset, AFTER, i)
        for i, (t, d) in enumerate(zip(times, delays, strict=True))
    ]
    res = align(pairs, fit="constant", margin_ns=margin)
    corr = res.correction
    assert corr is not None and corr.constant_ns == res.record["offset_ns"]
    if res.record["outliers"] == 0:
        assert corr.offset_ns == offset + min(delays) - margin
        assert all(slack(p, corr) >= margin for p in pairs)
    else:  # only a lower tail far below the bulk is cut, and only with enough pairs
        kept = [p for p in pairs if p.key not in set(res.outliers)]
        assert len(pairs) >= 10 and all(slack(p, corr) >= margin for p in kept)
        assert any(res.problems) and all(p["kind"] == "clock" for p in res.problems)


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(50, 600),
    jitter_us=st.integers(1, 300),
    offset=st.integers(-MS, MS),
    drift_ppm=st.floats(-300, 300),
    span_ms=st.integers(1, 20_000),
    seed=st.integers(0, 2**16),
)
def test_any_offset_and_drift_is_recovered_within_the_residual(
    n: int, jitter_us: int, offset: int, drift_ppm: float, span_ms: int, seed: int
) -> None:
    """Random delays ≥ 0 (iid, as partner delays are) and a random clock error: every pair causal, the
    estimate within the stated residual of the truth at every pair, and within what was injected: never
    ahead of the truth by more than the largest delay (causality), never behind it by more than that
    plus, with a constant offset left on a drifting clock, the drift across the pairs."""
    rng = random.Random(seed)
    pairs = []
    for i in range(n):
        a = T0 + rng.randrange(span_ms * MS)
        b_true = a + rng.randrange(jitter_us * US + 1)
        pairs.append(Pair(a, b_true + offset + round(drift_ppm * 1e-6 * (b_true - T0)), AFTER, i))
    res = align(pairs, tolerance_ns=10**12)
    corr, rec = res.correction, res.record
    assert corr is not None and not res.problems and rec["outliers"] == 0
    jitter = jitter_us * US
    times = [p.a_ns for p in pairs]
    left = 0 if rec["drift_applied"] else abs(drift_ppm) * 1e-6 * (max(times) - min(times))
    for p in pairs:
        assert slack(p, corr) >= 1
        truth = offset + drift_ppm * 1e-6 * (p.a_ns - T0)
        err = corr.offset_at(p.b_ns) - truth
        assert abs(err) <= rec["residual_ns"] + 2
        assert -(jitter + left) - 2 <= err <= jitter + 2, (err, jitter, left, rec)


@settings(max_examples=100, deadline=None)
@given(
    num=st.integers(-1000, 1000),
    den=st.integers(1_000_000, 10**12),
    off=st.integers(-(10**9), 10**9),
    at=st.integers(0, 2**62),
    ts=st.lists(st.integers(0, 2**62), min_size=2, max_size=20),
)
def test_a_drift_correction_never_runs_time_backwards(
    num: int, den: int, off: int, at: int, ts: list[int]
) -> None:
    corr = PairCorrection(off, at, num, den)
    ts.sort()
    out = [corr(t) for t in ts]
    assert out == sorted(out)
    assert all(corr(t + 1) >= corr(t) for t in ts)


@pytest.mark.parametrize("n", [1000, 30_000])  # 30k: the screen estimates from a sample
def test_mismatched_pairs_are_left_out_and_reported(n: int) -> None:
    rng = random.Random(3)
    pairs = [
        Pair(T0 + i * 50 * US, T0 + i * 50 * US + 40 * US + rng.randrange(1500), AFTER, i) for i in range(n)
    ]
    bad = [Pair(T0 + i * 50 * US, T0 + i * 50 * US - 5 * MS, AFTER, ("bad", i)) for i in (10, n // 2, n - 5)]
    res = align(pairs + bad)
    assert res.record["outliers"] == 3 and set(res.outliers) == {p.key for p in bad}
    assert res.correction is not None and 40 * US - 1 <= res.correction.offset_at(T0) <= 40 * US + 1500
    assert res.record["acausal_pairs"] == 3 and res.record["residual_ns"] < 1500
    assert any(f"3 of {n + 3} pairs" in p["detail"] for p in res.problems)


def test_drift_over_the_tolerance_is_a_problem_and_says_whether_it_was_corrected() -> None:
    rng = random.Random(5)
    pairs = []
    for i in range(400):
        a = T0 + i * 25 * MS  # 10 s of pairs: 200 ppm is 2 ms across the file
        pairs.append(Pair(a, a + 500 + rng.randrange(1000) + (a - T0) // 5000, AFTER, i))
    fitted = align(pairs)
    assert fitted.record["method"] == "pairs_tight_drift" and abs(fitted.record["drift_ppm"] - 200) < 1
    (problem,) = fitted.problems
    assert "+200.0 ppm" in problem["detail"] and "corrected by a linear fit" in problem["detail"]
    constant = align(pairs, fit="constant")
    assert constant.record["method"] == "pairs_tight" and constant.record["drift_ppm"] is None
    assert constant.record["residual_ns"] > 1 * MS
    assert any("spread" in p["detail"] for p in constant.problems)


def test_many_pairs_fit_the_drift_on_the_lower_envelope_and_stay_causal() -> None:
    """Above HULL_POINTS pairs the line comes from the envelope, then is lowered under every pair."""
    rng = random.Random(11)
    pairs = []
    for i in range(60_000):
        a = T0 + i * 100 * US + rng.randrange(50 * US)
        b_true = a + 300 + rng.randrange(1200)
        pairs.append(Pair(a, b_true - 25 * US - (b_true - T0) * 80 // 1_000_000, AFTER, i))
    res = align(pairs)
    rec, corr = res.record, res.correction
    assert corr is not None and rec["method"] == "pairs_tight_drift" and abs(rec["drift_ppm"] + 80) < 0.5
    assert rec["acausal_pairs"] == 0 and min(slack(p, corr) for p in pairs) == 1
    worst = max(abs(corr.offset_at(p.b_ns) - (-25 * US - (p.a_ns - T0) * 80e-6)) for p in pairs)
    assert worst <= rec["residual_ns"] <= 1200


def test_a_jump_inside_the_file_is_a_problem() -> None:
    pairs = [Pair(T0 + i * MS, T0 + i * MS + 700 + (3 * MS if i >= 50 else 0), AFTER, i) for i in range(100)]
    res = align(pairs)
    assert res.record["residual_ns"] > 1 * MS
    assert any("spread" in p["detail"] for p in res.problems)
    assert all(slack(p, res.correction) >= 1 for p in pairs)


def test_wall_mode_estimates_but_applies_nothing() -> None:
    pairs = [Pair(T0 + i * MS, T0 + i * MS - 25 * US + 600, AFTER, i) for i in range(20)]
    res = align(pairs, apply=False)
    assert res.correction is None and res.record["applied"] is False
    assert res.record["offset_ns"] == -25 * US + 599 and res.record["acausal_pairs"] == 20
    (problem,) = res.problems
    assert (
        problem["detail"].startswith("--clock wall keeps 20 of 20 pairs") and "-24.4 µs" in problem["detail"]
    )


def test_no_pairs_no_correction() -> None:
    res = align([])
    assert res.correction is None and not res.problems
    assert res.record == {
        "artifact": "b.proton.chrome_trace",
        "partner": "b.viztracer.json",
        "pairing": "t",
        "method": "none",
        "applied": False,
        "offset_ns": None,
        "at_ns": None,
        "pairs": 0,
        "residual_ns": None,
        "bounds_ns": None,
        "drift_ppm": None,
        "drift_applied": False,
        "outliers": 0,
        "acausal_pairs": 0,
        "raw_acausal_pairs": 0,
    }
    json.dumps(res.record)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="policy"):
        align([], policy="loose")
    with pytest.raises(ValueError, match="fit"):
        align([], fit="cubic")
    with pytest.raises(ValueError, match="order"):
        align([Pair(1, 2, "during")])


# ----------------------------------------------------------------------------------- stages
def stage(name: str, start_ns: int, end_ns: int) -> dict[str, Any]:
    return {"ph": "X", "cat": "rl_insight", "name": name, "ts_ns": start_ns, "dur_ns": end_ns - start_ns}


def region(name: str, start_us: float, dur_us: float, cat: str = "user_annotation") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "ts": start_us, "dur": dur_us}


@pytest.mark.parametrize(
    ("torch_error_ms", "expected_shift_ms"),
    [(0, 0), (-5, 0), (4, 0), (15, 5), (-15, -5)],  # the region sits 10 ms inside each end of the stage
)
def test_stage_containment_moves_torch_only_as_far_as_needed(
    torch_error_ms: int, expected_shift_ms: int
) -> None:
    base = T0 - 7 * MS  # Kineto's anchor: any value; ts are µs from it
    stages = [stage("actor_update", T0, T0 + 100 * MS), stage("train_batch", T0 - MS, T0 + 200 * MS)]
    region_start_us = (T0 + 10 * MS + torch_error_ms * MS - base) / 1000
    regions = [
        region("actor_update", region_start_us, 80_000),
        region("actor_update", region_start_us, 80_000, cat="gpu_user_annotation"),
        region("aten::mm", region_start_us, 10),
    ]
    pairs = stage_pairs(stages, regions, regions_anchor_ns=base)
    assert [(p.order, p.key) for p in pairs] == [
        (AFTER, ("actor_update", 0, "start")),
        (BEFORE, ("actor_update", 0, "end")),
    ]
    res = align_pairs(
        pairs, artifact="t.json.gz", partner="rli.jsonl", pairing="stage_name", policy="minimal"
    )
    shift = res.record["offset_ns"]
    assert abs(shift - expected_shift_ms * MS) <= 1 and not res.problems
    assert res.record["bounds_ns"] == [(torch_error_ms - 10) * MS, (torch_error_ms + 10) * MS]
    assert all(slack(p, res.correction) >= 0 for p in pairs)


def test_stage_pairs_from_a_real_torch_profile(tmp_path: Path) -> None:
    """Real Kineto output (baseTimeNanoseconds + relative µs) inside spans timed with time.time_ns, as
    VERL's DistProfiler.annotate nests record_function in RL-Insight's trace_state: every region pairs
    with its stage, the bounds hold the true offset (the same host clock: 0) and nothing needs moving."""
    torch = need("torch")
    from torch.profiler import ProfilerActivity, profile, record_function

    stages = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            for name in ("actor_compute_log_prob", "actor_update"):
                t0 = time.time_ns()
                with record_function(name):
                    torch.ones(128, 128) @ torch.ones(128, 128)
                stages.append(stage(name, t0, time.time_ns()))
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    doc = load(tmp_path / "trace.json")
    pairs = stage_pairs(stages, doc["traceEvents"], regions_anchor_ns=doc["baseTimeNanoseconds"])
    assert len(pairs) == 12 and {p.key[0] for p in pairs} == {"actor_compute_log_prob", "actor_update"}
    res = align_pairs(
        pairs, artifact="trace.json", partner="rli.jsonl", pairing="stage_name", policy="minimal"
    )
    lo, hi = res.record["bounds_ns"]
    assert lo <= 0 <= hi and res.record["offset_ns"] == 0, res.record
    assert res.record["raw_acausal_pairs"] == res.record["acausal_pairs"] == 0 and not res.problems


def test_stage_pairs_that_cannot_all_hold_are_a_problem() -> None:
    stages = [stage("actor_update", T0, T0 + 10 * MS)]
    regions = [region("update", T0 / 1000 - 1000, 20_000)]  # 20 ms region in a 10 ms stage
    pairs = stage_pairs(stages, regions, name_of=lambda n: {"update": "actor_update"}.get(n))
    res = align_pairs(pairs, artifact="t", partner="r", pairing="stage_name", policy="minimal")
    # no offset holds both ends (+9 ms needed at the end, -1 ms at the start): the middle, 5 ms out each side
    assert res.record["offset_ns"] == 4 * MS
    assert any(
        "cannot all hold" in p["detail"] and "split in the middle" in p["detail"] for p in res.problems
    )


def test_tight_policy_on_stages_closes_the_start_gap() -> None:
    stages = [stage("actor_update", T0, T0 + 100 * MS)]
    pairs = stage_pairs(stages, [region("actor_update", T0 / 1000 + 30, 1000)])
    res = align_pairs(pairs, artifact="t", partner="r", pairing="stage_name", fit="auto")
    assert res.record["offset_ns"] == 30 * US - 1 and res.record["bounds_ns"] == [-99 * MS + 30 * US, 30 * US]


def test_regions_pick_the_stage_they_overlap_most() -> None:
    stages = [stage("gen", T0, T0 + 10 * MS), stage("gen", T0 + 20 * MS, T0 + 30 * MS)]
    pairs = stage_pairs(stages, [region("gen", T0 / 1000 + 21_000, 5_000), region("gen", T0 / 1000 + 1, 2)])
    assert [(p.a_ns - T0) // MS for p in pairs] == [20, 30, 0, 10]


# ----------------------------------------------------------------------------------- corrections
def test_corrections_stack_on_the_host_correction_and_pickle() -> None:
    host = Correction([OffsetPoint(T0, 3 * MS, 100)])  # host clock 3 ms ahead of the reference
    pair = PairCorrection(40 * US)
    both = chain(pair, host)
    assert both.constant_ns == 3 * MS + 40 * US and both(T0) == T0 - 3 * MS - 40 * US
    drifting = chain(PairCorrection(40 * US, T0, 1, 10_000), host)
    assert drifting.constant_ns is None and drifting(T0 + 10 * MS) == T0 + 10 * MS - 3 * MS - 41 * US
    for c in (pair, both, drifting):
        assert pickle.loads(pickle.dumps(c))(T0 + 123) == c(T0 + 123)
    assert pair.drift_ppm == 0 and PairCorrection(0, 0, 1, 10_000).drift_ppm == 100


def test_importing_pair_alignment_is_light() -> None:
    code = """
        import json, sys
        import rl_trace_observer.merge.clock.pairs, rl_trace_observer.merge.clock.pair_events
        print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in
                                ("torch", "ray", "verl", "numpy", "pandas", "viztracer"))))
    """
    assert json.loads(run_python(code, clean_env()).stdout) == []


def test_min_drift_pairs_is_respected() -> None:
    """Too few pairs for a line: a constant, even under drift (a line through 3 points is noise)."""
    pairs = [Pair(T0 + i * 10**9, T0 + i * 10**9 + i * 10**6, AFTER, i) for i in range(MIN_DRIFT_PAIRS - 1)]
    res = align(pairs)
    assert res.record["drift_ppm"] is None and res.record["method"] == "pairs_tight"


# ----------------------------------------------------------------------------------- merge glue
def test_glue_reads_scope_starts_from_merge_events_raw_or_deferred() -> None:
    from msgspec import Raw

    from rl_trace_observer.merge.formats.proton.pairing import proton_scope_starts_of
    from rl_trace_observer.merge.timeline.model import Event

    def events(ts: list[float | int]) -> list[Event]:
        return [
            Event(ph="X", cat="scope", ts=ts[0], dur=5, args=Raw(b'{"scope_id":3,"call_stack":["a"]}')),
            Event(ph="X", cat="scope", ts=ts[1], dur=5, args=Raw(b'{"scope_id":"3"}')),
            Event(ph="X", cat="scope", ts=ts[2], dur=5, args=Raw(b"{bad")),
            Event(ph="X", cat="kernel", ts=ts[3], dur=5, args=Raw(b'{"scope_id":4}')),
            Event(ph="X", cat="scope", ts=ts[4], dur=5, args=Raw(b'{"scope_id":3}')),
            Event(ph="M", name="thread_name", args=Raw(b'{"name":"x"}')),
        ]

    assert proton_scope_starts_of(events([T0 + 1, T0 + 2, T0 + 3, T0 + 4, T0 + 5]), 0, deferred=False) == {
        3: [T0 + 1, T0 + 5]
    }
    assert proton_scope_starts_of(events([0.001, 1, 2, 3, 4.5]), T0, deferred=True) == {
        3: [T0 + 1, T0 + 4500]
    }


def test_glue_converts_stage_events_for_stage_pairs() -> None:
    from rl_trace_observer.merge.clock.pair_apply import as_span_dicts
    from rl_trace_observer.merge.timeline.model import Event

    torch_events = [
        Event(ph="X", cat="user_annotation", name="actor_update", ts=10.5, dur=80.25),
        Event(ph="X", cat="cpu_op", name="aten::mm", ts=11.0, dur=1.0),
        Event(ph="i", cat="user_annotation", name="mark", ts=12.0),
    ]
    regions = as_span_dicts(torch_events, T0, deferred=True, cats={"user_annotation"})
    assert regions == [
        {"ph": "X", "cat": "user_annotation", "name": "actor_update", "ts_ns": T0 + 10_500, "dur_ns": 80_250}
    ]
    rli = [Event(ph="X", cat="rl_insight", name="actor_update", ts=T0, dur=100 * US)]
    stages = as_span_dicts(rli, 0, deferred=False, cats={"rl_insight"})
    pairs = stage_pairs(stages, regions)
    assert [(p.order, p.gap_ns) for p in pairs] == [(AFTER, 10_500), (BEFORE, -(100 * US - 90_750))]


def test_glue_stacks_the_pair_correction_under_the_host_correction() -> None:
    from rl_trace_observer.merge.clock.correction import IDENTITY, TimeCorrection, stack

    host_const = TimeCorrection(offset_ns=-3 * MS, method="aligned")  # host 3 ms ahead: subtract it
    host_line = TimeCorrection(
        fn=Correction([OffsetPoint(T0, 3 * MS, 9), OffsetPoint(T0 + 10**9, 4 * MS, 9)])
    )
    pair_const, pair_line = PairCorrection(40 * US), PairCorrection(40 * US, T0, 1, 10_000)
    assert stack(host_const, None) is host_const
    fused = stack(host_const, pair_const)
    assert fused.fn is None and fused.offset_ns == -3 * MS - 40 * US and fused.method == "aligned+pairs"
    assert stack(IDENTITY, pair_const).offset_ns == -40 * US
    for host in (host_const, host_line, IDENTITY):
        for pair in (pair_const, pair_line):
            both = stack(host, pair)
            for t in (T0, T0 + 123_456_789, T0 + 2 * 10**9):
                assert both(t) == host(pair(t))
            assert pickle.loads(pickle.dumps(both))(T0 + 7) == both(T0 + 7)
