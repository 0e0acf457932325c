"""The GPU analysis' per-kernel loops on ``array('q')`` columns: the reference its compiled twin
(``_gpu_native.pyx``, built by setup.py) reproduces, tested equal in ``tests/report/test_gpu.py``.

Why columns and a twin: the analysis visits each of a run's ~1M kernels five times (placing it,
its run, step and stage figures, its stream); a Python object per kernel and visit cost ~6 CPU s
for the 10M-event generated run, more than the rest of the report. :func:`native` picks the twin.
"""

from __future__ import annotations

import bisect
import sys
from array import array
from collections import defaultdict
from collections.abc import Sequence
from itertools import accumulate
from operator import sub
from typing import Any

__all__ = ["UNKNOWN", "native"]

UNKNOWN = -(1 << 62)  # "no launch": sorts before every time, and is never "after" a gap began
NATIVE_TWIN = "rl_trace_observer.analysis.gpu._gpu_native"
Q = Sequence[int]


def native() -> Any:
    """The compiled twin when built and enabled, else this module."""
    from ...common import twins

    return twins.twin(NATIVE_TWIN) or sys.modules[__name__]


def take(src: Q, positions: Q) -> array:  # type: ignore[type-arg]
    return array("q", [src[j] for j in positions])


def gather_columns(
    order: Q, ts: Q, dur: Q, names: Q, code_of_name: Q, launch_ts: Q, launch_end: Q
) -> tuple[array, ...]:  # type: ignore[type-arg]
    """(starts, ends, kind codes, launch starts, launch ends) of the kernels ``order`` names."""
    starts = [ts[i] for i in order]
    return (
        array("q", starts),
        array("q", [s + dur[i] for s, i in zip(starts, order)]),  # noqa: B905
        array("q", [code_of_name[names[i]] for i in order]),
        array("q", [launch_ts[i] for i in order]),
        array("q", [launch_end[i] for i in order]),
    )


def order_kernels(pid: Q, ts: Q, launch: Q) -> array:  # type: ignore[type-arg]
    """Kernel indices by (process, start, launch, index): each device's kernels in the order every
    figure walks them."""
    return array("q", sorted(range(len(ts)), key=lambda i: (pid[i], ts[i], launch[i])))


def union_pass(
    starts: Q, ends: Q, codes: Q, launches: Q, launch_ends: Q
) -> tuple[array, array, array, array, int, int, int, int]:  # type: ignore[type-arg]
    """One pass over kernels sorted by (start, launch): the busy pieces (starts, ends), the launch of
    each piece's first kernel, the launch delays, |compute|, |comm|, |compute ∪ comm| and |busy| —
    the running unions kept inline (codes: 0 compute, 1 comm, 2 memory)."""
    p_start: list[int] = []
    p_end: list[int] = []
    firsts: list[int] = []
    delays: list[int] = []
    bs = be = cs = ce = ms = me = xs = xe = UNKNOWN
    comp = comm = both = busy = 0
    for s, e, k, launched, le in zip(starts, ends, codes, launches, launch_ends):  # noqa: B905
        if s > be:
            if be > bs:
                p_start.append(bs)
                p_end.append(be)
                busy += be - bs
            else:
                del firsts[-1:]
            bs, be = s, e
            firsts.append(launched)
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
            delays.append(s - le if s > le else 0)
    if be > bs:
        p_start.append(bs)
        p_end.append(be)
        busy += be - bs
    else:
        del firsts[-1:]
    cols = (array("q", p_start), array("q", p_end), array("q", firsts), array("q", delays))
    return (*cols, comp + ce - cs, comm + me - ms, both + xe - xs, busy)


def _judge(a: int, next_start: int, launched: int, threshold: int) -> int:
    """0 host wait, 1 kernel wait, 2 other — for idle from ``a`` until a kernel starts."""
    if launched != UNKNOWN and launched > a:
        return 0
    return 1 if next_start - a < threshold else 2


def edge_waits(p_start: Q, p_end: Q, firsts: Q, lo: int, hi: int, threshold: int) -> tuple[int, int, int]:
    """(host, kernel, other) idle time of the window [lo, hi) less the busy pieces (sorted,
    disjoint): the gaps between pieces and the two edges, each judged by the piece after it."""
    waits = [0, 0, 0]
    prev = lo  # the idle piece starts here; it only grows
    for s, e, launched in zip(p_start, p_end, firsts):  # noqa: B905
        if s > prev:
            if prev >= hi:
                break
            waits[_judge(prev, s, launched, threshold)] += (s if s < hi else hi) - prev
        if e > prev:
            prev = e
    if prev < hi:
        waits[0] += hi - prev
    return waits[0], waits[1], waits[2]


def span_waits(
    p_start: Q, p_end: Q, firsts: Q, cpu_start: Q, cpu_end: Q, threshold: int
) -> tuple[int, int, int]:
    """(host, kernel, other) idle time of ``cpu`` (a union: a stage's spans) less the busy pieces,
    each idle piece judged by the first piece starting at or after its end (none: host wait)."""
    from ..answers import intervals as iv

    waits = [0, 0, 0]
    for a, b in iv.subtract(list(zip(cpu_start, cpu_end)), list(zip(p_start, p_end))):  # noqa: B905
        j = bisect.bisect_left(p_start, b)
        waits[0 if j == len(p_start) else _judge(a, p_start[j], firsts[j], threshold)] += b - a
    return waits[0], waits[1], waits[2]


def stream_gaps(
    order: Q, ts: Q, dur: Q, stream: Q, launch_ts: Q, threshold: int
) -> list[tuple[int, int, int, int, int]]:
    """HTA's ``get_idle_time_breakdown`` per stream: (stream, kernels, host, kernel, other), by stream.
    The gap before each kernel (its start minus the latest end of the kernels before it on the stream,
    in start order) goes to host wait when it was launched after that end, else to kernel wait below
    the threshold, else to other. A kernel that starts before the ones before it ended (programmatic
    dependent launch overlaps consecutive kernels of a stream) leaves no gap: HTA, measuring from the
    previous kernel's end alone, counts that overlap as negative idle."""
    per: dict[int, list[int]] = defaultdict(list)
    for i in order:
        per[stream[i]].append(i)
    out = []
    for s, ks in sorted(per.items()):
        waits = [0, 0, 0]
        prev_end = ts[ks[0]] + dur[ks[0]]
        for i in ks[1:]:
            gap = ts[i] - prev_end
            if gap > 0:
                launched = launch_ts[i]
                after = launched != UNKNOWN and launched > prev_end
                waits[0 if after else 1 if gap < threshold else 2] += gap
            prev_end = max(prev_end, ts[i] + dur[i])
        out.append((s, len(ks), waits[0], waits[1], waits[2]))
    return out


def name_totals(order: Q, names: Q, dur: Q, count: int) -> tuple[array, array, array]:  # type: ignore[type-arg]
    """Per name id: (kernels, summed duration, longest) over ``order``."""
    c, t, m = [0] * count, [0] * count, [0] * count
    for i in order:
        k, d = names[i], dur[i]
        c[k] += 1
        t[k] += d
        if d > m[k]:
            m[k] = d
    return array("q", c), array("q", t), array("q", m)


def group(keys: Q) -> dict[int, array]:  # type: ignore[type-arg]
    """Positions per key, each in order."""
    out: dict[int, list[int]] = defaultdict(list)
    for j, k in enumerate(keys):
        out[k].append(j)
    return {k: array("q", v) for k, v in out.items()}


def ranks(values: array, wanted: list[int]) -> list[int]:  # type: ignore[type-arg]
    """The values at the sorted positions ``wanted`` (ascending)."""
    ordered = sorted(values)
    return [ordered[r] for r in wanted]


def union_columns(lists: list[tuple[Q, Q]]) -> tuple[array, array]:  # type: ignore[type-arg]
    """The union (``iv.union``) of several (starts, ends) column pairs, as two columns."""
    from ..answers import intervals as iv

    joined = iv.union(piece for s, e in lists for piece in zip(s, e))  # noqa: B905
    return array("q", [s for s, _ in joined]), array("q", [e for _, e in joined])


def prefix_lengths(starts: Q, ends: Q) -> array:  # type: ignore[type-arg]
    """[0, then the running total of the pieces' lengths]."""
    return array("q", [0, *accumulate(map(sub, ends, starts))])
