"""The data behind ``clock_align``: measurements parsed from process records, corrections, host clocks.

Process records are input files: every field is checked before use and an entry that does not
have the documented shape is counted and skipped, never guessed at (docs/FORMATS.md §2).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..capture.clock_sync import DriftFit, OffsetPoint, WallJump, interpolate


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
    """Maps a timestamp on one host's wall clock onto the reference timeline (``ts − offset(ts)``).

    Picklable (plain data), so it can travel to merge worker processes. ``constant_ns`` is set
    when one offset applies everywhere: callers may then add an integer instead of calling.
    """

    def __init__(self, points: Sequence[OffsetPoint] = (), breaks: frozenset[int] = frozenset()) -> None:
        self.points = sorted(points)
        self._times = [p.wall_ns for p in self.points]
        self.breaks = breaks  # bracket i (points[i], points[i+1]) straddles a wall jump: no drift there
        self.constant_ns: int | None = self.points[0].offset_ns if len(self.points) == 1 else None
        if not self.points:
            self.constant_ns = 0
        self.uncertainty_ns = max((p.uncertainty_ns for p in self.points), default=0)

    def offset_at(self, ts_ns: int) -> tuple[int, int]:
        """``(offset_ns, uncertainty_ns)`` that applies to a timestamp on this host's clock."""
        if self.constant_ns is not None:
            return self.constant_ns, self.uncertainty_ns
        pts = self.points
        if self.breaks and pts[0].wall_ns < ts_ns < pts[-1].wall_ns:
            i = bisect.bisect_right(self._times, ts_ns) - 1
            if i in self.breaks:  # the nearer measurement; a line across a jump would be fiction
                near = pts[i] if ts_ns - pts[i].wall_ns <= pts[i + 1].wall_ns - ts_ns else pts[i + 1]
                return near.offset_ns, near.uncertainty_ns
        return interpolate(pts, ts_ns, self._times)

    def __call__(self, ts_ns: int) -> int:
        if self.constant_ns is not None:
            return ts_ns - self.constant_ns
        return ts_ns - self.offset_at(ts_ns)[0]

    def for_window(self, start_ns: int, end_ns: int) -> Correction | LinearCorrection:
        """A faster equivalent for timestamps in ``[start_ns, end_ns]`` (one artifact's span).

        An artifact usually lies between two measurements: then its correction is a constant (a
        ``Correction`` with ``constant_ns`` set) or one straight line (``LinearCorrection``), with
        no search per event. Both are picklable.
        """
        pts = self.points
        if self.constant_ns is not None:
            return self
        if self.breaks or end_ns < start_ns or any(start_ns <= t <= end_ns for t in self._times):
            return self
        if end_ns < pts[0].wall_ns or start_ns > pts[-1].wall_ns:
            p = pts[0] if end_ns < pts[0].wall_ns else pts[-1]
            return Correction([p])
        j = bisect.bisect_left(self._times, start_ns)
        return LinearCorrection(pts[j - 1], pts[j])


class LinearCorrection:
    """The straight line between two measurements: the same integer arithmetic as ``interpolate``."""

    __slots__ = ("a_off", "a_wall", "d_off", "dt", "uncertainty_ns")
    constant_ns = None

    def __init__(self, a: OffsetPoint, b: OffsetPoint) -> None:
        self.a_wall, self.a_off = a.wall_ns, a.offset_ns
        self.d_off, self.dt = b.offset_ns - a.offset_ns, b.wall_ns - a.wall_ns
        self.uncertainty_ns = max(a.uncertainty_ns, b.uncertainty_ns) + 1

    def __call__(self, ts_ns: int) -> int:
        return ts_ns - (self.a_off + ((ts_ns - self.a_wall) * self.d_off) // self.dt)

    def __getstate__(self) -> tuple[int, int, int, int, int]:
        return self.a_off, self.a_wall, self.d_off, self.dt, self.uncertainty_ns

    def __setstate__(self, state: tuple[int, int, int, int, int]) -> None:
        self.a_off, self.a_wall, self.d_off, self.dt, self.uncertainty_ns = state


IDENTITY = Correction()


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
        if self.method == "reference":
            return 0
        return self.correction.uncertainty_ns if self.correction is not None else None

    @property
    def drift_ppm(self) -> float | None:
        return round(self.fit.drift_ppm, 3) if self.fit is not None else None

    def summary(self, *, applied: bool) -> dict[str, Any]:
        """This host's entry in the manifest's ``clock.hosts``."""
        best, fit = self.best, self.fit
        pts = self.correction.points if self.correction is not None and self.method != "reference" else []
        offsets = [p.offset_ns for p in pts]
        return {
            "method": self.method,
            "applied": applied and self.correction is not None,
            "offset_ns": self.offset_ns,
            "offset_at_wall_ns": best.wall_ns if best else None,
            "uncertainty_ns": self.uncertainty_ns,
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
