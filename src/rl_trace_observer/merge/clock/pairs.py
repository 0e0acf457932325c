"""Per-artifact clock alignment inside one process: make partner events causal, as tightly as possible.

Why: profilers in ONE process keep their own clocks. Proton converts GPU timestamps with its own
reconciliation, VizTracer uses the monotonic clock plus an offset, Kineto an approximate clock, and
RL-Insight the wall clock. A Proton file a few tens of µs early makes every VizTracer→Proton flow
end before it starts, and Perfetto (v52) drops such a flow with only an info-level stat
(``flow_end_without_start``). The per-host correction (:mod:`.hosts`) cannot see this: both
files come from the same host. The files themselves can: partner events must be ordered.

Input: ``Pair(a_ns, b_ns, order)`` — an event of the partner artifact A (the reference, left as it
is) and its partner in artifact B (the one corrected). ``order="after"``: B cannot precede A (a
VizTracer flow start is stamped 0.4–1.5 µs before its Proton scope is entered; an RL-Insight stage
starts before the Torch ``record_function`` region it wraps). ``order="before"``: B cannot follow A
(the Torch region ends before its RL-Insight stage does). Pairs come from :mod:`.pair_events`.

The estimate (``policy="tight"``): the largest offset of B (B's clock minus A's) that keeps every
"after" pair causal, i.e. the minimum of ``b − a`` — B's events move back until the closest pair
touches, plus ``margin_ns`` (Perfetto orders equal timestamps by file position, so a zero gap
can still drop a flow). Before that, pairs far below the rest (``b − a`` under a low quantile by
more than ``OUTLIER_FACTOR`` × the spread, and at least ``MIN_OUTLIER_NS``) are left out as
mismatches and reported, so one bad pair cannot move the whole file. With enough pairs a straight
line under all of them is fitted too (the lower convex hull's edge above the mean time: the line
under every point with the smallest total gap), which follows a clock that drifts inside the file;
it is used when the drift it removes exceeds its own residual and 1 µs (``fit="auto"``).
``policy="minimal"`` (stage spans, whose natural gaps are large: a discrete-mode Torch profiler
start/stop sits between the two) moves B only as far as needed to satisfy every pair; when no
offset satisfies them all, it takes the middle of the two bounds, where the worst pair breaks least.

What the data can prove (tight policy): the true offset is at most ``offset_ns + margin_ns`` (no
pair can be acausal), and below it by no more than the smallest real partner delay, which the data
cannot reveal (TokenSpeed: ~0.4 µs). The
``residual_ns`` stated is the spread of the remaining gaps (their 90th percentile): how tightly
the partners sit after correction (with a constant offset left on a drifting clock, at least the
drift across the file). A residual over the tolerance, pairs that disagree (a drift
moving a constant offset by more than the tolerance over the file, mismatched pairs, stage bounds
that cannot all hold) each give a ``clock`` problem.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "AFTER",
    "BEFORE",
    "DEFAULT_MARGIN_NS",
    "DEFAULT_TOLERANCE_NS",
    "Chained",
    "Pair",
    "PairAlignment",
    "PairCorrection",
    "align_pairs",
    "chain",
]

AFTER, BEFORE = "after", "before"
POLICIES = ("tight", "minimal")
FITS = ("auto", "constant", "linear")
DEFAULT_TOLERANCE_NS = 1_000_000  # the CLI's --clock-tolerance-us default (1000 µs)
DEFAULT_MARGIN_NS = 1  # the smallest gap Chrome JSON (µs with 3 decimals) keeps
LOW_QUANTILE = 0.02  # the robust floor: up to 2 % of pairs may be mismatches
RESIDUAL_QUANTILE = 0.9
OUTLIER_FACTOR = 10
MIN_OUTLIER_NS = 10_000
MIN_SCREEN_PAIRS = 10  # fewer pairs: nothing can be called an outlier
MIN_DRIFT_PAIRS = 8
MIN_DRIFT_NS = 1_000  # drift removing less than this over the file is not worth a line
MAX_DRIFT_PPM = 1_000  # a steeper line is no clock drift (and could make corrected time run backwards)
SCREEN_SAMPLE = 4096  # points the outlier screen estimates its line and spread from
HULL_POINTS = 1024  # the drift line is fitted on at most this many lower-envelope points


class Pair(NamedTuple):
    """A partner event in A (``a_ns``) and in B (``b_ns``), both absolute ns; ``key`` names the pair.

    A tuple: a file has one pair per kernel scope (10⁵ and more), and a tuple is built 4× faster
    than a frozen dataclass.
    """

    a_ns: int
    b_ns: int
    order: str = AFTER
    key: Hashable = None

    @property
    def gap_ns(self) -> int:
        return self.b_ns - self.a_ns


@dataclass(frozen=True, slots=True)
class PairCorrection:
    """``ts_ns`` of B → ``ts_ns`` on A's timeline: ``ts − offset(ts)``.

    ``offset(ts) = offset_ns + floor((ts − at_ns) × drift_num / drift_den)``: integer arithmetic, and
    flooring keeps a line that lies under every pair under it. Picklable plain data; ``constant_ns``
    (the offset subtracted, as in :class:`.model.Correction`) is set when there is no drift.
    """

    offset_ns: int
    at_ns: int = 0
    drift_num: int = 0
    drift_den: int = 1

    @property
    def constant_ns(self) -> int | None:
        return self.offset_ns if self.drift_num == 0 else None

    @property
    def drift_ppm(self) -> float:
        return self.drift_num * 1e6 / self.drift_den

    def offset_at(self, ts_ns: int) -> int:
        return self.offset_ns + ((ts_ns - self.at_ns) * self.drift_num) // self.drift_den

    def __call__(self, ts_ns: int) -> int:
        return ts_ns - self.offset_at(ts_ns)


@dataclass(frozen=True, slots=True)
class Chained:
    """``then(first(ts))``: a per-artifact correction stacked on the per-host one (picklable)."""

    first: Callable[[int], int]
    then: Callable[[int], int]

    @property
    def constant_ns(self) -> int | None:
        a, b = getattr(self.first, "constant_ns", None), getattr(self.then, "constant_ns", None)
        return a + b if a is not None and b is not None else None

    def __call__(self, ts_ns: int) -> int:
        return self.then(self.first(ts_ns))


def chain(first: Callable[[int], int], then: Callable[[int], int]) -> Chained:
    """Apply ``first``, then ``then``; both must subtract ``constant_ns`` when they set it."""
    return Chained(first, then)


@dataclass(frozen=True)
class PairAlignment:
    """The outcome for one artifact: what to apply, the manifest record, the problems."""

    correction: PairCorrection | None  # None: nothing to apply (no pairs, or apply=False)
    record: dict[str, Any]
    problems: list[dict[str, Any]]
    outliers: tuple[Hashable, ...] = ()  # keys of the pairs left out (they stay acausal)


# ----------------------------------------------------------------------------------- statistics
def _quantile(sorted_values: Sequence[int], q: float) -> int:
    """Nearest-rank quantile of a sorted, non-empty sequence (an element of it: exact integers)."""
    i = min(len(sorted_values) - 1, max(0, int(q * len(sorted_values))))
    return sorted_values[i]


def _median(values: Sequence[float]) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _inliers(xs: Sequence[int], gs: Sequence[int]) -> list[bool] | None:
    """Which (x, gap) points agree with the rest (None: all): not far BELOW a robust line.

    The line is Theil–Sen through the medians of up to 16 time segments, so a drift does not make
    the early or late pairs look wrong and a few bad pairs do not tilt it. Points above are never
    outliers: a long partner delay cannot make a flow acausal. The line and the spread come from
    at most ``SCREEN_SAMPLE`` evenly spaced points (robust statistics need no more); every point is
    then tested against them.
    """
    n = len(xs)
    if n < MIN_SCREEN_PAIRS:
        return None
    step = -(-n // SCREEN_SAMPLE)
    sx, sg = xs[::step], gs[::step]
    m = len(sx)
    k = max(1, min(16, m // 25))
    bounds = [(i * m // k, (i + 1) * m // k) for i in range(k)]
    seg = [(sx[(lo + hi) // 2], _median(sg[lo:hi])) for lo, hi in bounds]  # xs are sorted
    slopes = [(g2 - g1) / (x2 - x1) for i, (x1, g1) in enumerate(seg) for x2, g2 in seg[i + 1 :] if x2 != x1]
    slope = _median(slopes) if slopes else 0.0
    x0 = xs[0]
    icpt = _median([g - slope * (x - x0) for x, g in seg])
    resid = sorted(g - icpt - slope * (x - x0) for x, g in zip(sx, sg, strict=True))
    low = resid[min(m - 1, int(LOW_QUANTILE * m))]
    cut = icpt + low - max(OUTLIER_FACTOR * (resid[m // 2] - low), MIN_OUTLIER_NS)
    keep = [g - slope * (x - x0) >= cut for x, g in zip(xs, gs, strict=True)]
    return None if all(keep) else keep


def _lower_hull(points: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Lower convex hull of points sorted by (x, g), exact integer cross products."""
    hull: list[tuple[int, int]] = []
    for p in points:
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (x2 - x1) * (p[1] - y1) - (y2 - y1) * (p[0] - x1) > 0:
                break
            hull.pop()
        if hull and hull[-1][0] == p[0]:
            continue  # same x, higher g: never on the lower hull
        hull.append(p)
    return hull


def _tight_line(xs: Sequence[int], gs: Sequence[int]) -> PairCorrection | None:
    """The line under every point with the least total gap: the lower hull's edge above mean x.

    Minimising ``Σ (g_i − a − b·x_i)`` under ``a + b·x_i ≤ g_i`` is a linear programme whose optimum
    is a hull edge, the one whose x-range holds the mean of x. Above ``HULL_POINTS`` points the hull
    is taken over the lowest point of each of that many runs of x (the lower envelope; exact hull
    arithmetic costs a Python loop per point), then lowered until it is under every point.
    """
    n = len(xs)
    step = -(-n // HULL_POINTS)
    points = []
    for lo in range(0, n, step):
        low = min(gs[lo : lo + step])
        points.append((xs[gs.index(low, lo, lo + step)], low))
    hull = _lower_hull(points)
    if len(hull) < 2:
        return None
    mean = sum(xs) // n
    for (x1, g1), (x2, g2) in itertools.pairwise(hull):
        if x1 <= mean <= x2 or (x2, g2) == hull[-1]:
            num, den = g2 - g1, x2 - x1
            if abs(num) * 1_000_000 > MAX_DRIFT_PPM * den:
                return None
            line = PairCorrection(g1, x1, num, den)
            below = min(_room(xs, gs, line, 1))
            return PairCorrection(g1 + below, x1, num, den) if below < 0 else line
    return None  # pragma: no cover (the loop always returns on the last edge)


# ----------------------------------------------------------------------------------- estimate
@dataclass
class _Estimate:
    correction: PairCorrection
    residual_ns: int
    lo_ns: int | None
    hi_ns: int | None
    drift: PairCorrection | None  # the line measured, applied or not
    drift_applied: bool
    const_spread_ns: int  # how far the drift moves a constant offset across the file
    outliers: list[Pair]
    acausal: int  # pairs (outliers included) still acausal after the correction


class _Side:
    """One kind of pair as integer columns sorted by B time. ``room`` = ``sign × gap``: a correction
    subtracting ``off`` keeps a pair causal while ``off × sign ≤ room`` ("after": +1, "before": −1)."""

    def __init__(self, pairs: Sequence[Pair], order: str) -> None:
        self.sign = 1 if order == AFTER else -1
        self.pairs = sorted([p for p in pairs if p.order == order], key=_B_NS)
        self.xs = [p.b_ns for p in self.pairs]
        self.gs = (
            [p.b_ns - p.a_ns for p in self.pairs] if self.sign > 0 else [p.a_ns - p.b_ns for p in self.pairs]
        )

    def screened(self) -> tuple[_Side, list[Pair]]:
        keep = _inliers(self.xs, self.gs)
        if keep is None:
            return self, []
        out = _Side((), AFTER)
        out.sign = self.sign
        out.pairs = [p for p, k in zip(self.pairs, keep, strict=True) if k]
        out.xs = [p.b_ns for p in out.pairs]
        out.gs = [g for g, k in zip(self.gs, keep, strict=True) if k]
        return out, [p for p, k in zip(self.pairs, keep, strict=True) if not k]

    def room(self, corr: PairCorrection) -> list[int]:
        return _room(self.xs, self.gs, corr, self.sign)


_B_NS = operator.itemgetter(1)  # Pair.b_ns, without a Python call per pair


def _room(xs: Sequence[int], gs: Sequence[int], corr: PairCorrection, sign: int) -> list[int]:
    """Each pair's slack after ``corr`` (negative: acausal), in one comprehension (no call per pair)."""
    if corr.drift_num == 0:
        off = corr.offset_ns * sign
        return [g - off for g in gs]
    o, at, num, den = corr.offset_ns, corr.at_ns, corr.drift_num, corr.drift_den
    return [g - sign * (o + ((x - at) * num) // den) for x, g in zip(xs, gs, strict=True)]


def _constant(after: _Side, before: _Side, policy: str, margin: int) -> PairCorrection:
    hi = min(after.gs) if after.gs else None
    lo = -min(before.gs) if before.gs else None
    if policy == "minimal":
        if hi is not None and lo is not None and lo + margin > hi - margin:
            return PairCorrection((lo + hi) // 2)  # none holds every pair: the worst one breaks least
        off = 0
        if hi is not None and off > hi - margin:
            off = hi - margin
        elif lo is not None and off < lo + margin:
            off = lo + margin
        return PairCorrection(off)
    return PairCorrection(hi - margin if hi is not None else (lo or 0) + margin)


def _estimate(pairs: Sequence[Pair], policy: str, fit: str, margin: int) -> _Estimate:
    all_after, all_before = _Side(pairs, AFTER), _Side(pairs, BEFORE)
    after, outliers = all_after.screened()
    before, out_b = all_before.screened()
    outliers += out_b
    corr = _constant(after, before, policy, margin)
    line = None
    if not before.gs and policy == "tight" and len(after.gs) >= MIN_DRIFT_PAIRS and fit != "constant":
        line = _tight_line(after.xs, after.gs)
    applied, const_spread = False, 0
    if line is not None:
        line = PairCorrection(line.offset_ns - margin, line.at_ns, line.drift_num, line.drift_den)
        const_spread = abs(line.drift_num) * (after.xs[-1] - after.xs[0]) // line.drift_den
        line_res = _quantile(sorted(after.room(line)), RESIDUAL_QUANTILE) - margin
        applied = fit == "linear" or const_spread > max(line_res, MIN_DRIFT_NS)
        corr = line if applied else corr
    kept = after.room(corr) + before.room(corr)
    residual = _quantile(sorted(kept), RESIDUAL_QUANTILE) - margin if kept else 0
    if line is not None and not applied:  # a constant offset is off by the drift it left in place
        residual = max(residual, const_spread)
    acausal = len([r for r in all_after.room(corr) + all_before.room(corr) if r < 0])
    hi = min(after.gs) if after.gs else None
    lo = -min(before.gs) if before.gs else None
    return _Estimate(corr, max(0, residual), lo, hi, line, applied, const_spread, outliers, acausal)


# ----------------------------------------------------------------------------------- record
def _us(ns: float) -> str:
    return f"{ns / 1000:+.1f} µs"


def align_pairs(
    pairs: Sequence[Pair],
    *,
    artifact: str,
    partner: str,
    pairing: str,
    policy: str = "tight",
    fit: str = "auto",
    tolerance_ns: int = DEFAULT_TOLERANCE_NS,
    margin_ns: int = DEFAULT_MARGIN_NS,
    apply: bool = True,
) -> PairAlignment:
    """Estimate B's correction from its pairs with A; the record goes into the manifest's ``clock``.

    ``artifact``/``partner``: display paths of B and A; ``pairing``: how pairs were found (e.g.
    ``"scope_id"``, ``"stage_name"``). ``apply=False`` (``--clock wall``): estimate and report only.
    """
    if policy not in POLICIES:
        raise ValueError(f"pair alignment policy must be one of {', '.join(POLICIES)}, not {policy!r}")
    if fit not in FITS:
        raise ValueError(f"pair alignment fit must be one of {', '.join(FITS)}, not {fit!r}")
    bad = [p for p in pairs if p.order not in (AFTER, BEFORE)]
    if bad:
        raise ValueError(f"{artifact}: pair order must be {AFTER!r} or {BEFORE!r}, not {bad[0].order!r}")
    raw_acausal = len([p for p in pairs if (p.b_ns < p.a_ns if p.order == AFTER else p.b_ns > p.a_ns)])
    record: dict[str, Any] = {
        "artifact": artifact,
        "partner": partner,
        "pairing": pairing,
        "method": "none",
        "applied": False,
        "offset_ns": None,
        "at_ns": None,
        "pairs": len(pairs),
        "residual_ns": None,
        "bounds_ns": None,
        "drift_ppm": None,
        "drift_applied": False,
        "outliers": 0,
        "acausal_pairs": raw_acausal,
        "raw_acausal_pairs": raw_acausal,
    }
    if not pairs:
        return PairAlignment(None, record, [])
    est = _estimate(pairs, policy, fit, margin_ns)
    corr = est.correction
    acausal = est.acausal
    record |= {
        "method": f"pairs_{policy}" + ("_drift" if est.drift_applied else ""),
        "applied": apply,
        "offset_ns": corr.offset_ns,
        "at_ns": corr.at_ns if corr.drift_num else None,
        "residual_ns": est.residual_ns,
        "bounds_ns": [est.lo_ns, est.hi_ns],
        "drift_ppm": round(est.drift.drift_ppm, 3) if est.drift is not None else None,
        "drift_applied": est.drift_applied,
        "outliers": len(est.outliers),
        "acausal_pairs": acausal if apply else raw_acausal,
    }
    problems = _problems(record, est, policy, tolerance_ns, apply)
    keys = tuple(p.key for p in est.outliers)
    return PairAlignment(corr if apply else None, record, problems, keys)


def _problems(
    record: dict[str, Any], est: _Estimate, policy: str, tolerance_ns: int, apply: bool
) -> list[dict[str, Any]]:
    path, partner, n = record["artifact"], record["partner"], record["pairs"]
    tol = f"tolerance {tolerance_ns / 1000:.0f} µs"
    out: list[str] = []
    if est.outliers:
        out.append(
            f"{len(est.outliers)} of {n} pairs with {partner} disagree with the rest by more than "
            f"{MIN_OUTLIER_NS / 1000:.0f} µs (mismatched?); left out of the fit, they stay acausal"
        )
    if est.lo_ns is not None and est.hi_ns is not None and est.lo_ns > est.hi_ns:
        out.append(
            f"pairs with {partner} cannot all hold: B would need an offset ≥ {_us(est.lo_ns)} and "
            f"≤ {_us(est.hi_ns)}; "
            + ("the starts were kept causal" if policy == "tight" else "it was split in the middle")
        )
    if policy == "tight" and est.residual_ns > tolerance_ns:
        out.append(f"pairs with {partner} spread {est.residual_ns / 1000:.1f} µs after correction ({tol})")
    if policy == "tight" and est.drift is not None and est.const_spread_ns > tolerance_ns:
        how = "corrected by a linear fit" if est.drift_applied and apply else "NOT corrected"
        out.append(
            f"clock drifts {est.drift.drift_ppm:+.1f} ppm against {partner}: "
            f"{est.const_spread_ns / 1000:.1f} µs across the file ({tol}); {how}"
        )
    if not apply and record["raw_acausal_pairs"]:
        out.append(
            f"--clock wall keeps {record['raw_acausal_pairs']} of {n} pairs with {partner} acausal "
            f"(their flows end before they start; Perfetto drops them); measured offset "
            f"{_us(est.correction.offset_ns)}: use --clock aligned"
        )
    return [{"kind": "clock", "path": path, "detail": d} for d in out]
