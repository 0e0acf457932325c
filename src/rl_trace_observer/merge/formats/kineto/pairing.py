"""A Torch trace aligned on its process's RL-Insight stages: the Kineto format's partner rule.

A Torch ``record_function`` region (``user_annotation``) runs inside the RL-Insight stage of the same
name (VERL's ``DistProfiler.annotate`` nests the one in the other), so the stages bound where the
trace's clock can be. The stages live in the process's RL-Insight event log, which its own job merges:
the Torch job reads that log too (named in its task, ``Task.partner``; a few MB against ~100 MB of
trace), for its stage spans only — the one partner that lives in another job. Pairs are measured on
the readers' raw timelines: both files share a host, so the host correction is stacked on top.
"""

from __future__ import annotations

from typing import Any

from ...clock.pair_apply import as_span_dicts
from ...clock.pair_events import stage_pairs
from ...clock.pairs import PairAlignment, align_pairs
from ...timeline.model import Event
from ..base import ReadResult

__all__ = ["REGION_CAT", "STAGE_CAT", "StageLinks"]

STAGE_CAT = "rl_insight"  # RL-Insight state spans (trace_state): the stages a Torch region nests in
REGION_CAT = "user_annotation"  # Kineto's category for record_function regions on the CPU


class StageLinks:
    """A process's RL-Insight stages, for its Torch traces to align on (``policy="minimal"``).

    Why minimal: a stage wraps its region with gaps of its own (a profiler step starting, Python
    around the call), so the data bound the offset without pinning it; the region moves only as far
    as needed to sit inside its stage, and the manifest states the bounds as the uncertainty.
    """

    def __init__(self) -> None:
        self.stages: list[dict[str, Any]] = []
        self.url: str | None = None

    def add(self, url: str, events: list[Event], res: ReadResult) -> None:
        found = as_span_dicts(events, res.anchor_ns or 0, deferred=res.deferred, cats=(STAGE_CAT,))
        if found and self.url is None:
            self.url = url
        self.stages.extend(found)

    def align(
        self, url: str, events: list[Event], res: ReadResult, tolerance_ns: int, apply: bool
    ) -> PairAlignment | None:
        """A Torch trace's alignment on the stages (None: no region has a same-named stage)."""
        if not self.stages or self.url is None:
            return None
        regions = as_span_dicts(events, res.anchor_ns or 0, deferred=res.deferred, cats=(REGION_CAT,))
        pairs = stage_pairs(self.stages, regions, stage_cats=None, region_cats=None)
        if not pairs:
            return None
        return align_pairs(
            pairs,
            artifact=url,
            partner=self.url,
            pairing="stage_name",
            policy="minimal",
            tolerance_ns=tolerance_ns,
            apply=apply,
        )
