"""The one place the pipeline asks for clock corrections (implemented in :mod:`..clock.hosts`).

Each artifact gets ONE ``ts_ns -> ts_ns`` correction, chosen by its owning process (every source
of a host shares its host's clock), applied by the ``correct_time`` pass. A constant offset stays a
plain integer so the pass is one addition per event; anything else travels to the worker as the
correction object itself (picklable), never as a closure.

The merged trace states what was done (process labels, the JSON header's ``clock_alignment``), and
after the workers are done :meth:`ClockChoice.check_causality` checks where the events landed
against the hosts' bounds there (``ClockPlan.check_placed``: outside the measured range they grow)
and the corrected data against the structure it must have (:mod:`..clock.causality`), from the
small span summaries the workers sent back (:mod:`..clock.probe`) — no second pass over the files.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..clock.correction import IDENTITY, TimeCorrection
from ..clock.probe import SpanSummaries, SpanSummary
from ..formats import format_of
from ..formats.base import REGIONS, STAGES, ClockEvidence
from ..plan.plan import Plan
from ..timeline.model import Problem, ProcessInfo, ProcessKey

if TYPE_CHECKING:
    from ..job.spec import Outcome


@dataclass
class ClockChoice:
    section: dict[str, Any] = field(default_factory=lambda: {"mode": "wall"})
    problems: list[Problem] = field(default_factory=list)
    _plan: Any = None

    def correction_for(self, key: ProcessKey | None) -> TimeCorrection:
        if self._plan is None or key is None:
            return IDENTITY
        corr = self._plan.correction_for(key.host, key.pid if key.pid >= 0 else None)
        const = getattr(corr, "constant_ns", None)
        if const is not None:
            return IDENTITY if const == 0 else TimeCorrection(offset_ns=-int(const), method=self._plan.mode)
        return TimeCorrection(fn=corr, method=self._plan.mode)

    def title(self, proc: ProcessInfo) -> str:
        """A process's name in the trace, with its host's clock correction appended when there is
        something to state: several hosts, and at least one of them measured."""
        cp = self._plan
        if cp is None or len(cp.hosts) < 2 or cp.worst_uncertainty_ns is None:
            return proc.label
        if all(h.method in ("reference", "unmeasured") for h in cp.hosts.values()):
            return proc.label
        return f"{proc.label} · {cp.host_label(proc.key.host, proc.key.pid)}"

    def titles(self, plan: Plan) -> dict[int, str]:
        return {p.merged_pid: self.title(p) for p in plan.processes.values()}

    def trace_metadata(self) -> dict[str, Any]:
        """The merged trace's own statement of its alignment: method and worst uncertainty."""
        if self._plan is None:
            return {"clock_alignment": self.section.get("mode", "wall"), "clock_worst_uncertainty_ns": None}
        meta: dict[str, Any] = self._plan.trace_metadata()
        return meta

    def pftrace_metadata(self) -> bytes:
        """The same statement for a ``.pftrace``: one packet of Chrome metadata, which Perfetto puts in
        its ``metadata`` table as ``cr-rl_trace_clock_*`` rows (checked in the v52 engine)."""
        from ..output._pbwire import ld, text, uint

        entries = b""
        for name, value in self.trace_metadata().items():
            if isinstance(value, list):
                value = ",".join(map(str, value))
            if isinstance(value, bool) or value is None:
                continue
            # ChromeMetadata: name = 1, string_value = 2, int_value = 4
            field = uint(4, value) if isinstance(value, int) and value >= 0 else text(2, str(value))
            entries += ld(2, text(1, f"rl_trace_{name}") + field)
        return ld(1, ld(5, entries))  # Trace.packet = 1 → TracePacket.chrome_events = 5

    def check_causality(self, plan: Plan, outcomes: Mapping[int, Outcome]) -> list[Problem]:
        """Run the causality checks on what the workers sent back; fold them into the section.

        Returns the new ``clock`` problems (the caller adds them to the merge's problems).
        """
        cp = self._plan
        if cp is None:
            return []
        before = len(cp.problems)
        cp.check_placed(_placed(plan, outcomes))
        for report in _causality_reports(plan, outcomes, self, cp.tolerance_ns):
            cp.add_causality(report)
        self.section.update(cp.manifest_section())  # hosts' bounds now cover where events landed
        new = [_problem(p) for p in cp.problems[before:]]
        self.problems.extend(new)
        return new


def _placed(plan: Plan, outcomes: Mapping[int, Outcome]) -> dict[tuple[str, int], tuple[int, int]]:
    """Per owning process, the first event start and the last start or span end the workers placed
    (merged timeline ns): where its host's correction had to hold."""
    out: dict[tuple[str, int], tuple[int, int]] = {}
    for index, o in outcomes.items():
        owner = plan.artifacts[index].info.owner
        if owner is None or o.min_ts is None:
            continue
        hi = max(o.max_ts if o.max_ts is not None else o.min_ts, _max_end(o.spans, o.min_ts))
        old = out.get((owner.host, owner.pid), (o.min_ts, hi))
        out[(owner.host, owner.pid)] = (min(old[0], o.min_ts), max(old[1], hi))
    return out


def _problem(p: Mapping[str, Any]) -> Problem:
    return Problem("clock", str(p.get("path") or p.get("host") or "(clock)"), str(p.get("detail", "")))


def _causality_reports(
    plan: Plan, outcomes: Mapping[int, Outcome], clock: ClockChoice, tolerance_ns: int
) -> list[Any]:
    """Stage alignment per process and Torch file, nesting where a correction could break it, and
    durations where a correction was not a constant (only those can turn negative)."""
    from ..clock.causality import CausalityReport, check_nesting, check_stage_alignment

    # Only a process with Torch regions has its stages checked, and only a track spans of several
    # artifacts (or a varying correction) share has its nesting checked: the workers' summaries
    # (columns, probe.SpanSummaries) become tuples for those alone — an RL-Insight log of a 1M-event
    # step holds ~19k spans, a run of such logs none of either.
    regions: list[tuple[str, list[SpanSummary]]] = []  # (torch file, its regions)
    region_pids: set[int] = set()
    track_files: dict[tuple[int, int], set[int]] = defaultdict(set)
    varies: dict[int, bool] = {}
    tracks_of: dict[int, set[tuple[int, int]]] = {}
    for index, out in outcomes.items():
        art = plan.artifacts[index]
        owner = plan.processes.get(art.info.owner) if art.info.owner else None
        varies[index] = owner is not None and clock.correction_for(owner.key).fn is not None
        if _causality(art.info.kind) == REGIONS and out.spans:
            region_pids.update(s[3] for s in out.spans)
        tracks_of[index] = _tracks(out.spans)
        for track in tracks_of[index]:
            track_files[track].add(index)
    checked = {t for t, files in track_files.items() if len(files) > 1 or any(varies[i] for i in files)}
    stages: dict[int, list[SpanSummary]] = defaultdict(list)  # merged pid -> RL-Insight spans
    tracks: dict[tuple[int, int], list[tuple[int, bool, SpanSummary]]] = defaultdict(list)
    durations = CausalityReport()
    for index, out in sorted(outcomes.items()):
        art = plan.artifacts[index]
        varying = varies[index]
        negative = out.stats.get("negative_durations", 0)
        if varying:
            durations.checked += out.phases.get("X", 0)
        if negative:
            durations.fail(
                f"{negative} span(s) had their end corrected to before their start (the clock "
                "correction is not monotonic here: a wall-clock jump?); kept with duration 0",
                art.info.path,
            )
            durations.failed += negative - 1
        role = _causality(art.info.kind)
        if not (role == REGIONS or (role == STAGES and region_pids) or checked & tracks_of[index]):
            continue  # nothing of it is checked: its summaries stay columns
        for span in out.spans:
            if role == STAGES and span[3] in region_pids:
                stages[span[3]].append(span)
            if (span[3], span[4]) in checked:
                tracks[(span[3], span[4])].append((index, varying, span))
        if role == REGIONS and out.spans:
            regions.append((art.info.path, list(out.spans)))
    reports: list[Any] = [durations]
    stage_events: dict[int, list[dict[str, Any]]] = {}  # made once a process, however many Torch files
    for path, regs in regions:
        for pid, group in _by_pid(regs).items():
            if stages.get(pid):
                if pid not in stage_events:
                    stage_events[pid] = [_as_event(s) for s in stages[pid]]
                regions_of = [_as_event(s) for s in group]
                reports.append(check_stage_alignment(stage_events[pid], regions_of, tolerance_ns, path=path))
    for entries in tracks.values():
        if len({i for i, _, _ in entries}) > 1 or any(v for _, v, _ in entries):
            reports.append(check_nesting([_as_event(s) for _, _, s in entries], tolerance_ns))
    return reports


def _tracks(spans: SpanSummaries | list[SpanSummary]) -> set[tuple[int, int]]:
    if isinstance(spans, SpanSummaries):
        return spans.tracks()
    return {(s[3], s[4]) for s in spans}


def _max_end(spans: SpanSummaries | list[SpanSummary], floor: int) -> int:
    if isinstance(spans, SpanSummaries):
        end = spans.max_end()
        return floor if end is None else max(end, floor)
    return max([floor, *(s[2] for s in spans)])


def _causality(kind: str) -> str | None:
    """The format's part in the stage checks: its spans are stages, or regions that sit in them."""
    fmt = format_of(kind)
    return fmt.causality if isinstance(fmt, ClockEvidence) else None


def _as_event(s: SpanSummary) -> dict[str, Any]:
    name, start, end, pid, tid = s
    return {"ph": "X", "name": name, "ts_ns": start, "dur_ns": end - start, "pid": pid, "tid": tid}


def _by_pid(spans: list[SpanSummary]) -> dict[int, list[SpanSummary]]:
    out: dict[int, list[SpanSummary]] = defaultdict(list)
    for s in spans:
        out[s[3]].append(s)
    return out


def clock_plan(plan: Plan, mode: str, tolerance_us: float = 1000.0) -> ClockChoice:
    records = [p.record for p in plan.processes.values() if p.record]
    try:
        from ..clock.hosts import plan as align
    except ImportError:  # clock alignment not installed in this build: raw wall clocks
        return ClockChoice()
    cp = align(records, mode=mode, tolerance_us=tolerance_us)
    problems = [_problem(p) for p in cp.problems]
    return ClockChoice(cp.manifest_section(), problems, cp)
