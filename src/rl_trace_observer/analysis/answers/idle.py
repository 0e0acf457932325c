"""Idle time with a cause, and goodput buckets — per lane, role and step, exact to the nanosecond.

A lane is idle in a step where none of its stage spans runs. Each idle nanosecond gets the FIRST
cause that holds at that moment (so the causes partition the idle time and sum to it exactly):

1. ``weight_sync``: some lane is in a weight-sync span (the pause every role sits through);
2. ``waiting_for_rollout``: a trainer (or driver) lane while a rollout lane generates;
3. ``waiting_for_trainer``: a rollout (or driver) lane while a trainer lane computes log-probs or
   updates (backpressure: the replicas wait for the next weights);
4. ``waiting_for_peers``: other lanes of the lane's own role still work (a barrier: the straggler
   section says who);
5. ``unexplained``: other trainer or rollout lanes work at something that explains none of the above;
6. ``driver``: no other trainer or rollout lane runs any stage — step-boundary time, the driver's
   own work between stages (reward, advantages, data loading) or nothing at all.

Lane kinds (trainer / rollout / other) come from :func:`.model.lane_kinds`. Goodput per lane and
role: ``productive`` = time in generation, log-prob or update; ``overhead`` = weight sync and
unclassified stages, where not productive; ``idle`` = the rest of the step; ``wasted`` = time in
spans that say so; the four sum to the step's wall time (the role's lanes are joined: a role is
productive while any of its lanes is). A span that carries nemo-lens's ``rl.bucket`` (NeMo-RL's
OTLP spans) is counted in that bucket instead of by its stage; one tagged ``idle`` is idle time,
not work, for the causes too.
"""

from __future__ import annotations

from collections import defaultdict
from operator import itemgetter
from typing import Any

from . import interval_arrays as ia
from . import intervals as iv
from .model import (
    OVERHEAD,
    PRODUCTIVE,
    ROLLOUT,
    TRAINER,
    Lane,
    RowTable,
    StepWindow,
    WorkSpan,
    by_lane,
    lane_kinds,
)

CAUSES = (
    "weight_sync",
    "waiting_for_rollout",
    "waiting_for_trainer",
    "waiting_for_peers",
    "driver",
    "unexplained",
)
BUCKETS = ("productive", "overhead", "idle", "wasted")
Ints = list[iv.Interval] | ia.ArrayUnion  # a union: a list of intervals, or its two arrays


# What a span counts as in a window, as bits: its stage and ``rl.bucket`` (and its lane's kind) decide
_WORK, _PROD, _OVER, _WASTED, _SYNC, _GEN, _TRAIN = (1 << i for i in range(7))
_BUCKET_BITS = {"productive": _PROD, "overhead": _OVER, "wasted": _WASTED}


def _flags(stage: str, bucket: str | None, kind: str) -> int:
    """The sets a span joins, as bits (both ways of building :class:`_StepSets` read them)."""
    f = 0
    if bucket is None:  # by its stage; a span's own ``rl.bucket`` wins over its stage
        f |= _WORK | (_PROD if stage in PRODUCTIVE else 0) | (_OVER if stage in OVERHEAD else 0)
    else:
        f |= (_WORK if bucket != "idle" else 0) | _BUCKET_BITS.get(bucket, 0)
    if stage == "weight_sync":
        f |= _SYNC
    elif kind == ROLLOUT and stage == "generation":
        f |= _GEN
    elif kind == TRAINER and (stage == "log_prob" or stage == "update"):
        f |= _TRAIN
    return f


class LaneColumns:
    """Every lane's spans as int64 columns and set bits, made once for all the windows of a report:
    a window's sets are then masks and one union each (numpy), not a clipped tuple per span and
    window turned back into an array for every union (~1.5 s of a 1M-span report)."""

    def __init__(self, lanes: dict[Lane, list[WorkSpan]], kinds: dict[Lane, str]) -> None:
        np = ia.numpy_or_none()
        self.cols: dict[Lane, tuple[Any, Any, Any]] = {}
        for lane, spans in lanes.items():
            kind, n = kinds[lane], len(spans)
            if isinstance(spans, RowTable) and spans.columnar():  # the columns are there: no row made
                starts, ends, ids = spans.arrays()
                table = np.array([_flags(c[3], c[6], kind) for c in spans.contexts], dtype=np.int64)
                self.cols[lane] = (starts, ends, table[ids] if len(ids) else np.empty(0, np.int64))
                continue
            codes: dict[tuple[str, str | None], int] = {}
            for key in set(map(_STAGE_BUCKET, spans)):
                codes[key] = _flags(key[0], key[1], kind)
            self.cols[lane] = (
                np.fromiter(map(_START, spans), np.int64, n),
                np.fromiter(map(_END, spans), np.int64, n),
                np.fromiter(map(codes.__getitem__, map(_STAGE_BUCKET, spans)), np.int64, n),
            )

    @staticmethod
    def make(lanes: dict[Lane, list[WorkSpan]], kinds: dict[Lane, str]) -> LaneColumns | None:
        """None where the Python sets must be used: no numpy, or a time beyond int64."""
        if ia.numpy_or_none() is None:
            return None
        try:
            return LaneColumns(lanes, kinds)
        except OverflowError:
            return None


_START, _END, _STAGE_BUCKET = itemgetter(4), itemgetter(5), itemgetter(3, 8)
# which union each bit's spans join: the lane's own (work), its role's (goodput), or the run-wide one
_KEYED_BITS = (
    (_WORK, lambda lane: lane), (_PROD, itemgetter(0)), (_OVER, itemgetter(0)), (_WASTED, itemgetter(0)),
    (_SYNC, lambda lane: ""), (_GEN, lambda lane: ""), (_TRAIN, lambda lane: ""),
)  # fmt: skip


class _StepSets:
    """Per-lane unions inside one window, and the run-wide sets causes are tested against."""

    def __init__(
        self,
        lanes: dict[Lane, list[WorkSpan]],
        w: StepWindow,
        kinds: dict[Lane, str],
        columns: LaneColumns | None = None,
    ) -> None:
        lo, hi = w.start_ns, w.end_ns
        # lists of intervals (the Python path) or ArrayUnions (the columns path: only ever measured)
        self.work: dict[Lane, Ints] = {}
        self.sync: Ints = []
        self.gen: Ints = []
        self.train: Ints = []
        self.role_work: dict[str, Ints] = {}
        self.worker_work: Ints = []
        # per role, not per lane: goodput joins a role's lanes (a role is productive while any is)
        self.productive: dict[str, list[iv.Interval]] = defaultdict(list)
        self.overhead: dict[str, list[iv.Interval]] = defaultdict(list)
        self.wasted: dict[str, list[iv.Interval]] = defaultdict(list)
        # What blocks a lane where it is idle: the work of its role's lanes, and of every worker lane.
        # Its own work is in them too, but never where it is idle (its idle time is the window minus
        # its work), so one union per role serves every lane of it: a union per lane of all the
        # OTHER lanes cost lanes² (37 s of a 64-lane, 100k-event step).
        if columns is not None and ia.available(lo, hi):
            self._from_columns(columns, lo, hi, kinds)
        else:
            self._from_spans(lanes, lo, hi, kinds)
        self._cumulative: dict[tuple[str, str], list[tuple[str, ia.Measure]]] = {}

    def _from_columns(self, columns: LaneColumns, lo: int, hi: int, kinds: dict[Lane, str]) -> None:
        np = ia.numpy_or_none()
        # (lane, role or "", bit): each lane's union at once, joined as they come (ia.Accumulated)
        picked: dict[tuple[Any, int], ia.Accumulated] = defaultdict(ia.Accumulated)
        for lane, (starts, ends, flags) in columns.cols.items():
            live = (starts < hi) & (ends > lo)
            if not live.all():
                starts, ends, flags = starts[live], ends[live], flags[live]
            starts, ends = np.clip(starts, lo, hi), np.clip(ends, lo, hi)
            for bit, key in _KEYED_BITS:
                m = (flags & bit) != 0
                if m.any():
                    picked[(key(lane), bit)].add(ia.ArrayUnion(*ia.union(starts[m], ends[m])))
        work = {lane: picked[(lane, _WORK)].union() for lane in columns.cols}
        self.work.update(work)
        roles: dict[str, ia.Accumulated] = defaultdict(ia.Accumulated)
        workers = ia.Accumulated()
        for lane, u in work.items():
            roles[lane[0]].add(u)
            if kinds[lane] in (TRAINER, ROLLOUT):
                workers.add(u)
        for role in roles:
            self.role_work[role] = roles[role].union()
            self.productive[role] = picked[(role, _PROD)].union().intervals()
            self.overhead[role] = picked[(role, _OVER)].union().intervals()
            self.wasted[role] = picked[(role, _WASTED)].union().intervals()
        self.worker_work = workers.union()
        self.sync, self.gen, self.train = (picked[("", bit)].union() for bit in (_SYNC, _GEN, _TRAIN))

    def _from_spans(
        self, lanes: dict[Lane, list[WorkSpan]], lo: int, hi: int, kinds: dict[Lane, str]
    ) -> None:
        sync: list[iv.Interval] = []
        gen: list[iv.Interval] = []
        train: list[iv.Interval] = []
        for lane, spans in lanes.items():  # one pass per lane (this runs for every live step)
            kind = kinds[lane]
            codes: dict[tuple[str, str | None], int] = {}
            work: list[iv.Interval] = []
            prod, over, wasted = self.productive[lane[0]], self.overhead[lane[0]], self.wasted[lane[0]]
            for s in spans:
                a, b = s.start_ns, s.end_ns
                if a >= hi or b <= lo:
                    continue
                i = (a if a > lo else lo, b if b < hi else hi)
                f = codes.get((s.stage, s.bucket))
                if f is None:
                    f = codes[(s.stage, s.bucket)] = _flags(s.stage, s.bucket, kind)
                for bit, into in ((_WORK, work), (_PROD, prod), (_OVER, over), (_WASTED, wasted)):
                    if f & bit:
                        into.append(i)
                for bit, into in ((_SYNC, sync), (_GEN, gen), (_TRAIN, train)):
                    if f & bit:
                        into.append(i)
            self.work[lane] = ia.union_list(work)
        self.sync, self.gen, self.train = ia.union_list(sync), ia.union_list(gen), ia.union_list(train)
        self.role_work = {
            role: ia.union_list([i for lane, ints in self.work.items() if lane[0] == role for i in ints])
            for role in {lane[0] for lane in self.work}
        }
        self.worker_work = ia.union_list(
            [i for lane, ints in self.work.items() if kinds[lane] in (TRAINER, ROLLOUT) for i in ints]
        )

    def cumulative(self, lane: Lane, kinds: dict[Lane, str]) -> list[tuple[str, ia.Measure]]:
        """Per cause of :func:`_blockers`, the union of it and every cause before it, measured —
        the same for every lane of one role and kind, so made once per step for them."""
        key = (lane[0], kinds[lane])
        if key not in self._cumulative:
            made: list[tuple[str, ia.Measure]] = []
            starts, ends = ia.as_arrays([])
            for cause, blocker in _blockers(lane, kinds, self):
                bs, be = ia.as_arrays(blocker)
                starts, ends = ia.union(ia.concat(starts, bs), ia.concat(ends, be))
                made.append((cause, ia.Measure(starts, ends)))
            self._cumulative[key] = made
        return self._cumulative[key]


def _blockers(lane: Lane, kinds: dict[Lane, str], sets: _StepSets) -> list[tuple[str, Ints]]:
    """What can keep ``lane`` idle, in the order the causes are tried (the first that holds wins)."""
    kind = kinds[lane]
    steps: list[tuple[str, Ints]] = [("weight_sync", sets.sync)]
    if kind != ROLLOUT:
        steps.append(("waiting_for_rollout", sets.gen))
    if kind != TRAINER:
        steps.append(("waiting_for_trainer", sets.train))
    # the other lanes of its role (its own work is never where it is idle), then any worker lane:
    # workers only, the driver's (or a reward worker's) own spans are "driver" time
    steps += [("waiting_for_peers", sets.role_work[lane[0]]), ("unexplained", sets.worker_work)]
    return steps


def _listed(ints: Ints) -> list[iv.Interval]:
    return ints.intervals() if isinstance(ints, ia.ArrayUnion) else ints


def _cause_sets(
    lane: Lane, kinds: dict[Lane, str], sets: _StepSets, w: StepWindow
) -> dict[str, list[iv.Interval]]:
    """The lane's idle time in ``w`` as intervals per cause (the first cause that holds wins)."""
    rest = iv.subtract([(w.start_ns, w.end_ns)], _listed(sets.work[lane]))
    out: dict[str, list[iv.Interval]] = {c: [] for c in CAUSES}
    for cause, blocker in _blockers(lane, kinds, sets):
        out[cause] += iv.intersect(rest, _listed(blocker))
        rest = iv.subtract(rest, _listed(blocker))
    out["driver"] = rest
    return out


def _causes(lane: Lane, kinds: dict[Lane, str], sets: _StepSets, w: StepWindow) -> dict[str, int]:
    """The lengths of :func:`_cause_sets`, by measure instead of by the sets themselves: with
    ``C_k`` the union of the first ``k`` blockers and ``W`` the lane's work, the idle time whose
    first cause is among the first ``k`` is ``|C_k| - |C_k ∩ W|`` (``W`` and every ``C_k`` lie in
    the window), so each cause's time is the step between two of them, and ``driver`` the rest."""
    lo, hi = w.start_ns, w.end_ns
    if not ia.available(lo, hi):
        return {c: iv.length(ints) for c, ints in _cause_sets(lane, kinds, sets, w).items()}
    ws, we = ia.as_arrays(sets.work[lane])
    out = dict.fromkeys(CAUSES, 0)
    before = 0
    for cause, measure in sets.cumulative(lane, kinds):
        upto = measure.total - measure.overlap(ws, we)
        out[cause] = upto - before
        before = upto
    out["driver"] = (hi - lo) - int((we - ws).sum()) - before
    return out


def cause_intervals(
    spans: list[WorkSpan], windows: list[StepWindow]
) -> dict[Lane, dict[str, list[iv.Interval]]]:
    """Per lane, each cause's idle intervals over every step (what the GPU answers intersect)."""
    lanes = by_lane(spans)
    kinds = lane_kinds(lanes)
    out: dict[Lane, dict[str, list[iv.Interval]]] = {lane: {c: [] for c in CAUSES} for lane in kinds}
    for w in windows:
        sets = _StepSets(lanes, w, kinds)
        for lane in kinds:
            for c, ints in _cause_sets(lane, kinds, sets, w).items():
                out[lane][c] += ints
    return out


def _buckets(
    productive: list[iv.Interval], overhead: list[iv.Interval], wasted: list[iv.Interval], wall: int
) -> dict[str, int]:
    """Each moment once: productive first, then wasted, then overhead; idle is the rest."""
    p = iv.length(productive)
    wasted = iv.subtract(wasted, productive)
    w = iv.length(wasted)
    o = iv.length(iv.subtract(iv.subtract(overhead, productive), wasted))
    return {"productive_ns": p, "overhead_ns": o, "idle_ns": wall - p - o - w, "wasted_ns": w}


def idle_and_goodput(
    spans: list[WorkSpan], windows: list[StepWindow], lanes: dict[Lane, list[WorkSpan]] | None = None
) -> dict[str, Any]:
    """The report's ``idle`` and ``goodput`` sections (schema in :data:`..report.compute.SCHEMA_DOC`);
    ``lanes``: ``by_lane(spans)`` when the caller has it already."""
    lanes = by_lane(spans) if lanes is None else lanes
    kinds = lane_kinds(lanes)
    idle_steps, good_steps = [], []
    idle_roles: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(("idle_ns", *CAUSES), 0))
    good_roles: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(("wall_ns", *BUCKETS), 0))
    columns = LaneColumns.make(lanes, kinds)
    for w in windows:
        sets = _StepSets(lanes, w, kinds, columns)
        wall = w.end_ns - w.start_ns
        rows = []
        for lane, kind in kinds.items():
            causes = _causes(lane, kinds, sets, w)
            idle = sum(causes.values())
            rows.append(
                {"role": lane[0], "lane": lane[1], "kind": kind, "idle_ns": idle, "causes_ns": causes}
            )
            total = idle_roles[lane[0]]
            total["idle_ns"] += idle
            for c, ns in causes.items():
                total[c] += ns
        idle_steps.append({"step": w.step, "dur_ns": wall, "lanes": rows})
        roles = []
        for role in sorted({lane[0] for lane in kinds}):
            mine = [lane for lane in kinds if lane[0] == role]
            prod = ia.union_list(sets.productive.get(role, []))
            over = ia.union_list(sets.overhead.get(role, []))
            wasted = ia.union_list(sets.wasted.get(role, []))
            buckets = _buckets(prod, over, wasted, wall)
            roles.append({"role": role, "lanes": len(mine), **buckets})
            g = good_roles[role]
            g["wall_ns"] += wall
            for b in BUCKETS:
                g[b] += buckets[f"{b}_ns"]
        good_steps.append({"step": w.step, "dur_ns": wall, "roles": roles})
    return {
        "idle": {
            "causes": list(CAUSES),
            "steps": idle_steps,
            "roles": [
                {
                    "role": role,
                    "lanes": sum(1 for lane in kinds if lane[0] == role),
                    **{"idle_ns": t["idle_ns"], "causes_ns": {c: t[c] for c in CAUSES}},
                }
                for role, t in sorted(idle_roles.items())
            ],
        },
        "goodput": {
            "buckets": list(BUCKETS),
            "steps": good_steps,
            "roles": [
                {
                    "role": role,
                    "wall_ns": g["wall_ns"],
                    **{f"{b}_ns": g[b] for b in BUCKETS},
                    "productive_pct": round(100.0 * g["productive"] / g["wall_ns"], 2)
                    if g["wall_ns"]
                    else None,
                }
                for role, g in sorted(good_roles.items())
            ],
        },
    }
