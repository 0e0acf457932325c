"""The offset/drift estimator and jump detector against synthetic clocks whose truth is exact.

The remote clock is continuous and linear (``Fraction`` arithmetic) and read by rounding down, as a
real clock is; delays are random and freely asymmetric. The properties are the promises the merger
relies on: the true offset lies inside the reported bound, always.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trace_observer.capture.clock import ShiftedClock, snapshot
from rl_trace_observer.common.clock_offsets import (
    DEFAULT_JUMP_TOLERANCE_NS,
    Exchange,
    Extrapolation,
    OffsetPoint,
    detect_jumps,
    estimate_offset,
    fit_drift,
    interpolate,
    slope_range,
)

T_BASE = 1_780_000_000_000_000_000  # an epoch-ns value of the right magnitude


@dataclass(frozen=True)
class TrueClock:
    """remote(t) = t + theta0 + k·(t − T0), continuous; ``read`` rounds down like a real clock."""

    theta0: int
    k: Fraction

    def offset(self, t: Fraction | int) -> Fraction:
        return self.theta0 + self.k * (Fraction(t) - T_BASE)

    def read(self, t: Fraction | int) -> int:
        return math.floor(Fraction(t) + self.offset(t))

    def offset_at_remote(self, r: Fraction | int) -> Fraction:
        """The true offset when the remote clock shows ``r`` (invert r = t + offset(t))."""
        t = (Fraction(r) - self.theta0 + self.k * T_BASE) / (1 + self.k)
        return self.offset(t)


def exchange(clock: TrueClock, t0: int, d1: int, hold: int, d2: int) -> Exchange:
    t1 = clock.read(t0 + d1)
    t2 = clock.read(t0 + d1 + hold)
    return Exchange(t0, t1, t2, t0 + d1 + hold + d2)


delays = st.integers(min_value=0, max_value=50_000_000)  # up to 50 ms each way, independently
rounds_st = st.lists(st.tuples(delays, st.integers(0, 2_000_000), delays), min_size=1, max_size=8)
clocks = st.builds(
    TrueClock,
    theta0=st.integers(-(10**12), 10**12),  # ±1000 s
    k=st.integers(-500, 500).map(lambda ppm: Fraction(ppm, 1_000_000)),
)


def run_rounds(clock: TrueClock, start: int, rounds: list[tuple[int, int, int]]) -> list[Exchange]:
    out, t = [], start
    for d1, hold, d2 in rounds:
        ex = exchange(clock, t, d1, hold, d2)
        out.append(ex)
        t = ex.t3_ns + 1000
    return out


@settings(max_examples=400, deadline=None)
@given(clock=clocks, start=st.integers(T_BASE - 10**15, T_BASE + 10**15), rounds=rounds_st)
def test_true_offset_lies_within_reported_bound(
    clock: TrueClock, start: int, rounds: list[tuple[int, int, int]]
) -> None:
    est = estimate_offset(run_rounds(clock, start, rounds))
    assert est is not None
    truth = clock.offset(est.reference_wall_ns)
    assert abs(truth - est.offset_ns) <= est.uncertainty_ns
    assert est.round_trip_ns == min(est.round_trips_ns)
    assert est.uncertainty_ns >= est.round_trip_ns / 2
    assert est.rounds == len(rounds) and est.rejected == 0
    # The remote-side timestamp maps to the same truth (what the merger interpolates on).
    assert abs(clock.offset_at_remote(est.wall_ns) - est.offset_ns) <= est.uncertainty_ns


def test_symmetric_delays_give_the_exact_offset_and_half_rtt() -> None:
    clock = TrueClock(theta0=37_000_000, k=Fraction(0))
    est = estimate_offset([exchange(clock, T_BASE, 100_000, 10_000, 100_000)])
    assert est is not None
    assert est.offset_ns == 37_000_000
    assert est.round_trip_ns == 200_000
    assert est.uncertainty_ns == 100_000 + math.ceil(500e-6 * 210_000) + 1


def test_minimum_round_trip_wins_and_invalid_exchanges_are_rejected() -> None:
    clock = TrueClock(theta0=-120_000_000, k=Fraction(0))
    good = exchange(clock, T_BASE, 30_000, 0, 40_000)
    slow = exchange(clock, T_BASE + 10**6, 9_000_000, 0, 100)
    stepped = Exchange(T_BASE, T_BASE + 10, T_BASE + 5, T_BASE + 100)  # remote replied before receiving
    est = estimate_offset([slow, stepped, good])
    assert est is not None
    assert est.round_trip_ns == 70_000 and est.rounds == 2 and est.rejected == 1
    assert abs(est.offset_ns + 120_000_000) <= est.uncertainty_ns
    assert estimate_offset([stepped]) is None
    assert estimate_offset([]) is None


@settings(max_examples=150, deadline=None)
@given(
    clock=clocks,
    gaps=st.lists(st.integers(1_000_000, 100 * 10**9), min_size=1, max_size=12),
    rounds=st.lists(rounds_st, min_size=13, max_size=13),
    query=st.floats(0, 1),
)
def test_drift_range_contains_truth_and_interpolation_is_bounded(
    clock: TrueClock, gaps: list[int], rounds: list[list[tuple[int, int, int]]], query: float
) -> None:
    points: list[OffsetPoint] = []
    t = T_BASE
    for gap, rr in zip([0, *gaps], rounds, strict=False):
        t += gap
        est = estimate_offset(run_rounds(clock, t, rr))
        assert est is not None
        points.append(OffsetPoint(est.wall_ns, est.offset_ns, est.uncertainty_ns))
    points.sort()
    fit = fit_drift(points)
    true_slope = clock.k / (1 + clock.k)  # d(offset)/d(remote time)
    lo, hi = slope_range(points)
    assert lo - 1e-12 <= true_slope <= hi + 1e-12
    if fit is not None:
        assert fit.consistent
        assert fit.drift_lo_ppm - 1e-6 <= fit.drift_ppm <= fit.drift_hi_ppm + 1e-6
    r = points[0].wall_ns + int(query * (points[-1].wall_ns - points[0].wall_ns))
    off, unc = interpolate(points, r)
    assert abs(clock.offset_at_remote(r) - off) <= unc


def test_drift_fit_recovers_50_ppm() -> None:
    clock = TrueClock(theta0=5_000_000, k=Fraction(50, 1_000_000))
    points = []
    for i in range(10):
        est = estimate_offset([exchange(clock, T_BASE + i * 10**9, 20_000, 1_000, 25_000)])
        assert est is not None
        points.append(OffsetPoint(est.wall_ns, est.offset_ns, est.uncertainty_ns))
    fit = fit_drift(points)
    assert fit is not None and fit.consistent and fit.samples == 10
    assert fit.drift_ppm == pytest.approx(50, abs=0.1)
    assert fit.drift_lo_ppm <= 50 <= fit.drift_hi_ppm
    assert abs(fit.offset_at(points[5].wall_ns) - points[5].offset_ns) <= fit.residual_ns


def test_drift_fit_edge_cases() -> None:
    assert fit_drift([]) is None
    assert fit_drift([OffsetPoint(T_BASE, 5, 1)]) is None
    assert fit_drift([OffsetPoint(T_BASE, 5, 1), OffsetPoint(T_BASE, 6, 1)]) is None
    # A 10 ms step between measurements 1 s apart with 1 µs bounds: no straight line fits.
    stepped = [OffsetPoint(T_BASE + i * 10**9, (10_000_000 if i >= 2 else 0), 1_000) for i in range(4)]
    fit = fit_drift(stepped)
    assert fit is not None and not fit.consistent and fit.drift_lo_ppm > fit.drift_hi_ppm
    assert slope_range([OffsetPoint(T_BASE, 0, 1), OffsetPoint(T_BASE, 100, 1)]) == (math.inf, -math.inf)
    with pytest.raises(ValueError):
        interpolate([], T_BASE)


def test_interpolate_widens_the_bound_outside_the_measured_range() -> None:
    pts = [OffsetPoint(T_BASE, 1_000, 10), OffsetPoint(T_BASE + 1_000_000, 2_000, 30)]
    # Without a drift: nothing extrapolated, the slope only known to be under 500 ppm (+1: rounding).
    assert interpolate(pts, T_BASE - 5) == (1_000, 10 + 1 + 1)
    assert interpolate(pts, T_BASE + 2_000_000) == (2_000, 30 + 500 + 1)
    assert interpolate(pts, T_BASE + 1_000_000) == (2_000, 30)
    assert interpolate(pts, T_BASE + 500_000) == (1_500, 31 + 1)  # + 2·1 ppm·0.5 ms·0.5 ms/1 ms
    assert interpolate(pts, T_BASE + 500_000, allowance_ppm=0) == (1_500, 31)
    # 1000 ppm between them: steeper than any clock drifts, so no drift is trusted.
    steep = Extrapolation.of(pts)
    assert not steep.fitted and not steep.consistent and steep.spread == pytest.approx(500e-6)
    # 50 ppm over a second: carried on, the bound growing by the slopes still possible (±0.04 ppm
    # from the measurements, ±2 ppm for twice the allowance).
    pts = [OffsetPoint(T_BASE, 1_000, 10), OffsetPoint(T_BASE + 10**9, 51_000, 30)]
    ex = Extrapolation.of(pts)
    assert ex.fitted and ex.consistent and ex.drift == pytest.approx(50e-6)
    assert ex.lo == pytest.approx(47.96e-6) and ex.hi == pytest.approx(52.04e-6)
    off, unc = interpolate(pts, T_BASE + 2 * 10**9, extrapolation=ex)
    assert off == 101_000 and 30 + 2_040 <= unc <= 30 + 2_042
    assert interpolate(pts, T_BASE - 10**9, extrapolation=ex)[0] == -49_000
    assert Extrapolation.of(pts[:1]) == Extrapolation.assumed()  # one measurement: no drift known


# ------------------------------------------------------------------------ jumps
@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.integers(1_000, 60 * 10**9), st.integers(-100, 100), st.booleans(), st.booleans()),
        min_size=1,
        max_size=20,
    ),
    start_wall=st.integers(T_BASE - 10**15, T_BASE + 10**15),
)
def test_jumps_are_found_exactly(steps: list[tuple[int, int, bool, bool]], start_wall: int) -> None:
    """Slewing within 100 ppm is never a jump; any step 2× over the allowance always is."""
    mono, wall = 10**12, start_wall
    snaps = [{"reason": "start", "wall_ns": wall, "mono_ns": mono, "read_ns": 50}]
    expected = []
    for i, (d_mono, slew_ppm, has_jump, backwards) in enumerate(steps):
        mono += d_mono
        wall += d_mono + d_mono * slew_ppm // 1_000_000
        if has_jump:
            allowed = DEFAULT_JUMP_TOLERANCE_NS + math.ceil(500e-6 * d_mono) + 100
            size = 2 * allowed + 7
            wall += -size if backwards else size
            expected.append(i)
        snaps.append({"reason": f"s{i}", "wall_ns": wall, "mono_ns": mono, "read_ns": 50})
    # Order in the record must not matter: the detector sorts by monotonic time.
    jumps = detect_jumps(list(reversed(snaps)))
    assert [int(str(j.after["reason"])[1:]) for j in jumps] == expected
    for j in jumps:
        assert abs(j.jump_ns) > j.allowed_ns
        assert j.mono_range[0] < j.mono_range[1]
        assert "jumped" in j.describe()


def test_shifted_clock_jump_is_detected_between_real_snapshots() -> None:
    clock = ShiftedClock(offset_ns=37_000_000, drift_ppm=50)
    before = snapshot(clock, "step_begin", step=1)
    quiet = snapshot(clock, "artifact")
    clock.jump(-250_000_000)  # an NTP step back by 250 ms
    after = snapshot(clock, "step_end", step=1)
    assert detect_jumps([before, quiet]) == []
    (jump,) = detect_jumps([before, quiet, after, {"reason": "junk", "wall_ns": "x"}])
    assert jump.before is quiet and jump.after is after
    assert jump.jump_ns == pytest.approx(-250_000_000, abs=2_000_000)
    assert clock.offset_at(clock.origin_wall_ns) == clock.offset_ns
    # Readings taken earlier win over fresh ones (how a snapshot is stored from another thread).
    assert snapshot(clock, "late", **{k: v for k, v in before.items() if k != "reason"}) == {
        **before,
        "reason": "late",
    }
