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
import sys
from collections import defaultdict
from collections.abc import Sequence
from itertools import pairwise
from typing import Any, NamedTuple

from ..answers import intervals as iv
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


class Columns(NamedTuple):
    """A set of kernels, sorted by (start, launch), as plain lists: each value is read from the
    store once per device, then every figure walks lists (no indexing, no boxing per visit)."""

    starts: list[int]
    ends: list[int]
    codes: list[int]  # 0 compute, 1 comm, 2 memory
    launches: list[int]  # launch call start (UNKNOWN: none found)
    launch_ends: list[int]

    def subset(self, positions: list[int]) -> Columns:
        return Columns(*([col[j] for j in positions] for col in self))


def columns(order: Sequence[int], store: KernelStore, at: Attribution) -> Columns:
    code = [0 if k == COMPUTE else 1 if k == COMM else 2 for k in store.kinds]
    ts, dur, names = store.k_ts, store.k_dur, store.k_name
    starts = [ts[i] for i in order]
    return Columns(
        starts,
        [s + dur[i] for s, i in zip(starts, order)],  # noqa: B905
        [code[names[i]] for i in order],
        [at.launch_ts[i] for i in order],
        [at.launch_end[i] for i in order],
    )


def union_pass(
    starts: list[int], ends: list[int], codes: list[int], launches: list[int], launch_ends: list[int]
) -> tuple[list[iv.Interval], list[int], list[int], int, int, int, int]:
    """One pass over kernels sorted by (start, launch): the busy pieces, the launch of each
    piece's first kernel, the launch delays, |compute|, |comm|, |compute ∪ comm| and |busy| — the
    running unions kept inline (this loop runs three times per kernel: run, step, stage). Compiled
    twin: ``_gpu_native.union_pass``, tested equal."""
    pieces: list[iv.Interval] = []
    add = pieces.append
    firsts: list[int] = []
    first = firsts.append
    delays: list[int] = []
    keep = delays.append
    bs = be = cs = ce = ms = me = xs = xe = UNKNOWN
    comp = comm = both = busy = 0
    for s, e, k, launched, le in zip(starts, ends, codes, launches, launch_ends):  # noqa: B905
        if s > be:
            if be > bs:
                add((bs, be))
                busy += be - bs
            else:
                del firsts[-1:]
            bs, be = s, e
            first(launched)
        elif e > be:
            be = e
        if k < 2:
            if s > xe:
                both += xe - xs
                xs, xe = s, e
            elif e > xe:
                xe = e
            if k == 0:
                if s > ce:
                    comp += ce - cs
                    cs, ce = s, e
                elif e > ce:
                    ce = e
            elif s > me:
                comm += me - ms
                ms, me = s, e
            elif e > me:
                me = e
        if le != UNKNOWN:
            keep(s - le if s > le else 0)
    if be > bs:
        add((bs, be))
        busy += be - bs
    else:
        del firsts[-1:]
    return pieces, firsts, delays, comp + ce - cs, comm + me - ms, both + xe - xs, busy


def edge_waits(
    pieces: list[iv.Interval], firsts: list[int], lo: int, hi: int, threshold: int
) -> tuple[int, int, int]:
    """(host, kernel, other) idle time of the window [lo, hi) less the busy ``pieces`` (sorted,
    disjoint): the gaps between pieces and the two edges, each judged by the piece after it."""
    host = kernel = other = 0
    prev = lo  # the idle piece starts here; it only grows
    for (s, e), launched in zip(pieces, firsts):  # noqa: B905
        if s > prev:
            if prev >= hi:
                break
            b = s if s < hi else hi
            if launched != UNKNOWN and launched > prev:
                host += b - prev
            elif s - prev < threshold:
                kernel += b - prev
            else:
                other += b - prev
        if e > prev:
            prev = e
    if prev < hi:
        host += hi - prev
    return host, kernel, other


def _loops() -> Any:
    """The compiled twin of :func:`union_pass` / :func:`edge_waits` when built, else this module."""
    from ...merge.writers import native

    return native.twin(NATIVE_TWIN) or sys.modules[__name__]


NATIVE_TWIN = "rl_trace_observer.analysis.gpu._gpu_native"


def figures(
    cols: Columns, cpu: list[iv.Interval] | None, threshold_ns: int = KERNEL_WAIT_BELOW_NS
) -> tuple[dict[str, Any], list[iv.Interval]]:
    """``cpu``: the CPU window (sorted, disjoint), or None for a whole run. Returns the figures
    and the busy intervals."""
    loops = _loops()
    pieces, firsts, delays, comp, comm, both, busy = loops.union_pass(*cols)
    if cpu is None and pieces:
        cpu = [(pieces[0][0], pieces[-1][1])]
    cpu = cpu or []
    if len(cpu) == 1:
        waits = loops.edge_waits(pieces, firsts, cpu[0][0], cpu[0][1], threshold_ns)
    else:
        waits = _waits(pieces, firsts, cpu, threshold_ns)
    out: dict[str, Any] = {"kernels": len(cols.starts), "busy_ns": busy}
    out["span_ns"] = pieces[-1][1] - pieces[0][0] if pieces else 0
    out["compute_ns"] = comp
    out["comm_ns"] = both - comp
    out["memory_ns"] = busy - both
    out["overlap_ns"] = comp + comm - both
    out["idle_ns"] = sum(waits)
    out["wall_ns"] = busy + out["idle_ns"]
    out["host_wait_ns"], out["kernel_wait_ns"], out["other_wait_ns"] = waits
    out |= _delays(delays)
    return {k: out[k] for k in FIGURES}, pieces


def _waits(
    pieces: list[iv.Interval], firsts: list[int], cpu: list[iv.Interval], threshold: int
) -> tuple[int, int, int]:
    """(host, kernel, other) idle time of ``cpu`` (several intervals: a stage's spans) less the busy
    ``pieces``, each idle piece judged by the busy piece after it (``firsts``: its first launch)."""
    waits = [0, 0, 0]
    starts = [s for s, _ in pieces]
    for a, b in iv.subtract(iv.union(cpu), pieces):
        j = bisect.bisect_left(starts, b)
        if j == len(starts):
            waits[0] += b - a
        else:
            waits[_judge(a, starts[j], firsts[j], threshold)] += b - a
    return waits[0], waits[1], waits[2]


def _judge(a: int, next_start: int, launched: int, threshold: int) -> int:
    """0 host wait, 1 kernel wait, 2 other — for idle from ``a`` until a kernel starts."""
    if launched != UNKNOWN and launched > a:
        return 0
    return 1 if next_start - a < threshold else 2


def _delays(delays: list[int]) -> dict[str, int | None]:
    if not delays:
        return {"launch_delay_p50_ns": None, "launch_delay_p95_ns": None, "launch_delay_max_ns": None}
    delays.sort()  # once: both percentiles from it (as numpy's linear interpolation)
    return {
        "launch_delay_p50_ns": round(_sorted_pct(delays, 0.50)),
        "launch_delay_p95_ns": round(_sorted_pct(delays, 0.95)),
        "launch_delay_max_ns": delays[-1],
    }


def _sorted_pct(ordered: list[int], q: float) -> float:
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


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
