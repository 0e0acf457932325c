"""The merge plan: every input file as the manifest will report it, its owner, what the planner
learnt from its name and head, and the processes, step windows and runs found.

Plain data, filled by :mod:`.build` and :mod:`.records`, read by the clock stage, the run and the
manifest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..files.sources import Source
from ..formats import EVENT_KINDS, Hints
from ..timeline.model import ArtifactInfo, Problem, ProcessInfo, ProcessKey


@dataclass
class PlannedArtifact:
    info: ArtifactInfo
    source: Source
    hints: Hints = field(default_factory=Hints)
    record_entry: dict[str, object] | None = None


@dataclass
class Plan:
    artifacts: list[PlannedArtifact]
    processes: dict[ProcessKey, ProcessInfo]
    problems: list[Problem]
    ignored: list[str] = field(default_factory=list)
    step_windows: dict[int, tuple[int, int]] = field(default_factory=dict)
    step_sources: dict[int, str] = field(default_factory=dict)
    runs: dict[str, int] = field(default_factory=dict)

    def selected(self) -> list[PlannedArtifact]:
        return [a for a in self.artifacts if a.info.selected and a.info.kind in EVENT_KINDS]
