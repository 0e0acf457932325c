"""The data behind :mod:`.hosts`: measurements parsed from process records, corrections, host clocks.

Process records are input files: every field is checked before use and an entry that does not
have the documented shape is counted and skipped, never guessed at (docs/FORMATS.md §2).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...common.clock_offsets import (
    DEFAULT_DRIFT_ALLOWANCE_PPM,
    DEFAULT_MAX_DRIFT_PPM,
    DriftFit,
    Extrapolation,
    OffsetPoint,
    WallJump,
    between,
    combine,
    extrapolate,
    too_close,
)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Measurement:
    """One ``clock_offsets`` entry of one process: its clock minus the reference's, ± uncertainty."""

    host: str
    pid: int
    method: str
    reference_host: str | None
    reference_pid: int | None
    point: OffsetPoint
    mono_ns: int | None = None
    rounds: int | None = None
    round_trip_ns: int | None = None


def _reference(entry: Mapping[str, Any]) -> tuple[str | None, int | None]:
    host = entry.get("reference_host")
    pid = _int(entry.get("reference_pid"))
    ref = entry.get("reference")
    if not isinstance(host, str) and isinstance(ref, str) and ":" in ref:
        host, _, tail = ref.rpartition(":")
        pid = int(tail) if tail.isdigit() else pid
    return (host if isinstance(host, str) and host else None), pid


def _parse_entry(host: str, pid: int, entry: Any) -> Measurement | None:
    if not isinstance(entry, Mapping):
        return None
    method = entry.get("method", "ray_ntp")
    offset, unc, wall = (
        _int(entry.get("offset_ns")),
        _int(entry.get("uncertainty_ns")),
        _int(entry.get("wall_ns")),
    )
    if not isinstance(method, str) or offset is None or unc is None or unc < 0:
        return None
    if wall is None:
        if method != "reference":
            return None
        wall = 0
    ref_host, ref_pid = _reference(entry)
    if method == "reference":
        ref_host, ref_pid = ref_host or host, ref_pid if ref_pid is not None else pid
    elif ref_host is None:
        return None
    return Measurement(
        host=host,
        pid=pid,
        method=method,
        reference_host=ref_host,
        reference_pid=ref_pid,
        point=OffsetPoint(wall, offset, unc),
        mono_ns=_int(entry.get("mono_ns")),
        rounds=_int(entry.get("rounds")),
        round_trip_ns=_int(entry.get("round_trip_ns")),
    )


def parse_measurements(records: Iterable[Mapping[str, Any]]) -> tuple[list[Measurement], int]:
    """Every well-formed ``clock_offsets`` entry, and how many were malformed."""
    out: list[Measurement] = []
    bad = 0
    for rec in records:
        host, pid, entries = rec.get("hostname"), _int(rec.get("pid")), rec.get("clock_offsets")
        if not isinstance(host, str) or pid is None or not isinstance(entries, list):
            bad += len(entries) if isinstance(entries, list) else 0
            continue
        for entry in entries:
            m = _parse_entry(host, pid, entry)
            if m is None:
                bad += 1
            else:
                out.append(m)
    return out, bad


def profiled_windows(records: Iterable[Mapping[str, Any]]) -> list[tuple[int, float]]:
    """Monotonic-time windows between ``step_begin`` and ``step_end`` snapshots of the same process/step.

    A step that began but never ended (a killed process) is open to the end of time.
    """
    windows: list[tuple[int, float]] = []
    for rec in records:
        snaps = rec.get("clock_snapshots")
        if not isinstance(snaps, list):
            continue
        begins: dict[Any, int] = {}
        for s in sorted(
            (s for s in snaps if isinstance(s, Mapping) and _int(s.get("mono_ns")) is not None),
            key=lambda s: int(s["mono_ns"]),
        ):
            reason, step, mono = s.get("reason"), s.get("step"), int(s["mono_ns"])
            if reason == "step_begin":
                begins[step] = mono
            elif reason == "step_end" and step in begins:
                windows.append((begins.pop(step), mono))
        windows.extend((b, math.inf) for b in begins.values())
    return windows


class Correction:
    """Maps a timestamp on one host's wall clock onto the reference timeline (``ts − offset(ts)``),
    and says how well it knows the offset at every time (``offset_at``, ``bound_over``).

    The measurements are cut into segments at wall-clock jumps (``breaks``: bracket ``i``, between
    ``points[i]`` and ``points[i + 1]``, straddles one); each segment has its own drift
    (``common.clock_offsets.Extrapolation``). Inside a segment, between two measurements: the line
    through them. Before the first and after the last measurement, and on either side of a jump
    up to the midpoint: the nearest measurement carried on with its segment's drift, the bound
    growing with the distance. Picklable (plain data), so it travels to merge worker processes.
    ``constant_ns`` is set when one offset applies everywhere (callers may add an integer instead
    of calling); the bound still grows away from the measurements.
    """

    def __init__(
        self,
        points: Sequence[OffsetPoint] = (),
        breaks: frozenset[int] = frozenset(),
        *,
        allowance_ppm: float = DEFAULT_DRIFT_ALLOWANCE_PPM,
        max_drift_ppm: float = DEFAULT_MAX_DRIFT_PPM,
    ) -> None:
        self.points, self.breaks = _combine_close(sorted(points), breaks)
        self._times = [p.wall_ns for p in self.points]
        self._lines = [
            (a.wall_ns, a.offset_ns, b.offset_ns - a.offset_ns, b.wall_ns - a.wall_ns)
            for a, b in itertools.pairwise(self.points)
        ]
        self.allowance_ppm = allowance_ppm
        self._segment: list[int] = []  # point index -> index into ``extrapolations``
        self.extrapolations: list[Extrapolation] = []
        run: list[OffsetPoint] = []
        for i, p in enumerate(self.points):
            run.append(p)
            self._segment.append(len(self.extrapolations))
            if i in self.breaks or i == len(self.points) - 1:
                ex = Extrapolation.of(run, allowance_ppm=allowance_ppm, max_drift_ppm=max_drift_ppm)
                self.extrapolations.append(ex)
                run = []
        offsets = {p.offset_ns for p in self.points}
        flat = len(offsets) <= 1 and all(ex.drift == 0 for ex in self.extrapolations)
        self.constant_ns: int | None = (offsets.pop() if offsets else 0) if flat else None
        self.point_uncertainty_ns = max((p.uncertainty_ns for p in self.points), default=0)
        self.measured_range: tuple[int, int] | None = (
            (self._times[0], self._times[-1]) if self.points else None
        )
        self.uncertainty_ns = self.bound_over(*self.measured_range) if self.measured_range else 0
        """The worst bound inside the measured range (outside it: ``bound_over``)."""

    def offset_at(self, ts_ns: int) -> tuple[int, int]:
        """``(offset_ns, uncertainty_ns)`` that applies to a timestamp on this host's clock."""
        pts = self.points
        if not pts:
            return 0, 0
        j = bisect.bisect_left(self._times, ts_ns)
        if j == 0:
            return extrapolate(pts[0], ts_ns, self.extrapolations[0])
        if j == len(pts):
            return extrapolate(pts[-1], ts_ns, self.extrapolations[-1])
        b = pts[j]
        if b.wall_ns == ts_ns:
            return b.offset_ns, b.uncertainty_ns
        a = pts[j - 1]
        if j - 1 in self.breaks:  # the nearer side's own clock; a line across a jump would be fiction
            k = j - 1 if ts_ns - a.wall_ns <= b.wall_ns - ts_ns else j
            return extrapolate(pts[k], ts_ns, self.extrapolations[self._segment[k]])
        return between(a, b, ts_ns, self.allowance_ppm)

    def __call__(self, ts_ns: int) -> int:
        """``ts_ns − offset_at(ts_ns)[0]``; the hot path (once per event of a drifting host)."""
        if self.constant_ns is not None:
            return ts_ns - self.constant_ns
        j = bisect.bisect_left(self._times, ts_ns)
        if 0 < j < len(self._times) and (not self.breaks or j - 1 not in self.breaks):
            a_wall, a_off, d_off, dt = self._lines[j - 1]  # the same arithmetic as ``between``
            return ts_ns - a_off - ((ts_ns - a_wall) * d_off) // dt
        return ts_ns - self.offset_at(ts_ns)[0]

    def bound_over(self, lo_ns: int, hi_ns: int) -> int:
        """The worst ``offset_at`` bound for timestamps in ``[lo_ns, hi_ns]`` (host clock).

        The bound grows monotonically away from the measured range and peaks in the middle of a
        gap between two measurements, so the ends and the clipped midpoints are all it takes.
        """
        if not self.points:
            return 0
        lo, hi = min(lo_ns, hi_ns), max(lo_ns, hi_ns)
        times = self._times
        candidates = {lo, hi}
        first = max(bisect.bisect_right(times, lo) - 1, 0)
        last = min(bisect.bisect_left(times, hi), len(times) - 1)
        for i in range(first, last):
            mid = (times[i] + times[i + 1]) // 2
            candidates.update(min(max(c, lo), hi) for c in (mid, mid + 1))
        return max(self.offset_at(c)[1] for c in candidates)

    def ranges(self, lo_ns: int, hi_ns: int) -> list[tuple[str, int, int, int]]:
        """``[lo_ns, hi_ns]`` cut into ``(where, from_ns, to_ns, bound_ns)`` parts, ``where`` one of
        ``before`` / ``measured`` / ``after`` the measured range."""
        if self.measured_range is None or hi_ns < lo_ns:
            return []
        first, last = self.measured_range
        parts = [
            ("before", lo_ns, min(hi_ns, first - 1)),
            ("measured", max(lo_ns, first), min(hi_ns, last)),
            ("after", max(lo_ns, last + 1), hi_ns),
        ]
        return [(w, a, b, self.bound_over(a, b)) for w, a, b in parts if a <= b]

    def host_time(self, placed_ns: int, *, last: bool = False) -> int:
        """The first host-clock time this correction puts at or after ``placed_ns`` (``last``: the
        last one at or before it): its inverse, found by bisection (the correction keeps order)."""
        if self.constant_ns is not None:
            return placed_ns + self.constant_ns
        target = placed_ns + 1 if last else placed_ns
        guess, width = placed_ns + self.offset_at(placed_ns)[0], 1024
        lo, hi = guess - width, guess + width
        while self(lo) >= target and width < 1 << 62:
            width *= 8
            lo = guess - width
        while self(hi) < target and width < 1 << 62:
            width *= 8
            hi = guess + width
        while lo < hi:  # the first time with self(time) >= target
            mid = (lo + hi) // 2
            if self(mid) >= target:
                hi = mid
            else:
                lo = mid + 1
        return lo - 1 if last else lo


def _combine_close(
    points: list[OffsetPoint], breaks: frozenset[int]
) -> tuple[list[OffsetPoint], frozenset[int]]:
    """Sorted points with measurements ``too_close`` for a line combined into one (never across a
    break), and the breaks renumbered to match: every line left changes the offset by less than
    half the time it spans, so the correction keeps the order of events."""
    out: list[OffsetPoint] = []
    ends: list[int] = []  # for each point kept, the last original point it stands for
    for i, p in enumerate(points):
        out.append(p)
        ends.append(i)
        while len(out) > 1 and ends[-2] not in breaks and too_close(out[-2], out[-1]):
            last = out.pop()
            ends.pop()
            out[-1], ends[-1] = combine(out[-1], last), i
    if len(out) == len(points):
        return out, breaks
    return out, frozenset(k for k, e in enumerate(ends[:-1]) if e in breaks)


IDENTITY = Correction()


def merged_ranges(corr: Correction, spans: Iterable[tuple[int, int]]) -> dict[str, tuple[int, int, int]]:
    """``Correction.ranges`` of several ranges, merged per part: ``{where: (from, to, worst bound)}``."""
    out: dict[str, tuple[int, int, int]] = {}
    for lo, hi in spans:
        for where, a, b, bound in corr.ranges(lo, hi):
            old = out.get(where)
            out[where] = (
                (a, b, bound) if old is None else (min(old[0], a), max(old[1], b), max(old[2], bound))
            )
    return out


@dataclass
class HostClock:
    """What is known about one host's clock, and the correction the plan applies to it."""

    name: str
    method: str  # "reference", the measurement method (e.g. "ray_ntp"), or "unmeasured"
    measurements: list[Measurement] = field(default_factory=list)
    correction: Correction | None = None
    fit: DriftFit | None = None
    jumps: list[tuple[int | None, WallJump, bool]] = field(default_factory=list)
    windows_known: bool = False
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Per pid, the host-clock range its data covers: the process's recorded lifetime (planning)
    widened by the events the merge actually placed (``ClockPlan.check_placed``)."""

    def cover(self, pid: int, lo_ns: int, hi_ns: int) -> None:
        """Widen the range pid ``pid``'s data covers to include ``[lo_ns, hi_ns]``."""
        old = self.spans.get(pid)
        self.spans[pid] = (lo_ns, hi_ns) if old is None else (min(old[0], lo_ns), max(old[1], hi_ns))

    @staticmethod
    def _mark(
        jumps: list[tuple[int | None, WallJump]], windows: list[tuple[int, float]]
    ) -> list[tuple[int | None, WallJump, bool]]:
        """A jump counts as inside a profiled window when it may overlap one (or none are known)."""
        out = []
        for pid, j in jumps:
            lo, hi = j.mono_range
            inside = not windows or any(lo < w_hi and w_lo < hi for w_lo, w_hi in windows)
            out.append((pid, j, inside))
        return out

    @classmethod
    def reference(
        cls,
        name: str,
        jumps: list[tuple[int | None, WallJump]],
        windows: list[tuple[int, float]],
        own: list[Measurement] | None = None,
    ) -> HostClock:
        """The reference host: never corrected. ``own`` are measurements of responders on this very
        host (the node responder beside the reference process): the same clock, so they must find
        0 within their bound — a check of the measurement itself, reported in ``self_check``."""
        return cls(
            name, "reference", list(own or []), IDENTITY, None, cls._mark(jumps, windows), bool(windows)
        )

    @property
    def self_check(self) -> dict[str, Any] | None:
        """Reference host only: how far its own measurements put it from itself (0 within bound)."""
        if self.method != "reference" or not self.measurements:
            return None
        pts = [m.point for m in self.measurements]
        worst = max(pts, key=lambda p: abs(p.offset_ns) - p.uncertainty_ns)
        return {
            "samples": len(pts),
            "offset_range_ns": [min(p.offset_ns for p in pts), max(p.offset_ns for p in pts)],
            "uncertainty_range_ns": [min(p.uncertainty_ns for p in pts), max(p.uncertainty_ns for p in pts)],
            "zero_within_bound": abs(worst.offset_ns) <= worst.uncertainty_ns,
        }

    @classmethod
    def measured(
        cls,
        name: str,
        ms: list[Measurement],
        corr: Correction | None,
        fit: DriftFit | None,
        jumps: list[tuple[int | None, WallJump]],
        windows: list[tuple[int, float]],
    ) -> HostClock:
        method = ms[0].method if ms else "unmeasured"
        return cls(name, method, ms, corr, fit, cls._mark(jumps, windows), bool(windows))

    @property
    def best(self) -> OffsetPoint | None:
        if self.correction is None or not self.correction.points:
            return None
        return min(self.correction.points, key=lambda p: (p.uncertainty_ns, p.wall_ns))

    @property
    def offset_ns(self) -> int | None:
        if self.method == "reference":
            return 0
        best = self.best
        return best.offset_ns if best else None

    @property
    def uncertainty_ns(self) -> int | None:
        """The worst bound over the host's data (``spans``); without any known, over its measured
        range. It bounds every correction made for the host's data."""
        if self.method == "reference":
            return 0
        corr = self.correction
        if corr is None:
            return None
        if not self.spans:
            return corr.uncertainty_ns
        return max(corr.bound_over(lo, hi) for lo, hi in self.spans.values())

    def span_bounds(self, pid: int | None = None) -> dict[str, tuple[int, int, int]]:
        """``{where: (from_ns, to_ns, bound_ns)}`` over the data of ``pid`` (or of every process):
        the parts ``before``, ``measured`` and ``after`` the measured range, each with its worst
        bound (``Correction.ranges``)."""
        if self.correction is None or self.method == "reference":
            return {}
        spans = [r for p, r in self.spans.items() if pid is None or p == pid]
        return merged_ranges(self.correction, spans)

    @property
    def drift_ppm(self) -> float | None:
        return round(self.fit.drift_ppm, 3) if self.fit is not None else None

    def summary(self, *, applied: bool) -> dict[str, Any]:
        """This host's entry in the manifest's ``clock.hosts``."""
        best, fit = self.best, self.fit
        corr = self.correction if self.method != "reference" else None
        pts = corr.points if corr is not None else []
        offsets = [p.offset_ns for p in pts]
        return {
            "method": self.method,
            "applied": applied and self.correction is not None,
            "offset_ns": self.offset_ns,
            "offset_at_wall_ns": best.wall_ns if best else None,
            "uncertainty_ns": self.uncertainty_ns,
            "measured_range_ns": list(corr.measured_range) if corr and corr.measured_range else None,
            "measured_uncertainty_ns": corr.uncertainty_ns if corr else None,
            "ranges": [
                {"where": where, "range_ns": [a, b], "uncertainty_ns": bound}
                for where, (a, b, bound) in self.span_bounds().items()
            ],
            "extrapolation": [ex.as_dict() for ex in corr.extrapolations] if corr else [],
            "offset_range_ns": [min(offsets), max(offsets)] if offsets else None,
            "drift_ppm": self.drift_ppm,
            "drift_range_ppm": [round(fit.drift_lo_ppm, 3), round(fit.drift_hi_ppm, 3)] if fit else None,
            "drift_consistent": fit.consistent if fit else None,
            "samples": len(pts),
            "samples_total": len(self.measurements),
            "rounds": sum(m.rounds or 0 for m in self.measurements),
            "processes": sorted({m.pid for m in self.measurements}),
            "jumps": [
                {
                    "pid": pid,
                    "jump_ns": j.jump_ns,
                    "wall_range_ns": list(j.wall_range),
                    "inside_profiled_window": ins,
                }
                for pid, j, ins in self.jumps
            ],
            "profiled_windows_known": self.windows_known,
            **({"self_check": self.self_check} if self.self_check is not None else {}),
        }
