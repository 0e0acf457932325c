"""What the watch learns from the appended lines: step markers, bad lines, how far events reach.

Markers are read exactly as the planner reads them from an event log (``capture``'s JSONL,
``merge/formats/rl_insight/markers.py``: whole-name ``global_step``/``train_batch`` spans with exact
``ts_ns``/``dur_ns``), and turned into windows by the project's one step rule
(:func:`rl_trace_observer.merge.timeline.steps.windows_from_markers`), so the watch numbers a step as
the merge and the report do; an OTLP/JSON line (NeMo-RL's spans through a Collector's ``file``
exporter) gives its ``rl.<algo>.step`` spans the same way. A line that does not parse is counted and
named (file and line number) and the watch goes on — the merge skips such a line too.

A line with a µs ``ts`` after its file's own origin and a ``global_step`` argument (AReaL's perf
traces, docs/areal.md) is a step marker once the file's anchor is known: the anchor its process record
registered (``RL_TRACE_AREAL=1``); until then it waits, kept in the state file.

A run that writes no event log (only torch.profiler traces) gets its steps from the traces'
``ProfilerStep#N`` as they appear (:mod:`.profiler_markers`, kept per file in ``profiled``): as the
planner, which takes a profiler's markers only where no event log is among the run's files.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ...merge.formats.otlp import span_markers
from ...merge.timeline.model import us_to_ns
from ...merge.timeline.steps import NAMED_MARKERS, Marker, StepWindow, marker, windows_from_markers

NAMED_BAD = 20  # bad lines named per file (all are counted)
STEP_MARKER = NAMED_MARKERS[0]  # ``global_step``: what a span naming its global_step stands for
# phases a time window does not cut by time alone (merge/transform/passes.py filter_events: B/E are kept
# whole; a counter's last earlier sample is held at the window's start) and metadata: never skipped
KEPT_WHOLE = ("B", "E", "C", "M")
RUN_NS = 10**9  # event ends one skippable run of lines spans at most (the grain of what a merge skips)


@dataclass
class Seen:
    markers: list[Marker] = field(default_factory=list)
    bad: dict[str, dict[str, Any]] = field(default_factory=dict)  # file -> {count, lines[]}
    lines: int = 0
    # the latest event end seen in an event log; not a metric sample's time: the sampler samples on
    # between steps and after the run, which says nothing about a step running
    last_ts_ns: int = 0
    # per file, runs of consecutive lines a step's merge may skip: [start byte, end byte, latest event
    # end ns, first line's event end ns]; a run spans at most RUN_NS of event ends, so the old part of
    # a file is skippable while its recent part is still read (older runs are joined: :meth:`skip_lines`)
    runs: dict[str, list[list[int]]] = field(default_factory=dict)
    # file -> [[step, ts µs, dur µs]] of relative-time step spans whose file has no known anchor yet
    waiting: dict[str, list[list[Any]]] = field(default_factory=dict)
    anchors: dict[str, int] = field(default_factory=dict)  # file -> anchor ns (process records; not kept)
    # file -> the step markers of a profiler trace (replaced when the file changes); they count only
    # while no event-log line was seen (``logs``), as the planner ranks them (``markers_rank``)
    profiled: dict[str, list[Marker]] = field(default_factory=dict)
    logs: bool = False
    # the step windows of the markers as they were: ((markers list, its length, logs), windows). Markers are
    # only ever appended, so the same list at the same length has the same windows; the watch asks
    # every look, and the step rule sorts every marker of the run
    _windows: tuple[tuple[int, int, bool], list[StepWindow]] | None = field(
        default=None, repr=False, compare=False
    )

    def line(self, rel: str, number: int, raw: bytes, offset: int = -1) -> None:
        """One complete line of a line file (follow.LineSink) that starts at byte ``offset``."""
        self.lines += 1
        if offset == 0:  # the file was started anew: what was learnt of its bytes no longer holds
            self.runs.pop(rel, None)
        try:
            ev = orjson.loads(raw)
        except orjson.JSONDecodeError:
            ev = None
        if not isinstance(ev, dict):
            entry = self.bad.setdefault(rel, {"count": 0, "lines": []})
            entry["count"] += 1
            if len(entry["lines"]) < NAMED_BAD:
                entry["lines"].append(number)
            return
        if "resourceSpans" in ev:  # an OTLP/JSON line (a Collector's file exporter): its step spans
            self.logs = True
            markers, last = span_markers(raw)
            self.markers += markers
            self.last_ts_ns = max(self.last_ts_ns, last)
            return
        if "ts_ns" not in ev and "t" not in ev:
            self._relative(rel, ev)
            return
        ts = ev.get("ts_ns")
        if isinstance(ts, int) and "ph" in ev:
            self.logs = True
            dur = ev.get("dur_ns")
            end = ts + (dur if isinstance(dur, int) and dur > 0 else 0)
            self.last_ts_ns = max(self.last_ts_ns, end)
            if number > 1 and offset > 0 and ev["ph"] not in KEPT_WHOLE:
                self._skippable(rel, offset, offset + len(raw) + 1, end)
        if ev.get("ph") == "X" and isinstance(ev.get("name"), str) and isinstance(ts, int):
            dur = ev.get("dur_ns")
            if isinstance(dur, int):
                args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
                found = marker(ev["name"], ts, ts + max(dur, 0), args)
                if found is not None:
                    self.markers.append(found)

    def _relative(self, rel: str, ev: dict[str, Any]) -> None:
        """A span in µs after its file's origin that names its ``global_step``."""
        args, ts, dur = ev.get("args"), ev.get("ts"), ev.get("dur")
        if ev.get("ph") != "X" or not isinstance(args, dict):
            return
        step = args.get("global_step")
        if isinstance(step, int) and not isinstance(step, bool) and _number(ts) and _number(dur):
            self.waiting.setdefault(rel, []).append([step, ts, dur])
            self.place(self.anchors)

    def place(self, anchors: dict[str, int]) -> bool:
        """Turn the waiting spans of files whose anchor is now known into markers; True if any."""
        self.anchors = anchors
        placed = False
        for rel in [r for r in self.waiting if r in anchors]:
            anchor = anchors[rel]
            for step, ts, dur in self.waiting.pop(rel):
                start = anchor + us_to_ns(ts)
                found = marker(STEP_MARKER, start, start + max(us_to_ns(dur), 0), {"step": step})
                if found is not None:
                    self.markers.append(found)
                    self.last_ts_ns = max(self.last_ts_ns, found.end_ns)
                    placed = True
        return placed

    def _skippable(self, rel: str, start: int, stop: int, end_ns: int) -> None:
        runs = self.runs.setdefault(rel, [])
        last = runs[-1] if runs else None
        if last is not None and last[1] == start and end_ns - last[3] < RUN_NS:
            last[1] = stop
            last[2] = max(last[2], end_ns)
        else:
            runs.append([start, stop, end_ns, end_ns])

    def skip_lines(
        self, run_dir: Path, before_ns: int, prefix: str | None = None
    ) -> dict[str, tuple[tuple[int, int], ...]]:
        """Per file (its real path; ``prefix`` + its relative path where the files are another
        machine's: a Ray merge names them ``/<node label>/``), the byte runs of lines whose every event
        ended before ``before_ns``: what a merge cut to a later window may leave unread
        (``MergeOptions.skip_lines``)."""
        out = {}
        for rel, runs in self.runs.items():
            joined: list[list[int]] = []  # adjacent runs that are all old become one (the state stays small)
            for r in runs:
                prev = joined[-1] if joined else None
                if prev is not None and prev[1] == r[0] and prev[2] < before_ns and r[2] < before_ns:
                    prev[1], prev[2] = r[1], max(prev[2], r[2])
                else:
                    joined.append(r)
            runs[:] = joined
            ranges = tuple((a, b) for a, b, end, _ in runs if end < before_ns)
            if ranges:
                out[prefix + rel if prefix is not None else os.path.realpath(run_dir / rel)] = ranges
        return out

    def profile(self, rel: str, markers: tuple[Marker, ...]) -> bool:
        """A profiler trace appeared or changed: its markers now (``()``: none); True if they moved."""
        if list(markers) == self.profiled.get(rel, []):
            return False
        if markers:
            self.profiled[rel] = list(markers)
        else:
            self.profiled.pop(rel, None)
        self._windows = None
        return True

    def step_markers(self) -> list[Marker]:
        """What the step rule counts: event-log markers, or, in a run without event logs, profilers'."""
        if self.logs or not self.profiled:
            return self.markers
        return self.markers + [m for rel in sorted(self.profiled) for m in self.profiled[rel]]

    def windows(self) -> list[StepWindow]:
        key = (id(self.markers), len(self.markers), self.logs)  # ``profile`` clears it itself
        if self._windows is None or self._windows[0] != key:
            self._windows = (key, windows_from_markers(self.step_markers()))
        return list(self._windows[1])

    @property
    def bad_total(self) -> int:
        return sum(int(e["count"]) for e in self.bad.values())

    # ------------------------------------------------------------------- the state file's form
    def to_json(self) -> dict[str, Any]:
        return {
            "markers": markers_json(self.markers),
            "profiled": {rel: markers_json(ms) for rel, ms in self.profiled.items()},
            "logs": self.logs,
            "bad": self.bad,
            "lines": self.lines,
            "last_ts_ns": self.last_ts_ns,
            "waiting": self.waiting,
            "runs": self.runs,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Seen:
        markers = markers_from(d.get("markers", []))
        runs = {str(k): [[int(x) for x in r] for r in v] for k, v in d.get("runs", {}).items()}
        seen = cls(markers, dict(d.get("bad", {})), int(d.get("lines", 0)), int(d.get("last_ts_ns", 0)), runs)
        seen.waiting = {str(k): list(v) for k, v in dict(d.get("waiting", {})).items()}
        seen.profiled = {str(k): markers_from(v) for k, v in dict(d.get("profiled", {})).items()}
        seen.logs = bool(d.get("logs", False))
        return seen


def markers_json(markers: list[Marker]) -> list[list[Any]]:
    return [[m.priority, m.start_ns, m.end_ns, sorted(m.numbers), m.profiled, m.mode] for m in markers]


def markers_from(rows: list[list[Any]]) -> list[Marker]:
    return [
        Marker(int(p), int(s), int(e), frozenset(int(n) for n in nums), bool(prof), mode)
        for p, s, e, nums, prof, mode in rows
    ]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
