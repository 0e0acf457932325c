"""What a merge job is told about span shards (plain data: it travels to worker processes and nodes)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..plan.plan import Plan
from ..timeline.model import ProcessKey


@dataclass(frozen=True)
class ProcMeta:
    run: str | None = None
    role: str | None = None
    rank: int | None = None


@dataclass
class ShardSpec:
    """What a job needs to know to write its rows: where, under which tag, and the plan's facts."""

    root: str  # the shard directory (or a node-local one the driver collects from)
    tag: str  # part-file tag: one per merge, or the job's key in a Ray merge
    processes: dict[ProcessKey, ProcMeta] = field(default_factory=dict)
    windows: tuple[tuple[int, int, int], ...] = ()  # (first ns, last ns, step)
    task_steps: dict[int, int | None] = field(default_factory=dict)  # artifact index -> its own step


def spec_for(plan: Plan, root: str, tag: str) -> ShardSpec:
    """Who each process is and where the steps are, for the rows' run/role/rank/step columns."""
    processes = {k: ProcMeta(p.run_id, p.role, p.rank) for k, p in plan.processes.items()}
    windows = tuple(sorted((lo, hi, step) for step, (lo, hi) in plan.step_windows.items()))
    index = {id(a): i for i, a in enumerate(plan.artifacts)}
    task_steps: dict[int, int | None] = {
        index[id(a)]: a.info.step for a in plan.selected() if a.info.step is not None
    }
    return ShardSpec(root=root, tag=tag, processes=processes, windows=windows, task_steps=task_steps)
