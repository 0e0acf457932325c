"""The flat input every answer is computed from: work spans (role, lane, name, stage, start, end) and
step windows — one row per RL stage span, exactly what ``rl-trace sql`` shows as ``stage_spans``.

Kept separate from the report's loaders so that tests build the answers' input by hand (a few rows
with known idle causes, stragglers and critical paths) and the report feeds the same shape from a
trace or span shards. Times are integer ns on the merged timeline.
"""

from __future__ import annotations

from array import array
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from ...common.column_rows import ColumnRows, with_row_as_lists

__all__ = [
    "OVERHEAD",
    "PRODUCTIVE",
    "RL_BUCKETS",
    "RowTable",
    "StepWindow",
    "WorkSpan",
    "by_lane",
    "lane_kinds",
    "natural",
]

# goodput: every stage category is productive or overhead (NeMo-RL's buckets, less "wasted", which
# needs to know which samples were thrown away: only a span that says so, ``rl.bucket``, tells)
PRODUCTIVE = frozenset({"generation", "log_prob", "update"})
# nemo-lens's ``rl.bucket`` values: a span that carries one is counted in it, whatever its name
RL_BUCKETS = ("productive", "overhead", "idle", "wasted")
OVERHEAD = frozenset({"weight_sync", "other"})
TRAINER, ROLLOUT, OTHER_KIND = "trainer", "rollout", "other"


class WorkSpan(NamedTuple):
    role: str
    lane: str
    name: str
    stage: str  # the stage table's category (generation, log_prob, update, weight_sync, other)
    start_ns: int
    end_ns: int
    pid: Any = None  # the merged trace's process and thread ids (to point at the span in Perfetto)
    tid: Any = None
    bucket: str | None = None  # the span's own ``rl.bucket`` (one of RL_BUCKETS), None: by its stage


class StepWindow(NamedTuple):
    step: int | None
    start_ns: int
    end_ns: int


Lane = tuple[str, str]  # (role, lane)


def natural(text: str) -> tuple[object, ...]:
    """``rank_10`` after ``rank_9``."""
    import re

    return tuple((0, int(t)) if t.isdigit() else (1, t) for t in re.split(r"(\d+)", text))


Context = tuple[str, str, str, str, Any, Any, "str | None"]  # a row less its times: role, lane, name,
# stage, pid, tid, bucket


class RowTable(ColumnRows[WorkSpan]):
    """Rows kept as columns: a context id (into ``contexts``, shared by every table of one report)
    and the two times per row — 16 bytes of times and 4 of id instead of a 9-field tuple and an end
    ``int`` (~170 bytes; 1M-span steps in the live watch). Reading it gives the very
    :class:`WorkSpan` rows, made as they are read, so every answer takes it as the list it stands
    for; the answers that read all rows of a step (idle, the critical path) use :meth:`arrays`.
    A time beyond int64 (hostile input) turns the table into Python lists: the same rows.

    ``lanes``: where the table is the concatenation of per-lane tables (the report's stage index),
    those tables — :func:`by_lane` of the table, which it then need not work out."""

    __slots__ = ("contexts", "ends", "ids", "lanes", "starts")

    def __init__(
        self,
        contexts: list[Context],
        ids: Any = None,
        starts: Any = None,
        ends: Any = None,
        lanes: dict[Lane, RowTable] | None = None,
    ) -> None:
        self.contexts = contexts
        self.ids = array("i") if ids is None else ids
        self.starts = array("q") if starts is None else starts
        self.ends = array("q") if ends is None else ends
        self.lanes = lanes

    def add(self, context: int, start: int, end: int) -> None:
        self.ids.append(context)
        try:
            self.starts.append(start)
            self.ends.append(end)
        except OverflowError:
            self.starts, self.ends = with_row_as_lists((self.starts, self.ends), (start, end))

    def _as_lists(self) -> None:
        self.starts, self.ends = list(self.starts), list(self.ends)

    def columnar(self) -> bool:
        """Whether the times are int64 arrays (:meth:`arrays` reads them without a row each)."""
        return isinstance(self.starts, array) and isinstance(self.ends, array)

    def arrays(self) -> tuple[Any, Any, Any]:
        """Starts, ends and context ids as numpy arrays (read-only views; :meth:`columnar` only)."""
        import numpy as np

        return (
            np.frombuffer(self.starts, dtype=np.int64),
            np.frombuffer(self.ends, dtype=np.int64),
            np.frombuffer(self.ids, dtype=np.int32),
        )

    def stages(self) -> set[str]:
        return {self.contexts[c][3] for c in set(self.ids)}

    def lanes_seen(self) -> set[Lane]:
        return {(self.contexts[c][0], self.contexts[c][1]) for c in set(self.ids)}

    @staticmethod
    def concat(contexts: list[Context], tables: Sequence[RowTable], lanes: dict[Lane, RowTable]) -> RowTable:
        out = RowTable(contexts, lanes=lanes)
        for t in tables:
            if not t.columnar() and out.columnar():
                out._as_lists()
            out.ids += t.ids
            out.starts += t.starts  # type: ignore[operator]
            out.ends += t.ends  # type: ignore[operator]
        return out

    def _row(self, i: int) -> WorkSpan:
        c = self.contexts[self.ids[i]]
        return tuple.__new__(
            WorkSpan, (c[0], c[1], c[2], c[3], self.starts[i], self.ends[i], c[4], c[5], c[6])
        )

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self) -> Iterator[WorkSpan]:
        contexts, new = self.contexts, tuple.__new__
        for k, start, end in zip(self.ids, self.starts, self.ends, strict=True):
            c = contexts[k]
            yield new(WorkSpan, (c[0], c[1], c[2], c[3], start, end, c[4], c[5], c[6]))


def by_lane(spans: Iterable[WorkSpan]) -> dict[Lane, list[WorkSpan]]:
    if isinstance(spans, RowTable) and spans.lanes is not None:
        return dict(spans.lanes)  # type: ignore[arg-type]  # made so by the report's stage index
    out: dict[Lane, list[WorkSpan]] = defaultdict(list)
    for s in spans:
        out[(s.role, s.lane)].append(s)
    return dict(sorted(out.items(), key=lambda kv: (kv[0][0], natural(kv[0][1]))))


def lane_kinds(lanes: dict[Lane, list[WorkSpan]]) -> dict[Lane, str]:
    """What a lane is, from what it does over the whole run: a trainer lane runs log-prob or update
    spans, a rollout lane generates (a lane doing both — a colocated hybrid engine — is a trainer:
    its generation is then its own work, never something it waits for); anything else (the driver,
    reward workers) is ``other``."""
    kinds = {}
    for lane, spans in lanes.items():
        stages = spans.stages() if isinstance(spans, RowTable) else {s.stage for s in spans}
        if stages & {"log_prob", "update"}:
            kinds[lane] = TRAINER
        elif "generation" in stages:
            kinds[lane] = ROLLOUT
        else:
            kinds[lane] = OTHER_KIND
    return kinds
