"""The figures of one set of kernels on one device, exact integer ns, HTA's definitions.

- ``busy``: the union of the kernels' intervals (never their sum); touching intervals join.
- ``compute`` = |C|, the union of compute kernels (HTA's ``compute_time``); ``comm`` = |M ∖ C|,
  communication NOT hidden under compute (exposed); ``memory`` = the rest of busy; so
  compute + comm + memory = busy. ``overlap`` = |C ∩ M|: communication under compute (HTA's
  comm–comp overlap is overlap / (comm + overlap)).
- ``span``: first kernel start to last kernel end (HTA's ``kernel_time``: HTA's idle = span − busy).
- ``wall``: the window the set is judged in — the CPU time it belongs to (a step window, a
  stage's spans) joined with its busy time, or for a whole run HTA's "kernel time", first kernel
  start to last kernel end. ``idle`` = wall − busy.
- Idle split, per idle piece [a, b): the next kernel of the set starting at or after b (the
  earliest launched among equal starts) decides, as HTA decides per stream: ``host_wait`` when it
  was launched after a — or no kernel of the set follows (the CPU enqueued nothing more);
  ``kernel_wait`` when it was already launched and its start − a is below the threshold (HTA's
  ``consecutive_kernel_delay``: 30 of its time units, which are the trace's µs, so 30 µs);
  ``other`` otherwise (queued work waited on something else: an event, a stream). A kernel with
  no known launch is never host wait (HTA: a missing runtime event compares false).
- Launch delay (HTA's ``get_cuda_kernel_launch_stats``): kernel start − end of its launch call,
  0 if negative; p50 / p95 interpolate like numpy.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any, NamedTuple

from ..answers import intervals as iv
from .attribute import Attribution
from .kinds import COMM, COMPUTE
from .loops import native
from .store import KernelStore

__all__ = ["FIGURES", "KERNEL_WAIT_BELOW_NS", "figures", "stream_idle", "top_kernels"]

KERNEL_WAIT_BELOW_NS = 30_000
FIGURES = (
    "kernels", "span_ns", "wall_ns", "busy_ns", "compute_ns", "comm_ns", "memory_ns", "overlap_ns", "idle_ns",
    "host_wait_ns", "kernel_wait_ns", "other_wait_ns",
    "launch_delay_p50_ns", "launch_delay_p95_ns", "launch_delay_max_ns",
)  # fmt: skip
Pieces = tuple[array, array]  # type: ignore[type-arg]  # busy intervals: starts, ends (sorted, disjoint)


class Columns(NamedTuple):
    """A set of kernels, sorted by (start, launch), as ``array('q')`` columns: each value is read
    from the store once per device, then every figure walks the columns (in C with the twin)."""

    starts: array  # type: ignore[type-arg]
    ends: array  # type: ignore[type-arg]
    codes: array  # type: ignore[type-arg]  # 0 compute, 1 comm, 2 memory
    launches: array  # type: ignore[type-arg]  # launch call start (UNKNOWN: none found)
    launch_ends: array  # type: ignore[type-arg]

    def subset(self, positions: Sequence[int]) -> Columns:
        take = native().take
        return Columns(*(take(col, positions) for col in self))


def columns(order: Sequence[int], store: KernelStore, at: Attribution) -> Columns:
    code = array("q", [0 if k == COMPUTE else 1 if k == COMM else 2 for k in store.kinds])
    return Columns(
        *native().gather_columns(
            order, store.k_ts, store.k_dur, store.k_name, code, at.launch_ts, at.launch_end
        )
    )


def figures(
    cols: Columns, cpu: list[iv.Interval] | None, threshold_ns: int = KERNEL_WAIT_BELOW_NS
) -> tuple[dict[str, Any], Pieces]:
    """``cpu``: the CPU window (sorted, disjoint), or None for a whole run. Returns the figures
    and the busy intervals."""
    loops = native()
    p_start, p_end, firsts, delays, comp, comm, both, busy = loops.union_pass(*cols)
    if cpu is None and len(p_start):
        cpu = [(p_start[0], p_end[-1])]
    cpu = cpu or []
    if len(cpu) == 1:
        waits = loops.edge_waits(p_start, p_end, firsts, cpu[0][0], cpu[0][1], threshold_ns)
    else:
        joined = iv.union(cpu)
        waits = loops.span_waits(
            p_start, p_end, firsts, array("q", [s for s, _ in joined]), array("q", [e for _, e in joined]),
            threshold_ns,
        )  # fmt: skip
    out: dict[str, Any] = {"kernels": len(cols.starts), "busy_ns": busy}
    out["span_ns"] = p_end[-1] - p_start[0] if len(p_start) else 0
    out["compute_ns"] = comp
    out["comm_ns"] = both - comp
    out["memory_ns"] = busy - both
    out["overlap_ns"] = comp + comm - both
    out["idle_ns"] = sum(waits)
    out["wall_ns"] = busy + out["idle_ns"]
    out["host_wait_ns"], out["kernel_wait_ns"], out["other_wait_ns"] = waits
    out |= _delays(delays, loops)
    return {k: out[k] for k in FIGURES}, (p_start, p_end)


def _delays(delays: array, loops: Any) -> dict[str, int | None]:  # type: ignore[type-arg]
    """p50 / p95 (as numpy's linear interpolation) and max, from the few order statistics they
    need (``nth_element`` in the twin: no sort of a million delays)."""
    n = len(delays)
    if not n:
        return {"launch_delay_p50_ns": None, "launch_delay_p95_ns": None, "launch_delay_max_ns": None}
    spots = {q: (int((n - 1) * q), min(int((n - 1) * q) + 1, n - 1)) for q in (0.50, 0.95)}
    wanted = sorted({r for pair in spots.values() for r in pair} | {n - 1})
    at: dict[int, int] = dict(zip(wanted, loops.ranks(delays, wanted), strict=True))

    def pct(q: float) -> int:
        lo, hi = spots[q]
        pos = (n - 1) * q
        return round(at[lo] + (at[hi] - at[lo]) * (pos - lo))

    return {
        "launch_delay_p50_ns": pct(0.50),
        "launch_delay_p95_ns": pct(0.95),
        "launch_delay_max_ns": at[n - 1],
    }


def stream_idle(
    order: Sequence[int], store: KernelStore, at: Attribution, threshold_ns: int = KERNEL_WAIT_BELOW_NS
) -> list[dict[str, int]]:
    """HTA's ``get_idle_time_breakdown`` per stream, exactly (:func:`.loops.stream_gaps`)."""
    if not isinstance(order, array):
        order = array("q", order)
    rows = native().stream_gaps(order, store.k_ts, store.k_dur, store.k_stream, at.launch_ts, threshold_ns)
    return [
        {"stream": s, "kernels": n, "idle_ns": host + kernel + other,
         "host_wait_ns": host, "kernel_wait_ns": kernel, "other_wait_ns": other}
        for s, n, host, kernel, other in rows
    ]  # fmt: skip


Totals = tuple[array, array, array]  # type: ignore[type-arg]  # per name id: count, total, max


def name_totals(order: Sequence[int], store: KernelStore) -> Totals:
    if not isinstance(order, array):
        order = array("q", order)
    return native().name_totals(order, store.k_name, store.k_dur, len(store.names))  # type: ignore[no-any-return]


def top_kernels(totals: Totals, store: KernelStore, limit: int) -> list[dict[str, Any]]:
    """The kernels with the most time (summed durations, per name), most first."""
    count, total, longest = totals
    used = [n for n in range(len(count)) if count[n]]
    ranked = sorted(used, key=lambda n: (-total[n], store.names[n]))[:limit]
    return [
        {"name": store.names[n], "kind": store.kinds[n], "count": count[n], "total_ns": total[n],
         "max_ns": longest[n]}
        for n in ranked
    ]  # fmt: skip
