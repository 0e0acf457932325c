"""What the answers take from the GPU section: ``rl-trace diff`` series, GPU idle by what the CPU
lane was doing, and whether a critical-path span was kernel-bound.

- ``diff`` series (one value per step, like the others): ``<role>/gpu_busy``, ``gpu_compute``,
  ``gpu_comm``, ``gpu_memory``, ``gpu_idle`` — the mean over the role's GPUs of the step rows.
- ``idle_while``: per step and GPU, its idle time (in the step window) split by what its process's
  lane did meanwhile on the CPU: a stage (``update``: the host was busy in that stage but launched
  nothing — host-bound) or an idle cause of :mod:`..answers.idle` (``waiting_for_rollout``: the GPU
  sat idle because the trainer waited for generation).
- critical path: a path span whose process's GPUs were busy ≥ 80 % of it is ``gpu``-bound (kernels
  decided its length), else ``host``-bound; None when its process has no GPU.
"""

from __future__ import annotations

import bisect
from array import array
from collections import defaultdict
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from ..answers import intervals as iv

__all__ = ["BOUND_PCT", "SERIES", "bound_segments", "gpu_series", "idle_while"]

SERIES = {"gpu_busy": "busy_ns", "gpu_compute": "compute_ns", "gpu_comm": "comm_ns",
          "gpu_memory": "memory_ns", "gpu_idle": "idle_ns"}  # fmt: skip
BOUND_PCT = 80


def gpu_series(summary: dict[str, Any], steps: list[Any]) -> dict[str, list[float]]:
    """Per ``<role>/gpu_*`` key, one value per step of ``steps`` that has GPU rows of that role."""
    rows: dict[tuple[Any, str], list[dict[str, Any]]] = defaultdict(list)
    for r in (summary.get("gpu") or {}).get("rows") or []:
        if r["scope"] == "step" and r["step"] is not None:
            rows[(r["step"], r["role"])].append(r)
    out: dict[str, list[float]] = {}
    for step in steps:
        for (s, role), mine in sorted(rows.items(), key=lambda kv: kv[0][1]):
            if s != step:
                continue
            for name, key in SERIES.items():
                out.setdefault(f"{role}/{name}", []).append(sum(r[key] for r in mine) / len(mine))
    return out


Pieces = tuple[Sequence[int], Sequence[int]]  # busy intervals as two columns: starts, ends


class _Busy:
    """Sorted, disjoint busy pieces with prefix sums: busy time inside any [a, b) in O(log n), so
    a few CPU-state intervals are judged against a million kernels without walking them."""

    def __init__(self, pieces: Pieces) -> None:
        from .loops import native

        self.starts, self.ends = array("q", pieces[0]), array("q", pieces[1])  # the twin walks arrays
        self.before: array[int] = native().prefix_lengths(self.starts, self.ends)

    def covered(self, a: int, b: int) -> int:
        i = bisect.bisect_right(self.ends, a)  # first piece ending after a
        j = bisect.bisect_left(self.starts, b)  # pieces [i, j) start before b
        if i >= j:
            return 0
        total = self.before[j] - self.before[i]
        total -= max(a - self.starts[i], 0)
        total -= max(self.ends[j - 1] - b, 0)
        return total

    def inside(self, ints: list[iv.Interval]) -> int:
        return sum(self.covered(a, b) for a, b in ints)


def idle_while(
    busy: dict[tuple[Any, int], Pieces],
    devices: dict[int, dict[str, Any]],
    windows: list[Any],
    lanes: dict[Any, list[tuple[str, list[iv.Interval]]]],
) -> list[dict[str, Any]]:
    """``busy``: per (device, window index) the busy intervals; ``lanes``: per owner pid, the CPU
    states of its lane(s) in order of precedence as (label, intervals) — stages first, then the idle
    causes. Rows: per step and device, GPU idle inside the step window split by those labels
    (``unaccounted``: no lane of the process says)."""
    out = []
    for (p, w), pieces in sorted(busy.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if w < 0:
            continue
        step, lo, hi = windows[w]
        d = devices[p]
        gpu = _Busy(pieces)
        idle = (hi - lo) - gpu.covered(lo, hi)
        split: dict[str, int] = {}
        claimed: list[iv.Interval] = []
        for label, ints in lanes.get(d["owner"], []):
            mine = iv.subtract(iv.union(iv.clip(ints, lo, hi)), claimed)
            hit = iv.length(mine) - gpu.inside(mine)
            if hit:
                split[label] = split.get(label, 0) + hit
            claimed = iv.union(claimed + mine)
        if idle - sum(split.values()):
            split["unaccounted"] = idle - sum(split.values())
        out.append({"step": step, "role": d["role"], "rank": d["rank"], "device": d["device"],
                    "gpu_idle_ns": idle, "while_ns": split})  # fmt: skip
    return out


def bound_segments(
    paths: list[dict[str, Any]],
    busy_by_owner: dict[Any, _Busy],
) -> None:
    """Mark each critical-path segment with ``gpu_busy_ns`` and ``bound`` (in place)."""
    for path in paths:
        base = path["start_ns"]
        for seg in path["segments"]:
            pieces = busy_by_owner.get(seg.get("trace_pid"))
            if seg["stage"] == "gap" or pieces is None:
                seg["gpu_busy_ns"], seg["bound"] = None, None
                continue
            lo = base + seg["start_ns"]
            got = pieces.covered(lo, lo + seg["dur_ns"])
            seg["gpu_busy_ns"] = got
            seg["bound"] = "gpu" if seg["dur_ns"] and 100 * got >= BOUND_PCT * seg["dur_ns"] else "host"


def _joined(lists: list[Pieces]) -> Pieces:
    """The union of sorted, disjoint piece columns: their concatenation when they follow one another
    (one device, steps in order — no sort of a million pieces), else a full union."""
    lists.sort(key=lambda x: x[0][0])
    starts, ends = array("q"), array("q")
    if all(a[1][-1] <= b[0][0] for a, b in pairwise(lists)):
        for s, e in lists:
            starts.extend(s)
            ends.extend(e)
        return starts, ends
    from .loops import native

    return native().union_columns(lists)  # type: ignore[no-any-return]


def gpu_answers(
    work: list[Any], windows: Sequence[Any], result: Any, paths: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``gpu.idle_while`` rows, and the critical path's segments marked ``bound`` (in place).
    ``work``: the answers' :class:`..answers.model.WorkSpan` rows; ``result``: a ``GpuResult``."""
    from ..answers.idle import cause_intervals
    from ..answers.model import StepWindow

    lanes: dict[Any, list[tuple[str, list[iv.Interval]]]] = defaultdict(list)
    stages: dict[Any, dict[str, list[iv.Interval]]] = defaultdict(lambda: defaultdict(list))
    pid_of: dict[tuple[str, str], Any] = {}
    for s in work:
        stages[s.pid][s.stage].append((s.start_ns, s.end_ns))
        pid_of.setdefault((s.role, s.lane), s.pid)
    for pid, by in stages.items():
        lanes[pid] += [(stage, iv.union(ints)) for stage, ints in sorted(by.items())]
    steps = [StepWindow(step, lo, hi) for step, lo, hi in windows]
    for lane, causes in cause_intervals(work, steps).items():
        lanes[pid_of[lane]] += [(cause, iv.union(ints)) for cause, ints in causes.items() if ints]
    owner_busy: dict[Any, list[Pieces]] = defaultdict(list)
    for (p, _), pieces in result.busy.items():
        if len(pieces[0]):
            owner_busy[result.devices[p]["owner"]].append(pieces)
    bound_segments(paths, {o: _Busy(_joined(v)) for o, v in owner_busy.items()})
    return idle_while(result.busy, result.devices, list(windows), lanes)
