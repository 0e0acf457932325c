"""Clock correction for the merged timeline: one pure plan from process records, applied per host.

Every source stamps time with its own host's wall clock. The capture layer measures each host's
offset against one reference clock (``integrations.ray.clock_sync``: NTP-style exchanges whose
results land in the process records' ``clock_offsets``); this module turns those records into one
correction per host and states what it did and how sure it is.

API (all the merge pipeline needs)::

    cp = plan(records, mode="auto", tolerance_us=1000.0)   # records: process-record dicts as written
    fix = cp.correction_for(host, pid)      # Correction: ts_ns (host wall) -> ts_ns (reference)
    fix(ts_ns); fix.offset_at(ts_ns)        # the corrected time; (offset, bound) at that time
    cp.manifest_section()                   # the manifest's "clock" section (JSON-ready dict)
    cp.problems                             # [{"kind": "clock", "path", "detail", "host"}]
    cp.trace_metadata(); cp.host_args(host); cp.host_label(host, pid)   # what the trace states
    cp.check_placed({(host, pid): (lo_ns, hi_ns)})   # after placing events: bounds where they are
    cp.add_causality(report)                # fold a ``causality`` check into problems/manifest

``mode``: ``"wall"`` keeps raw wall clocks (and raises a ``clock`` problem for every host measured
off by more than the tolerance), ``"aligned"`` corrects every measured host, ``"auto"`` is aligned
when any measurement exists, else wall (the CLI default). Within a host every source (RL-Insight,
Torch, VizTracer, Proton) gets the same correction, so ask for it by the owning process.

The correction (``model.Correction``): one measurement → a constant shift; two or more → the
straight line between the two measurements that bracket each timestamp (drift); outside the
measured range the nearest measurement carried on with the fitted drift where one fits, the bound
growing with the distance (drift uncertainty × distance, plus ``drift_allowance_ppm`` for drift
that wanders; ``common.clock_offsets``); never a line across a wall-clock jump seen in the snapshots.
Measurements over the tolerance are left out when better ones exist.

What is stated: per host, the worst bound over the time its data covers — its processes' recorded
lifetimes while planning (process names and the trace header are written then), widened by where
the merge actually placed their events (``check_placed``, after reading) — split into the parts
before, inside and after the measured range (manifest ``hosts.<h>.ranges``). Placed events whose
bound exceeds the tolerance are a ``clock`` problem naming the host, the time range and the bound.
So the host's stated uncertainty bounds every correction made for its events.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ...capture.recorder import expected_event_log
from ...common.clock_offsets import (
    DEFAULT_DRIFT_ALLOWANCE_PPM,
    DEFAULT_MAX_DRIFT_PPM,
    WallJump,
    detect_jumps,
    fit_drift,
)
from .model import (
    IDENTITY,
    Correction,
    HostClock,
    Measurement,
    merged_ranges,
    parse_measurements,
    profiled_windows,
)

MODES = ("auto", "aligned", "wall")
DEFAULT_TOLERANCE_US = 1000.0


@dataclass
class ClockPlan:
    """The outcome of ``plan``: per-host corrections, the manifest section and the problems."""

    mode: str
    tolerance_ns: int
    reference_host: str | None
    reference_pid: int | None
    hosts: dict[str, HostClock]
    process_corrections: dict[tuple[str, int], Correction]
    problems: list[dict[str, Any]] = field(default_factory=list)
    causality: dict[str, int] = field(default_factory=lambda: {"checked": 0, "failed": 0})
    allowance_ppm: float = DEFAULT_DRIFT_ALLOWANCE_PPM
    placed: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)

    def correction_for(self, host: str | None, pid: int | None = None) -> Correction:
        """The correction for a process's artifacts; the identity in wall mode or when unmeasured."""
        if self.mode == "wall" or host is None:
            return IDENTITY
        if pid is not None and (host, pid) in self.process_corrections:
            return self.process_corrections[(host, pid)]
        hc = self.hosts.get(host)
        return hc.correction if hc is not None and hc.correction is not None else IDENTITY

    @property
    def worst_uncertainty_ns(self) -> int | None:
        """The largest placement error bound over measured hosts; ``None`` when nothing was measured.

        Aligned: the measurement bound. Wall: the uncorrected offset plus its bound, because raw
        wall-clock placement is off by the whole offset.
        """
        wall = self.mode == "wall"
        values = [
            h.uncertainty_ns + (abs(h.offset_ns or 0) if wall else 0)
            for h in self.hosts.values()
            if h.uncertainty_ns is not None
        ]
        return max(values) if values else None

    @property
    def unmeasured_hosts(self) -> list[str]:
        """Hosts whose placement nobody measured (their error is unknown, not zero)."""
        return sorted(name for name, h in self.hosts.items() if h.method == "unmeasured")

    def manifest_section(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "reference": {"host": self.reference_host, "pid": self.reference_pid},
            "tolerance_us": self.tolerance_ns / 1000,
            "drift_allowance_ppm": self.allowance_ppm,
            "max_drift_ppm": DEFAULT_MAX_DRIFT_PPM,
            "worst_uncertainty_ns": self.worst_uncertainty_ns,
            "unmeasured_hosts": self.unmeasured_hosts,
            "hosts": {
                name: hc.summary(applied=self.mode == "aligned") for name, hc in sorted(self.hosts.items())
            },
            "causality": dict(self.causality),
        }

    def trace_metadata(self) -> dict[str, Any]:
        """One metadata entry for the merged trace: the method and the worst uncertainty."""
        return {
            "clock_alignment": self.mode,
            "clock_reference_host": self.reference_host,
            "clock_worst_uncertainty_ns": self.worst_uncertainty_ns,
            "clock_unmeasured_hosts": self.unmeasured_hosts,
            "clock_tolerance_ns": self.tolerance_ns,
        }

    def host_args(self, host: str) -> dict[str, Any]:
        """Per-process args (Perfetto shows them on the process) stating its host's correction."""
        hc = self.hosts.get(host)
        if hc is None:
            return {"clock_method": "unmeasured", "clock_applied": False}
        return {
            "clock_method": hc.method,
            "clock_applied": self.mode == "aligned" and hc.correction is not None,
            "clock_offset_ns": hc.offset_ns,
            "clock_uncertainty_ns": hc.uncertainty_ns,
            "clock_drift_ppm": hc.drift_ppm,
        }

    def host_label(self, host: str, pid: int | None = None) -> str:
        """A short suffix for process names, e.g. ``clock −120.004 ms ±0.151 ms``: the offset and
        the bound inside the measured range, then the worst bound where the data of process ``pid``
        (of the whole host when None) lies outside it, e.g. ``(±1.930 ms extrapolated)``."""
        hc = self.hosts.get(host)
        if hc is None or hc.offset_ns is None:
            return "clock unmeasured"
        if hc.method == "reference":
            return "clock reference"
        verb = "" if self.mode == "aligned" else "raw, off "
        corr = hc.correction
        unc = corr.uncertainty_ns if corr is not None else 0
        label = f"clock {verb}{hc.offset_ns / 1e6:+.3f} ms ±{unc / 1e6:.3f} ms"
        outside = [b for w, (_, _, b) in hc.span_bounds(pid).items() if w != "measured"]
        if outside:
            label += f" (±{max(outside) / 1e6:.3f} ms extrapolated)"
        return label

    def check_placed(self, placed: Mapping[tuple[str, int], tuple[int, int]]) -> list[dict[str, Any]]:
        """Where the merge placed each process's events (``(host, pid) -> (first, last)`` ns on the
        merged timeline): widen the hosts' data ranges to include them, and return (and keep) a
        ``clock`` problem for every host whose placed events lie where the bound exceeds the
        tolerance, naming the time range and the bound."""
        touched: set[str] = set()
        for (host, pid), (lo, hi) in placed.items():
            hc = self.hosts.get(host)
            if hc is None or hc.correction is None or hc.method in ("reference", "unmeasured"):
                continue
            corr = self.correction_for(host, pid)
            if self.mode == "aligned":  # back to the host's own clock, where the bounds are known
                lo, hi = corr.host_time(lo), corr.host_time(hi, last=True)
            hc.cover(pid, lo, hi)
            old = self.placed.get((host, pid))
            self.placed[(host, pid)] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
            touched.add(host)
        known = {p["detail"] for p in self.problems}  # called again: nothing twice
        new = [p for host in sorted(touched) for p in self._range_problems(host) if p["detail"] not in known]
        self.problems.extend(new)
        return new

    def _range_problems(self, host: str) -> list[dict[str, Any]]:
        hc, tol = self.hosts[host], self.tolerance_ns
        if self.mode != "aligned" or hc.correction is None or hc.correction.measured_range is None:
            return []
        parts: dict[str, tuple[int, int, int]] = {}
        for (h, pid), span in self.placed.items():
            if h == host:
                for where, (a, b, bound) in merged_ranges(self.correction_for(h, pid), [span]).items():
                    old = parts.get(where, (a, b, bound))
                    parts[where] = (min(old[0], a), max(old[1], b), max(old[2], bound))
        first, last = hc.correction.measured_range
        out = []
        for where, (a, b, bound) in parts.items():
            if bound <= tol or (where == "measured" and hc.correction.point_uncertainty_ns > tol):
                continue  # (a measurement over the tolerance is its own problem, see _host_problems)
            events = f"events from {_utc(a)} to {_utc(b)} (its clock)"
            if where == "before":
                why = f"{events} lie up to {(first - a) / 1e9:.1f} s before its first clock measurement"
            elif where == "after":
                why = f"{events} lie up to {(b - last) / 1e9:.1f} s after its last clock measurement"
            else:
                why = (
                    f"{events} lie between clock measurements too far apart for a drift allowance "
                    f"of ±{self.allowance_ppm:g} ppm"
                )
            out.append(
                _problem(
                    f"host {host}: {why}: their correction is known only to ±{bound / 1000:.0f} µs, over "
                    f"the tolerance of {tol / 1000:.0f} µs (measure offsets at capture start, end and "
                    "periodically: integrations.ray.clock_sync; or raise --clock-tolerance-us)",
                    host,
                )
            )
        return out

    def add_causality(self, report: Any) -> None:
        """Fold a ``causality.CausalityReport`` into the counts and the problems."""
        self.causality["checked"] += int(report.checked)
        self.causality["failed"] += int(report.failed)
        self.problems.extend(report.problems)


def _problem(detail: str, host: str | None = None) -> dict[str, Any]:
    return {"kind": "clock", "path": None, "detail": detail, "host": host}


def _utc(wall_ns: int) -> str:
    return (
        datetime.fromtimestamp(wall_ns / 1e9, tz=UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def _choose_reference(meas: list[Measurement]) -> tuple[str | None, int | None]:
    """The reference most measurements (and ``method: reference`` markers) name."""
    counts: dict[tuple[str, int | None], int] = defaultdict(int)
    for m in meas:
        if m.reference_host is not None:
            counts[(m.reference_host, m.reference_pid)] += 1
    if not counts:
        return None, None
    return max(counts, key=lambda k: (counts[k], k[0]))


def plan(
    records: Iterable[Mapping[str, Any]],
    *,
    mode: str = "auto",
    tolerance_us: float = DEFAULT_TOLERANCE_US,
    drift_allowance_ppm: float = DEFAULT_DRIFT_ALLOWANCE_PPM,
) -> ClockPlan:
    """Build the clock plan from process records (dicts as written by the capture layer)."""
    if mode not in MODES:
        raise ValueError(f"clock mode must be one of {', '.join(MODES)}, not {mode!r}")
    if not tolerance_us >= 0:
        raise ValueError(f"clock tolerance must be a non-negative number of µs, not {tolerance_us!r}")
    if not 0 <= drift_allowance_ppm <= DEFAULT_MAX_DRIFT_PPM:
        raise ValueError(
            f"drift allowance must be 0 to {DEFAULT_MAX_DRIFT_PPM:g} ppm, not {drift_allowance_ppm!r}"
        )
    recs = [r for r in records if isinstance(r, Mapping)]
    tol = int(tolerance_us * 1000)
    problems: list[dict[str, Any]] = []
    meas, bad = parse_measurements(recs)
    if bad:
        problems.append(_problem(f"{bad} malformed clock_offsets entries were ignored"))
    ref_host, ref_pid = _choose_reference(meas)
    others = {m.reference_host for m in meas if m.reference_host not in (None, ref_host)}
    if others:
        problems.append(
            _problem(
                f"offsets were measured against several reference hosts ({', '.join(sorted(others))} "
                f"besides {ref_host}); only those against {ref_host} are used"
            )
        )
    meas = [m for m in meas if m.method != "reference" and m.reference_host == ref_host]
    measured = bool(meas)
    resolved = ("aligned" if measured else "wall") if mode == "auto" else mode
    hosts, by_process = _build_hosts(recs, meas, ref_host, tol, drift_allowance_ppm)
    cp = ClockPlan(
        resolved, tol, ref_host, ref_pid, hosts, by_process, problems, allowance_ppm=drift_allowance_ppm
    )
    _host_problems(cp, measured)
    return cp


def _records_by_host(records: list[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    out: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        if isinstance(r.get("hostname"), str):
            out[r["hostname"]].append(r)
    return out


def _jumps_of(recs: list[Mapping[str, Any]]) -> list[tuple[int | None, WallJump]]:
    out: list[tuple[int | None, WallJump]] = []
    for r in recs:
        snaps = r.get("clock_snapshots")
        if isinstance(snaps, list):
            pid = r.get("pid") if isinstance(r.get("pid"), int) else None
            out.extend((pid, j) for j in detect_jumps(s for s in snaps if isinstance(s, Mapping)))
    return out


def _lifetime(record: Mapping[str, Any]) -> tuple[int, int] | None:
    """The host-clock range a process record's data can lie in: from its first to its last clock
    reading (the ``start`` snapshot to the latest rewrite). None for a record of a process that
    wrote nothing (a clock responder): it has no data to correct."""
    if expected_event_log(record) is None and not record.get("artifacts"):
        return None
    snaps = record.get("clock_snapshots")
    readings = [*(snaps if isinstance(snaps, list) else []), record.get("clock_at_update")]
    walls = [
        s["wall_ns"]
        for s in readings
        if isinstance(s, Mapping) and isinstance(s.get("wall_ns"), int) and not isinstance(s["wall_ns"], bool)
    ]
    return (min(walls), max(walls)) if walls else None


def _correction(
    ms: list[Measurement], jumps: list[tuple[int | None, WallJump]], tol: int, allowance_ppm: float
) -> Correction:
    """Measurements within tolerance when any are (a bad round trip must not widen the bound)."""
    good = [m for m in ms if m.point.uncertainty_ns <= tol] or ms
    good.sort(key=lambda m: m.point)
    breaks = set()
    for i, (a, b) in enumerate(itertools.pairwise(good)):
        if a.mono_ns is None or b.mono_ns is None:
            continue
        lo, hi = sorted((a.mono_ns, b.mono_ns))  # a backward jump reverses their wall-clock order
        if any(lo < j.mono_range[1] and j.mono_range[0] < hi for _, j in jumps):
            breaks.add(i)
    return Correction([m.point for m in good], frozenset(breaks), allowance_ppm=allowance_ppm)


def _build_hosts(
    records: list[Mapping[str, Any]],
    meas: list[Measurement],
    ref_host: str | None,
    tol: int,
    allowance_ppm: float,
) -> tuple[dict[str, HostClock], dict[tuple[str, int], Correction]]:
    by_host: dict[str, list[Measurement]] = defaultdict(list)
    by_proc: dict[tuple[str, int], list[Measurement]] = defaultdict(list)
    for m in meas:
        by_host[m.host].append(m)
        by_proc[(m.host, m.pid)].append(m)
    recs = _records_by_host(records)
    hosts: dict[str, HostClock] = {}
    for name in sorted(set(recs) | set(by_host) | ({ref_host} if ref_host else set())):
        jumps = _jumps_of(recs.get(name, []))
        windows = profiled_windows(recs.get(name, []))
        if name == ref_host:
            hosts[name] = HostClock.reference(name, jumps, windows, by_host.get(name))
            continue
        ms = by_host.get(name, [])
        corr = _correction(ms, jumps, tol, allowance_ppm) if ms else None
        fit = fit_drift(m.point for m in ms) if len(ms) > 1 else None
        hc = hosts[name] = HostClock.measured(name, ms, corr, fit, jumps, windows)
        for rec in recs.get(name, []):
            life, pid = _lifetime(rec), rec.get("pid")
            if life is not None and isinstance(pid, int):
                hc.cover(pid, *life)
    per_proc = {
        key: _correction(ms, _jumps_of(recs.get(key[0], [])), tol, allowance_ppm)
        for key, ms in by_proc.items()
        if key[0] != ref_host and len({m.pid for m in by_host[key[0]]}) > 1  # else same as the host's
    }
    return hosts, per_proc


def _measured(hc: HostClock) -> int:
    return hc.correction.point_uncertainty_ns if hc.correction is not None else 0


def _measurement_problems(
    name: str, corr: Correction, tol: int, allowance_ppm: float
) -> list[dict[str, Any]]:
    """A measurement bound over the tolerance; measurements that refute the drift model."""
    out = []
    if corr.point_uncertainty_ns > tol:
        out.append(
            _problem(
                f"host {name}: clock offset known only to ±{corr.point_uncertainty_ns / 1000:.0f} µs, "
                f"over the tolerance of {tol / 1000:.0f} µs (raise --clock-tolerance-us to accept it)",
                name,
            )
        )
    if not all(ex.consistent for ex in corr.extrapolations):
        out.append(
            _problem(
                f"host {name}: its clock measurements fit no drift line within the allowance of "
                f"±{allowance_ppm:g} ppm (a clock step no snapshot saw, or a drift that changed): "
                "bounds between them are not guaranteed and nothing is extrapolated",
                name,
            )
        )
    return out


def _host_problems(cp: ClockPlan, measured: bool) -> None:
    """Unmeasured hosts, bounds over tolerance, raw clocks left off, jumps inside profiled windows."""
    tol = cp.tolerance_ns
    multi_host = len(cp.hosts) > 1
    for name, hc in sorted(cp.hosts.items()):
        if hc.method == "unmeasured" and (multi_host or measured):
            cp.problems.append(
                _problem(
                    f"host {name} was not measured against the reference clock: its events keep raw "
                    "wall-clock times (only as good as NTP); enable the Ray clock sync on that node",
                    name,
                )
            )
        elif hc.correction is not None and hc.method != "reference":
            cp.problems.extend(_measurement_problems(name, hc.correction, tol, cp.allowance_ppm))
        if cp.mode == "wall" and hc.offset_ns is not None and hc.method != "reference":
            err = abs(hc.offset_ns) + (hc.uncertainty_ns or 0)
            if err > tol:
                cp.problems.append(
                    _problem(
                        f"--clock wall leaves host {name} {hc.offset_ns / 1e6:+.3f} ms off the reference "
                        f"clock (measured ±{_measured(hc) / 1000:.0f} µs); use --clock aligned",
                        name,
                    )
                )
        check = hc.self_check
        if check is not None and not check["zero_within_bound"]:
            cp.problems.append(
                _problem(
                    f"host {name}: responders on the reference host measured its own clock "
                    f"{check['offset_range_ns']} ns off, outside their bound: the measurement is unreliable",
                    name,
                )
            )
        for pid, jump, inside in hc.jumps:
            if inside:
                cp.problems.append(
                    _problem(f"host {name} pid {pid}: {jump.describe()} inside a profiled window", name)
                )
    if not measured and multi_host and cp.mode == "aligned":
        cp.problems.append(_problem("--clock aligned was asked for but no host has clock measurements"))
