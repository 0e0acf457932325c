"""How far apart two wall clocks are, with a bound that holds: the pure estimator behind clock sync.

Nothing here reads a clock or talks to anything; it turns numbers into estimates, so the same code
runs inside training (``integrations.ray.clock_sync``), in the merger (``merge.clock.hosts``) and
under hypothesis tests.

Sign convention, everywhere: ``offset_ns = remote_wall − reference_wall`` at the same instant, so a
remote timestamp is put on the reference timeline by ``ts_ns − offset_ns``.

**One exchange** (NTP's four timestamps, all wall-clock ns): the reference sends at ``t0`` (its
clock), the remote receives at ``t1`` and replies at ``t2`` (its clock), the reference receives at
``t3``. Whatever the two one-way delays ``d1, d2 ≥ 0`` are, the true offset θ satisfies
``t2 − t3 ≤ θ ≤ t1 − t0`` — an interval whose width is the round trip ``(t3 − t0) − (t2 − t1)``.
Its midpoint is the estimate and half its width the uncertainty: asymmetric delays move the
midpoint, but never outside the interval. Of several rounds we keep the one with the smallest round
trip (the tightest interval), as NTP's clock filter does. If the remote clock drifts during the
exchange, the interval stretches by at most ``max_drift_ppm × (t3 − t0)``; that slack, and one
clock tick for readings being rounded down, are added so the bound stays a bound.

**Several measurements over time** (``fit_drift``): under a constant drift the offset is a line
``offset(t) = offset_ns + drift·(t − t_ref_ns)`` (``t`` on the remote's own wall clock). The set of
slopes compatible with every measurement's interval is exact and cheap to compute from pairs; the
reported drift is the weighted least-squares slope clipped into that set.

**Offsets at any time, with bounds that hold** (``interpolate``). The model: the offset's rate of
change (the drift) stays within ``±allowance_ppm`` of one constant, and never exceeds
``DEFAULT_MAX_DRIFT_PPM``. Between two measurements: the straight line through them, bound
``max(u_i, u_j)`` plus ``2·a·x·(T − x)/T`` for drift wandering by ``a`` (``x`` into a gap of ``T``;
at most ``a·T/2``). Outside the measured range: the nearest measurement carried on with a drift
(``Extrapolation``), its bound grown by ``spread × distance``. With a drift fit, the slopes the
truth can have are the measurements' exact slope range widened by ``2a`` on each side (the constant
lies within ``a`` of every measured average slope, the actual slope within ``a`` of the constant),
and the fitted drift is applied; without one (a single measurement, or measurements no drift line
fits) nothing is extrapolated and the slope is only known to be within ``±DEFAULT_MAX_DRIFT_PPM``.

**Wall-clock jumps** (``detect_jumps``): two clock snapshots (wall and monotonic read together)
must agree on elapsed time up to slewing; a larger disagreement is a step of the wall clock (NTP,
an operator, a VM resume) somewhere between the two snapshots.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MAX_DRIFT_PPM = 500.0
"""Worst oscillator error assumed inside one exchange (NTP's own limit); costs <1 ns per ms of RTT."""

DEFAULT_JUMP_TOLERANCE_NS = 100_000
"""Wall vs monotonic disagreement (beyond slewing) that counts as a jump: 100 µs."""

DEFAULT_SLEW_PPM = 500.0
"""Linux slews the wall clock by at most 500 ppm; more than that between snapshots is a step."""

DEFAULT_DRIFT_ALLOWANCE_PPM = 1.0
"""How far a host's drift may wander from one constant during a run, beyond what its measurements
show: temperature moves a quartz oscillator's rate and a time daemon steers it, by fractions of a
ppm to a few ppm. Stated in the merge manifest (``timeline.clock.drift_allowance_ppm``)."""

MAX_FIT_POINTS = 400  # the exact slope range is O(n²); thin larger sets to the best per time bucket


# ------------------------------------------------------------------ one exchange
@dataclass(frozen=True, slots=True)
class Exchange:
    """One NTP-style round: t0/t3 on the reference wall clock, t1/t2 on the remote's."""

    t0_ns: int
    t1_ns: int
    t2_ns: int
    t3_ns: int

    @property
    def round_trip_ns(self) -> int:
        """Time on the wire both ways: the reference's elapsed time minus the remote's hold time."""
        return (self.t3_ns - self.t0_ns) - (self.t2_ns - self.t1_ns)

    @property
    def interval(self) -> tuple[int, int]:
        """``(lo, hi)``: every true offset consistent with non-negative one-way delays."""
        return self.t2_ns - self.t3_ns, self.t1_ns - self.t0_ns

    def usable(self, max_drift_ppm: float = DEFAULT_MAX_DRIFT_PPM, resolution_ns: int = 1) -> bool:
        """False when a clock must have stepped mid-exchange (time ran backwards on either side).

        A fast remote clock measures its hold time a little long, so with near-zero delays the
        round trip may be a few ns negative; only more than drift and rounding explain is rejected.
        """
        hold = self.t2_ns - self.t1_ns
        allowed = math.ceil(max_drift_ppm * 1e-6 * hold) + 2 * resolution_ns
        return hold >= 0 and self.t3_ns >= self.t0_ns and self.round_trip_ns >= -allowed


@dataclass(frozen=True)
class OffsetEstimate:
    """The best of several exchanges with one remote; ``|true − offset_ns| ≤ uncertainty_ns``."""

    offset_ns: int
    uncertainty_ns: int
    round_trip_ns: int
    round_trips_ns: tuple[int, ...]
    rounds: int
    rejected: int
    reference_wall_ns: int
    wall_ns: int

    def as_record(self) -> dict[str, Any]:
        """The fields a process record's ``clock_offsets`` entry carries (see docs/FORMATS.md)."""
        return {
            "offset_ns": self.offset_ns,
            "uncertainty_ns": self.uncertainty_ns,
            "round_trip_ns": self.round_trip_ns,
            "round_trips_ns": list(self.round_trips_ns),
            "rounds": self.rounds,
            "rejected": self.rejected,
            "reference_wall_ns": self.reference_wall_ns,
            "wall_ns": self.wall_ns,
        }


def estimate_offset(
    exchanges: Iterable[Exchange],
    *,
    max_drift_ppm: float = DEFAULT_MAX_DRIFT_PPM,
    resolution_ns: int = 1,
) -> OffsetEstimate | None:
    """Keep the minimum-round-trip exchange; ``None`` when no exchange is valid.

    ``resolution_ns`` is the clocks' reading granularity: a reading is the true time rounded down,
    which can put the interval's upper edge up to one tick below the truth.
    """
    valid: list[Exchange] = []
    rejected = 0
    for ex in exchanges:
        if ex.usable(max_drift_ppm, resolution_ns):
            valid.append(ex)
        else:
            rejected += 1
    if not valid:
        return None
    best = min(valid, key=lambda e: e.round_trip_ns)
    lo, hi = best.interval
    offset = (lo + hi) // 2  # floor; the uncertainty below covers the half nanosecond
    slack = math.ceil(max_drift_ppm * 1e-6 * (best.t3_ns - best.t0_ns))
    return OffsetEstimate(
        offset_ns=offset,
        uncertainty_ns=max(abs(hi - offset), abs(offset - lo)) + slack + resolution_ns,
        round_trip_ns=best.round_trip_ns,
        round_trips_ns=tuple(e.round_trip_ns for e in valid),
        rounds=len(valid),
        rejected=rejected,
        reference_wall_ns=(best.t0_ns + best.t3_ns) // 2,
        wall_ns=(best.t1_ns + best.t2_ns) // 2,
    )


# ------------------------------------------------------------ drift over time
@dataclass(frozen=True, slots=True, order=True)
class OffsetPoint:
    """One measurement on the remote's own wall clock: true offset at ``wall_ns`` is within ± u."""

    wall_ns: int
    offset_ns: int
    uncertainty_ns: int

    @property
    def lo(self) -> int:
        return self.offset_ns - self.uncertainty_ns

    @property
    def hi(self) -> int:
        return self.offset_ns + self.uncertainty_ns


def too_close(a: OffsetPoint, b: OffsetPoint) -> bool:
    """True when a line through ``a`` and ``b`` would change the offset by half the time between
    them or more: measurement noise, not drift (no clock drifts by 500 000 ppm). Such a line would
    also make the correction ``ts − offset(ts)`` run backwards between them."""
    return 2 * abs(b.offset_ns - a.offset_ns) >= abs(b.wall_ns - a.wall_ns)


def combine(a: OffsetPoint, b: OffsetPoint, max_drift_ppm: float = DEFAULT_MAX_DRIFT_PPM) -> OffsetPoint:
    """One point for two measurements ``too_close`` to draw a line through: at the tighter one's
    time, the intersection of both intervals (the other widened by the most the offset can drift
    in between); when they do not intersect (a clock stepped), the tighter one alone."""
    keep, other = (a, b) if a.uncertainty_ns <= b.uncertainty_ns else (b, a)
    slack = math.ceil(max_drift_ppm * 1e-6 * abs(other.wall_ns - keep.wall_ns))
    lo, hi = max(keep.lo, other.lo - slack), min(keep.hi, other.hi + slack)
    if lo > hi:
        return keep
    mid = (lo + hi) // 2
    return OffsetPoint(keep.wall_ns, mid, max(hi - mid, mid - lo))


@dataclass(frozen=True)
class DriftFit:
    """``offset(t) = offset_ns + drift_ppm·1e-6·(t − t_ref_ns)``; the drift is within [lo, hi] ppm.

    ``consistent`` is False when no straight line passes through every measurement's interval
    (a jump or a changing drift): then ``drift_lo_ppm > drift_hi_ppm`` and only piecewise
    interpolation (``interpolate``) should be trusted. ``residual_ns`` is the largest distance from
    the line to the far edge of a measurement's interval.
    """

    t_ref_ns: int
    offset_ns: int
    drift_ppm: float
    drift_lo_ppm: float
    drift_hi_ppm: float
    consistent: bool
    residual_ns: int
    samples: int

    def offset_at(self, wall_ns: int) -> int:
        return self.offset_ns + round(self.drift_ppm * 1e-6 * (wall_ns - self.t_ref_ns))


def _thin(points: Sequence[OffsetPoint], limit: int) -> list[OffsetPoint]:
    """At most ``limit`` points, the tightest of each equal-width time bucket."""
    if len(points) <= limit:
        return list(points)
    t0, t1 = points[0].wall_ns, points[-1].wall_ns
    width = (t1 - t0) / limit or 1.0
    best: dict[int, OffsetPoint] = {}
    for p in points:
        b = min(int((p.wall_ns - t0) / width), limit - 1)
        if b not in best or p.uncertainty_ns < best[b].uncertainty_ns:
            best[b] = p
    return sorted(best.values())


def slope_range(points: Sequence[OffsetPoint]) -> tuple[float, float]:
    """Exact range of slopes (ns per ns) of lines crossing every interval; lo > hi if there is none.

    A line with slope b crosses all intervals iff for every pair i (earlier), j (later):
    ``(lo_j − hi_i)/(t_j − t_i) ≤ b ≤ (hi_j − lo_i)/(t_j − t_i)`` (pairwise suffices in 2-D).
    """
    lo, hi = -math.inf, math.inf
    for i, a in enumerate(points):
        for b in points[i + 1 :]:
            dt = b.wall_ns - a.wall_ns
            if dt <= 0:
                if b.lo > a.hi or a.lo > b.hi:  # same instant, disjoint intervals: no line at all
                    return math.inf, -math.inf
                continue
            lo = max(lo, (b.lo - a.hi) / dt)
            hi = min(hi, (b.hi - a.lo) / dt)
    return lo, hi


def fit_drift(points: Iterable[OffsetPoint]) -> DriftFit | None:
    """A drift line through measurements spread over time; ``None`` with fewer than two instants."""
    pts = _thin(sorted(points), MAX_FIT_POINTS)
    if len(pts) < 2 or pts[0].wall_ns == pts[-1].wall_ns:
        return None
    t_ref = pts[0].wall_ns
    weights = [1.0 / max(p.uncertainty_ns, 1) ** 2 for p in pts]
    sw = sum(weights)
    mt = sum(w * (p.wall_ns - t_ref) for w, p in zip(weights, pts, strict=True)) / sw
    mo = sum(w * p.offset_ns for w, p in zip(weights, pts, strict=True)) / sw
    sxx = sum(w * (p.wall_ns - t_ref - mt) ** 2 for w, p in zip(weights, pts, strict=True))
    sxy = sum(w * (p.wall_ns - t_ref - mt) * (p.offset_ns - mo) for w, p in zip(weights, pts, strict=True))
    slope = sxy / sxx if sxx > 0 else 0.0
    lo, hi = slope_range(pts)
    consistent = lo <= hi
    if consistent:
        slope = min(max(slope, lo), hi)
    # Intercept at t_ref: weighted mean of the points projected along the slope.
    offset0 = round(mo - slope * mt)
    residual = max(abs(offset0 + slope * (p.wall_ns - t_ref) - p.offset_ns) + p.uncertainty_ns for p in pts)
    return DriftFit(
        t_ref_ns=t_ref,
        offset_ns=offset0,
        drift_ppm=slope * 1e6,
        drift_lo_ppm=lo * 1e6,
        drift_hi_ppm=hi * 1e6,
        consistent=consistent,
        residual_ns=math.ceil(residual),
        samples=len(pts),
    )


@dataclass(frozen=True, slots=True)
class Extrapolation:
    """How an offset is carried beyond the measured range; slopes in ns of offset per ns of time.

    ``drift`` is applied from the nearest measurement on; the true slope lies in ``[lo, hi]``, so
    the bound grows by ``spread`` per ns of distance. ``fitted``: the slopes come from a drift fit;
    otherwise nothing is extrapolated and the slope is only known to be within ±``max_drift_ppm``.
    ``consistent`` is False when the measurements refute the model (no drift line within the
    allowance fits them all: a clock step nobody saw, or a drift that wandered more).
    """

    drift: float = 0.0
    lo: float = -DEFAULT_MAX_DRIFT_PPM * 1e-6
    hi: float = DEFAULT_MAX_DRIFT_PPM * 1e-6
    fitted: bool = False
    consistent: bool = True

    @property
    def spread(self) -> float:
        """The largest difference between the applied and a possible slope."""
        return max(self.drift - self.lo, self.hi - self.drift)

    @classmethod
    def assumed(cls, max_drift_ppm: float = DEFAULT_MAX_DRIFT_PPM, consistent: bool = True) -> Extrapolation:
        m = max_drift_ppm * 1e-6
        return cls(0.0, -m, m, False, consistent)

    @classmethod
    def of(
        cls,
        points: Iterable[OffsetPoint],
        *,
        allowance_ppm: float = DEFAULT_DRIFT_ALLOWANCE_PPM,
        max_drift_ppm: float = DEFAULT_MAX_DRIFT_PPM,
    ) -> Extrapolation:
        """From a drift fit of ``points`` where one exists and the model holds, else ``assumed``."""
        fit = fit_drift(points)
        if fit is None:
            return cls.assumed(max_drift_ppm)
        a, m = allowance_ppm * 1e-6, max_drift_ppm * 1e-6
        lo = max(fit.drift_lo_ppm * 1e-6 - 2 * a, -m)
        hi = min(fit.drift_hi_ppm * 1e-6 + 2 * a, m)
        if lo > hi:  # no drift line within the allowance, or one steeper than any clock drifts
            return cls.assumed(max_drift_ppm, consistent=False)
        return cls(min(max(fit.drift_ppm * 1e-6, lo), hi), lo, hi, True)

    def as_dict(self) -> dict[str, Any]:
        return {
            "drift_ppm": round(self.drift * 1e6, 3),
            "drift_range_ppm": [round(self.lo * 1e6, 3), round(self.hi * 1e6, 3)],
            "fitted": self.fitted,
        }


ASSUMED = Extrapolation()


def extrapolate(p: OffsetPoint, wall_ns: int, ex: Extrapolation = ASSUMED) -> tuple[int, int]:
    """``(offset_ns, uncertainty_ns)`` at ``wall_ns``, carried on from the measurement ``p``.

    Monotonic: ``wall_ns − offset`` never decreases with ``wall_ns`` (``|drift| < 1``).
    """
    d = wall_ns - p.wall_ns
    if d == 0:
        return p.offset_ns, p.uncertainty_ns
    # +1: the rounding of the applied drift (and a float's last bit of the product)
    return p.offset_ns + round(ex.drift * d), p.uncertainty_ns + math.ceil(ex.spread * abs(d)) + 1


def between(a: OffsetPoint, b: OffsetPoint, wall_ns: int, allowance_ppm: float) -> tuple[int, int]:
    """``(offset_ns, uncertainty_ns)`` on the straight line from ``a`` to ``b`` (``a.wall < wall < b.wall``).

    Exact integer arithmetic for the line; the bound adds ``2·a·x·(T − x)/T`` for a drift that
    wanders by ``allowance_ppm`` inside the gap.
    """
    dt = b.wall_ns - a.wall_ns
    x = wall_ns - a.wall_ns
    off = a.offset_ns + (x * (b.offset_ns - a.offset_ns)) // dt
    wander = math.ceil(2 * allowance_ppm * 1e-6 * x * (dt - x) / dt) if allowance_ppm > 0 else 0
    return off, max(a.uncertainty_ns, b.uncertainty_ns) + 1 + wander  # +1: the floor division


def interpolate(
    points: Sequence[OffsetPoint],
    wall_ns: int,
    times: Sequence[int] | None = None,
    *,
    extrapolation: Extrapolation = ASSUMED,
    allowance_ppm: float = DEFAULT_DRIFT_ALLOWANCE_PPM,
) -> tuple[int, int]:
    """``(offset_ns, uncertainty_ns)`` at ``wall_ns`` from points sorted by ``wall_ns``.

    Between two measurements: ``between``; outside the measured range: ``extrapolate`` from the
    nearest one (pass ``Extrapolation.of(points)`` to use their drift; the default extrapolates
    nothing and bounds the slope by ``DEFAULT_MAX_DRIFT_PPM``). ``times`` (the points'
    ``wall_ns``, precomputed) saves a list per call on hot paths.
    """
    if not points:
        raise ValueError("interpolate needs at least one measurement")
    if times is None:
        times = [p.wall_ns for p in points]
    j = bisect.bisect_left(times, wall_ns)
    if j == 0:
        return extrapolate(points[0], wall_ns, extrapolation)
    if j == len(points):
        return extrapolate(points[-1], wall_ns, extrapolation)
    b = points[j]
    if b.wall_ns == wall_ns:
        return b.offset_ns, b.uncertainty_ns
    return between(points[j - 1], b, wall_ns, allowance_ppm)


# ---------------------------------------------------------------- wall jumps
@dataclass(frozen=True)
class WallJump:
    """The wall clock moved ``jump_ns`` more (or less, if negative) than elapsed monotonic time."""

    jump_ns: int
    allowed_ns: int
    before: Mapping[str, Any] = field(repr=False)
    after: Mapping[str, Any] = field(repr=False)

    @property
    def mono_range(self) -> tuple[int, int]:
        return int(self.before["mono_ns"]), int(self.after["mono_ns"])

    @property
    def wall_range(self) -> tuple[int, int]:
        return int(self.before["wall_ns"]), int(self.after["wall_ns"])

    def describe(self) -> str:
        return (
            f"wall clock jumped {self.jump_ns / 1e6:+.3f} ms between snapshots "
            f"{self.before.get('reason')!r} and {self.after.get('reason')!r} "
            f"(allowed ±{self.allowed_ns / 1e3:.0f} µs)"
        )


def _is_snapshot(s: Any) -> bool:
    return (
        isinstance(s, Mapping)
        and isinstance(s.get("wall_ns"), int)
        and isinstance(s.get("mono_ns"), int)
        and not isinstance(s.get("wall_ns"), bool)
    )


def detect_jumps(
    snapshots: Iterable[Mapping[str, Any]],
    *,
    tolerance_ns: int = DEFAULT_JUMP_TOLERANCE_NS,
    slew_ppm: float = DEFAULT_SLEW_PPM,
) -> list[WallJump]:
    """Every consecutive pair of snapshots (by monotonic time) whose wall and monotonic deltas differ.

    Allowed disagreement: ``tolerance_ns`` + slewing (``slew_ppm`` of the elapsed time) + how long
    each snapshot's reading took (``read_ns``, a preemption between the two reads). Snapshots
    without integer ``wall_ns``/``mono_ns`` are ignored.
    """
    snaps = sorted((s for s in snapshots if _is_snapshot(s)), key=lambda s: int(s["mono_ns"]))
    jumps: list[WallJump] = []
    for a, b in itertools.pairwise(snaps):
        d_mono = int(b["mono_ns"]) - int(a["mono_ns"])
        diff = (int(b["wall_ns"]) - int(a["wall_ns"])) - d_mono
        read = abs(int(a.get("read_ns") or 0)) + abs(int(b.get("read_ns") or 0))
        allowed = tolerance_ns + math.ceil(slew_ppm * 1e-6 * d_mono) + read
        if abs(diff) > allowed:
            jumps.append(WallJump(jump_ns=diff, allowed_ns=allowed, before=a, after=b))
    return jumps
