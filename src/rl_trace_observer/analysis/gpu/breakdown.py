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

import bisect
from collections import defaultdict
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from ..report import intervals as iv
from ..report.rollout import percentile
from .attribute import UNKNOWN, Attribution
from .kinds import COMM, COMPUTE
from .store import KernelStore

__all__ = ["FIGURES", "KERNEL_WAIT_BELOW_NS", "figures", "stream_idle", "top_kernels"]

KERNEL_WAIT_BELOW_NS = 30_000
FIGURES = (
    "kernels", "span_ns", "wall_ns", "busy_ns", "compute_ns", "comm_ns", "memory_ns", "overlap_ns", "idle_ns",
    "host_wait_ns", "kernel_wait_ns", "other_wait_ns",
    "launch_delay_p50_ns", "launch_delay_p95_ns", "launch_delay_max_ns",
)  # fmt: skip


class _Run:
    """A running union of intervals met in start order: its length and, optionally, its pieces."""

    __slots__ = ("end", "length", "pieces", "start")

    def __init__(self, keep: bool = False) -> None:
        self.start = self.end = UNKNOWN
        self.length = 0
        self.pieces: list[iv.Interval] | None = [] if keep else None

    def add(self, s: int, e: int) -> None:
        if s > self.end:
            self.close()
            self.start, self.end = s, e
        elif e > self.end:
            self.end = e

    def close(self) -> None:
        if self.end > self.start:
            self.length += self.end - self.start
            if self.pieces is not None:
                self.pieces.append((self.start, self.end))
        self.start = self.end = UNKNOWN


def figures(
    order: Sequence[int],
    store: KernelStore,
    at: Attribution,
    cpu: list[iv.Interval] | None,
    threshold_ns: int = KERNEL_WAIT_BELOW_NS,
) -> tuple[dict[str, Any], list[iv.Interval]]:
    """``order``: kernel indices sorted by (start, launch). ``cpu``: the CPU window (sorted,
    disjoint), or None for a whole run. Returns the figures and the busy intervals."""
    ts, dur, names, kinds = store.k_ts, store.k_dur, store.k_name, store.kinds
    busy, comp, comm, both = _Run(keep=True), _Run(), _Run(), _Run()
    delays = []
    launch_end = at.launch_end
    for i in order:
        s = ts[i]
        e = s + dur[i]
        busy.add(s, e)
        kind = kinds[names[i]]
        if kind == COMPUTE:
            comp.add(s, e)
            both.add(s, e)
        elif kind == COMM:
            comm.add(s, e)
            both.add(s, e)
        le = launch_end[i]
        if le != UNKNOWN:
            delays.append(s - le if s > le else 0)
    for run in (busy, comp, comm, both):
        run.close()
    pieces = busy.pieces or []
    if cpu is None:
        cpu = [(pieces[0][0], pieces[-1][1])] if pieces else []
    idle = iv.subtract(iv.union(cpu), pieces)
    out: dict[str, Any] = {"kernels": len(order), "busy_ns": busy.length}
    out["span_ns"] = pieces[-1][1] - pieces[0][0] if pieces else 0
    out["compute_ns"] = comp.length
    out["comm_ns"] = both.length - comp.length
    out["memory_ns"] = busy.length - both.length
    out["overlap_ns"] = comp.length + comm.length - both.length
    waits = _idle_split(idle, order, store, at, threshold_ns)
    out["idle_ns"] = sum(waits)
    out["wall_ns"] = busy.length + out["idle_ns"]
    out["host_wait_ns"], out["kernel_wait_ns"], out["other_wait_ns"] = waits
    out |= _delays(delays)
    return {k: out[k] for k in FIGURES}, pieces


def _idle_split(
    idle: list[iv.Interval], order: Sequence[int], store: KernelStore, at: Attribution, threshold: int
) -> tuple[int, int, int]:
    starts = [store.k_ts[i] for i in order]
    host = kernel = other = 0
    for a, b in idle:
        j = bisect.bisect_left(starts, b)
        if j == len(starts):
            host += b - a
            continue
        nxt = order[j]
        launched = at.launch_ts[nxt]
        if launched != UNKNOWN and launched > a:
            host += b - a
        elif starts[j] - a < threshold:
            kernel += b - a
        else:
            other += b - a
    return host, kernel, other


def _delays(delays: list[int]) -> dict[str, int | None]:
    if not delays:
        return {"launch_delay_p50_ns": None, "launch_delay_p95_ns": None, "launch_delay_max_ns": None}
    return {
        "launch_delay_p50_ns": round(percentile(delays, 0.50)),
        "launch_delay_p95_ns": round(percentile(delays, 0.95)),
        "launch_delay_max_ns": max(delays),
    }


def stream_idle(
    order: Sequence[int], store: KernelStore, at: Attribution, threshold_ns: int = KERNEL_WAIT_BELOW_NS
) -> list[dict[str, int]]:
    """HTA's ``get_idle_time_breakdown`` per stream, exactly: the gap before each kernel (its start
    minus the previous kernel's end on the stream, in start order; the first has none) goes to host
    wait when the kernel was launched after that end, else to kernel wait below the threshold, else
    to other."""
    per: dict[int, list[int]] = defaultdict(list)
    for i in order:
        per[store.k_stream[i]].append(i)
    out = []
    for stream, ks in sorted(per.items()):
        host = kernel = other = 0
        for prev, i in pairwise(ks):
            prev_end = store.k_ts[prev] + store.k_dur[prev]
            gap = store.k_ts[i] - prev_end
            launched = at.launch_ts[i]
            if launched != UNKNOWN and launched > prev_end:
                host += gap
            elif gap < threshold_ns:
                kernel += gap
            else:
                other += gap
        out.append(
            {"stream": stream, "kernels": len(ks), "idle_ns": host + kernel + other,
             "host_wait_ns": host, "kernel_wait_ns": kernel, "other_wait_ns": other}
        )  # fmt: skip
    return out


def top_kernels(order: Sequence[int], store: KernelStore, limit: int) -> list[dict[str, Any]]:
    """The kernels with the most time (summed durations, per name), most first."""
    total: dict[int, list[int]] = {}
    for i in order:
        d = store.k_dur[i]
        row = total.get(store.k_name[i])
        if row is None:
            total[store.k_name[i]] = [1, d, d]
        else:
            row[0] += 1
            row[1] += d
            if d > row[2]:
                row[2] = d
    ranked = sorted(total.items(), key=lambda kv: (-kv[1][1], store.names[kv[0]]))[:limit]
    return [
        {"name": store.names[n], "kind": store.kinds[n], "count": c, "total_ns": t, "max_ns": m}
        for n, (c, t, m) in ranked
    ]
