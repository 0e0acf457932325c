"""The report's rollout section: requests and their long tail, replicas, weight sync, staleness.

Fed by plain span records (anything with ``name``, ``cat``, ``pid``, ``start_ns``, ``dur_ns`` and a
dict ``args``) — the capture layer's own kinds (:mod:`...capture.requests`) — plus the step windows
and, for "what the trainer did meanwhile", the report's stage spans. All times are integer ns on the
merged timeline; every figure names the spans it came from (request ids, versions, replicas), so a
user can find them in Perfetto.

Definitions (``rl-trace-report/2``, key ``rollout``):

- **request**: one request id. Its *latency* is the client span (``rollout_request``: the agent loop's
  wait, what the step waits for); a request seen only by its server counts with its server span
  (``engine_request``). Server time comes from the server span, the engine's
  ``queue``/``prefill``/``decode`` from the sub-spans the merger drew under it. A request's *step*
  is its client's ``step`` argument (the batch it was generated for), else the step window in which
  it ended. Validation requests are counted apart.
- **rejected**: requests whose ``status`` argument is ``rejected`` (an AReaL session its workflow's
  ``should_accept_fn`` refused, where AReaL drops stale-weight samples, or that returned nothing).
- **percentiles**: linear interpolation between order statistics (numpy's default), rounded to ns.
- **tail window** of a step: from ``t90`` — the 90th percentile of the step's request end times, the
  moment 90 % of them had finished — until the last one did; the *tail requests* end after ``t90``.
  **trainer during the tail**: the training roles' stage spans clipped to that window, by category,
  and ``idle`` = the window minus their union.
- **replicas**: per step, requests, prompt and response tokens, ``busy_ns`` (union of the replica's
  server spans), ``tokens_per_s`` = response tokens / busy seconds; **imbalance** = max / mean over
  replicas (1.0 = even) of requests, of response tokens and of busy time (``busy_ns``).
- **weight sync**: one row per trainer-side ``update_weights`` span (its ``dur_ns``, start to end, is
  the sync's total: it waits for every replica); its phases are the trainer's
  weight-sync spans inside it; every replica's weight-sync spans overlapping it give that replica's
  phases, ``dur_ns`` (their union, clipped) and ``bytes`` (``load_weights``); the slowest replica
  held the sync up.
- **staleness**: the trainer's ``consume_samples`` spans: per step, samples and the distribution of
  lag in steps (trainer policy version − the oldest version that produced a sample's tokens).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...capture.requests import (
    CLIENT_SPAN,
    PHASE_CAT,
    REQUEST_CAT,
    SERVER_SPAN,
    STALENESS_CAT,
    SYNC_CAT,
)
from ...capture.staleness import CONSUME_SPAN
from ..answers import interval_arrays as ia
from ..answers import intervals as iv
from ..answers.interval_chunks import IntervalChunks
from .stages import is_sync_root, is_weight_load

TAIL_QUANTILE = 0.9
# the training roles' stage spans: (category, start_ns, end_ns) each, or their intervals by category
Training = Sequence[tuple[str, int, int]] | Mapping[str, Collection[tuple[int, int]]]
REJECTED = "rejected"  # a request's ``status`` when its sample was refused (AReaL: stale or filtered)
SLOWEST_SHOWN = 10
TAIL_LISTED = 20
PHASES = ("queue", "prefill", "decode")
CATEGORY_PREFIX = "rl_trace."  # the capture layer's span categories: the loader keeps them


class SpanLike(Protocol):
    name: str
    cat: str
    pid: Any
    start_ns: int
    dur_ns: int
    args: dict[str, Any]


@dataclass
class Req:
    """One request id with what its client and server spans said."""

    request_id: str
    client: SpanLike | None = None
    server: SpanLike | None = None
    step: int | None = None
    phases: dict[str, int] = field(default_factory=dict)  # queue/prefill/decode sub-spans, ns
    known_replica: Any = None  # a client-only request: the replica its server address is known as

    @property
    def span(self) -> SpanLike:
        found = self.client or self.server
        assert found is not None
        return found

    @property
    def end_ns(self) -> int:
        return self.span.start_ns + self.span.dur_ns

    def arg(self, key: str) -> Any:
        for s in (self.client, self.server):
            if s is not None and s.args.get(key) is not None:
                return s.args[key]
        return None

    @property
    def replica(self) -> Any:
        if self.server is not None and self.server.args.get("replica") is not None:
            return self.server.args["replica"]
        if self.known_replica is not None:
            return self.known_replica
        return self.client.args.get("server") if self.client is not None else None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def percentile(values: Sequence[int | float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default); ``values`` non-empty."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def latency_stats(values: Sequence[int]) -> dict[str, int] | None:
    """p50/p95/p99/max/mean of durations in ns (None for no values)."""
    if not values:
        return None
    return {
        "p50": round(percentile(values, 0.50)),
        "p95": round(percentile(values, 0.95)),
        "p99": round(percentile(values, 0.99)),
        "max": max(values),
        "mean": round(sum(values) / len(values)),
    }


def tail_window(ends: Sequence[int], q: float = TAIL_QUANTILE) -> tuple[int, int] | None:
    """(t90, last end) for a step's request end times; None without requests."""
    if not ends:
        return None
    return round(percentile(ends, q)), max(ends)


# ------------------------------------------------------------------------------------ requests
def _requests(spans: Iterable[SpanLike]) -> dict[str, Req]:
    reqs: dict[str, Req] = {}
    phases: list[SpanLike] = []
    for s in spans:
        if s.cat == PHASE_CAT:
            phases.append(s)
            continue
        if s.cat != REQUEST_CAT or s.name not in (CLIENT_SPAN, SERVER_SPAN):
            continue
        rid = str(s.args.get("request_id", ""))
        if not rid:
            continue
        req = reqs.get(rid) or reqs.setdefault(rid, Req(rid))
        if s.name == CLIENT_SPAN:
            req.client = s
        else:
            req.server = s
    for s in phases:  # the sub-spans the merger drew from the server's engine times (clock-corrected)
        found = reqs.get(str(s.args.get("request_id", "")))
        if found is not None and s.name in PHASES:
            found.phases[s.name] = found.phases.get(s.name, 0) + s.dur_ns
    _name_unserved(reqs.values())
    return reqs


def _name_unserved(reqs: Iterable[Req]) -> None:
    """A request no server span answered (it failed, or the run's end cut it) is counted under the
    replica its server address is known as from the requests that were answered there, not as a
    replica row of its own named by the address; an address no answered request names stays."""
    addresses: dict[str, set[Any]] = defaultdict(set)
    unserved = []
    for r in reqs:
        address = r.client.args.get("server") if r.client is not None else None
        if address is None:
            continue
        if r.server is not None and r.server.args.get("replica") is not None:
            addresses[str(address)].add(r.server.args["replica"])
        elif r.server is None:
            unserved.append((r, str(address)))
    for r, address in unserved:
        known = addresses.get(address, set())
        if len(known) == 1:  # an address that served two replicas (restarted engines) names neither
            r.known_replica = next(iter(known))


def _assign_steps(reqs: Iterable[Req], windows: Sequence[tuple[int | None, int, int]]) -> None:
    for r in reqs:
        step = _int(r.client.args.get("step")) if r.client is not None else None
        if step is None:
            end = r.end_ns
            step = next((w for w, lo, hi in windows if lo <= end <= hi), None)
        r.step = step


def _sample_key(r: Req) -> tuple[Any, ...] | None:
    if r.client is None:
        return None
    a = r.client.args
    sample = a.get("uid", a.get("sample_index"))
    session = a.get("session_id", a.get("rollout_n"))
    if sample is None:
        return (a.get("session"),) if a.get("session") is not None else None
    return (r.step, str(sample), str(session))


def _row(r: Req, turns: dict[tuple[Any, ...], int]) -> dict[str, Any]:
    span = r.span
    key = _sample_key(r)
    row: dict[str, Any] = {
        "request_id": r.request_id,
        "step": r.step,
        "replica": r.replica,
        "start_ns": span.start_ns,
        "latency_ns": span.dur_ns,
        "server_ns": r.server.dur_ns if r.server is not None else None,
        "turn": _int(r.arg("turn")),
        "turns": turns.get(key) if key is not None else None,
        "attempt": _int(r.arg("attempt")),
        "sample": r.arg("uid") if r.arg("uid") is not None else r.arg("sample_index"),
        "session": r.arg("session_id") if r.arg("session_id") is not None else r.arg("rollout_n"),
        "status": r.arg("status"),
        "version": r.arg("version"),
        "response_tokens": _int(r.arg("response_tokens")),
        "seen_by": "both"
        if r.client is not None and r.server is not None
        else ("client" if r.client else "server"),
    }
    for name in PHASES:
        row[f"{name}_ns"] = r.phases.get(name)
    return row


def _replica_rows(reqs: list[Req]) -> tuple[list[dict[str, Any]], dict[str, float | None]]:
    by: dict[Any, list[Req]] = defaultdict(list)
    for r in reqs:
        by[r.replica].append(r)
    rows = []
    for replica, group in sorted(by.items(), key=lambda kv: (kv[0] is None, str(kv[0]))):
        servers = [
            (r.server.start_ns, r.server.start_ns + r.server.dur_ns) for r in group if r.server is not None
        ]
        busy = iv.length(iv.union(servers)) if servers else 0
        out_tokens = sum(_int(r.arg("response_tokens")) or 0 for r in group)
        rows.append(
            {
                "replica": replica,
                "requests": len(group),
                "prompt_tokens": sum(_int(r.arg("prompt_tokens")) or 0 for r in group),
                "response_tokens": out_tokens,
                "busy_ns": busy,
                "tokens_per_s": round(out_tokens / (busy / 1e9), 2) if busy else None,
            }
        )
    imbalance: dict[str, float | None] = {}
    for key in ("requests", "response_tokens", "busy_ns"):
        values = [row[key] for row in rows]
        mean = sum(values) / len(values) if values else 0
        imbalance[key] = round(max(values) / mean, 3) if mean else None
    return rows, imbalance


def _trainer_during(lo: int, hi: int, stage: Training) -> dict[str, int]:
    """Training stage time by category inside [lo, hi], and idle = the rest."""
    by_cat: Mapping[str, Collection[iv.Interval]]
    if isinstance(stage, Mapping):
        by_cat = stage
    else:
        by_cat = defaultdict(list)
        for cat, s, e in stage:
            by_cat[cat].append((s, e))
    out = {cat: ia.covered(ints, lo, hi) for cat, ints in sorted(by_cat.items())}
    parts = list(by_cat.values())
    if all(isinstance(p, IntervalChunks) for p in parts):  # the stage index's: joined, not copied
        busy = ia.covered(IntervalChunks.join(parts), lo, hi)  # type: ignore[arg-type]
    else:
        busy = ia.covered([i for ints in parts for i in ints], lo, hi)
    out["idle"] = (hi - lo) - busy
    return out


def _step_rows(reqs: list[Req], stage: Training, turns: dict[tuple[Any, ...], int]) -> list[dict[str, Any]]:
    by_step: dict[int | None, list[Req]] = defaultdict(list)
    for r in reqs:
        by_step[r.step].append(r)
    rows = []
    for step, group in sorted(by_step.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        latencies = [r.span.dur_ns for r in group]
        servers = [r.server.dur_ns for r in group if r.server is not None]
        window = tail_window([r.end_ns for r in group])
        assert window is not None
        t90, last = window
        tail = sorted((r for r in group if r.end_ns > t90), key=lambda r: -r.end_ns)
        replicas, imbalance = _replica_rows(group)
        phases = {name: latency_stats([r.phases[name] for r in group if name in r.phases]) for name in PHASES}
        rows.append(
            {
                "step": step,
                "requests": len(group),
                "rejected": sum(1 for r in group if r.arg("status") == REJECTED),
                "first_start_ns": min(r.span.start_ns for r in group),
                "last_end_ns": last,
                "latency_ns": latency_stats(latencies),
                "server_latency_ns": latency_stats(servers),
                "phases_ns": phases,
                "tail": {
                    "t90_ns": t90,
                    "end_ns": last,
                    "dur_ns": last - t90,
                    "requests": len(tail),
                    "request_ids": [r.request_id for r in tail[:TAIL_LISTED]],
                    "trainer_ns": _trainer_during(t90, last, stage) if last > t90 else {},
                },
                "replicas": replicas,
                "imbalance": imbalance,
                "slowest": [_row(r, turns) for r in sorted(group, key=lambda r: -r.span.dur_ns)[:3]],
            }
        )
    return rows


# --------------------------------------------------------------------------------- weight sync
def sync_step(windows: Sequence[tuple[int | None, int, int]], start_ns: int) -> int | None:
    """The step of a weight sync: the step whose window holds its start (``lo <= start < hi``); one
    that starts between two steps' windows belongs to the step after it (the step whose rollout it
    feeds: a 25-minute sync between steps must show in some step's figures); before the first
    window or after the last, None. By time only, so the watch's piece of one step (which reaches
    back to the previous step's end) and the whole run assign it the same way."""
    inside = next((w for w, lo, hi in windows if lo <= start_ns < hi), None)
    if inside is not None:
        return inside
    before = [hi for _, _, hi in windows if hi <= start_ns]
    after = [(lo, w) for w, lo, _ in windows if lo > start_ns]
    return min(after)[1] if before and after else None


def _weight_sync(
    spans: list[SpanLike], windows: Sequence[tuple[int | None, int, int]]
) -> dict[str, Any] | None:
    if not spans:
        return None
    trainer = [s for s in spans if s.args.get("replica") is None]
    replica = [s for s in spans if s.args.get("replica") is not None]
    syncs = []
    for top in sorted((s for s in trainer if is_sync_root(s.name)), key=lambda s: s.start_ns):
        lo, hi = top.start_ns, top.start_ns + top.dur_ns
        phases: dict[str, int] = defaultdict(int)
        for s in trainer:
            if s is not top and s.pid == top.pid and lo <= s.start_ns and s.start_ns + s.dur_ns <= hi:
                phases[s.name] += s.dur_ns
        per: dict[Any, list[SpanLike]] = defaultdict(list)
        for s in replica:
            if s.start_ns < hi and s.start_ns + s.dur_ns > lo and s.name != "weight_version":
                per[s.args["replica"]].append(s)
        rows = []
        for rep, group in sorted(per.items(), key=lambda kv: str(kv[0])):
            rphases: dict[str, int] = defaultdict(int)
            for s in group:
                rphases[s.name] += s.dur_ns
            rows.append(
                {
                    "replica": rep,
                    "dur_ns": iv.covered([(s.start_ns, s.start_ns + s.dur_ns) for s in group], lo, hi),
                    "phases_ns": dict(rphases),
                    "bytes": sum(_int(s.args.get("bytes")) or 0 for s in group if is_weight_load(s.name))
                    or None,
                    "processes": len({s.pid for s in group}),
                }
            )
        slowest = max(rows, key=lambda r: r["dur_ns"], default=None)
        syncs.append(
            {
                "step": sync_step(windows, lo),
                "version": top.args.get("version"),
                "backend": top.args.get("backend"),
                "start_ns": lo,
                "dur_ns": top.dur_ns,
                "trainer_phases_ns": dict(phases),
                "replicas": rows,
                "slowest_replica": slowest["replica"] if slowest else None,
            }
        )
    totals: dict[str, dict[str, int]] = {"trainer": defaultdict(int), "replica": defaultdict(int)}
    for s in trainer:
        totals["trainer"][s.name] += s.dur_ns
    for s in replica:
        totals["replica"][s.name] += s.dur_ns
    return {"syncs": syncs, "phase_totals_ns": {k: dict(v) for k, v in totals.items()}}


# ----------------------------------------------------------------------------------- staleness
def _staleness(spans: list[SpanLike]) -> list[dict[str, Any]]:
    rows = []
    for s in sorted(spans, key=lambda s: s.start_ns):
        if s.name != CONSUME_SPAN:
            continue
        a = s.args
        lags = {str(k): int(v) for k, v in (a.get("lag_steps") or {}).items() if _int(v) is not None}
        rows.append(
            {
                "step": _int(a.get("step")),
                "trainer_version": _int(a.get("trainer_version")),
                "samples": _int(a.get("samples")),
                "lag_steps": lags,
                "max_lag_steps": a.get("max_lag_steps"),
                "mean_lag_steps": a.get("mean_lag_steps"),
                "unknown_version": _int(a.get("unknown_version")),
                "start_ns": s.start_ns,
                "wait_ns": s.dur_ns,
            }
        )
    return rows


# ------------------------------------------------------------------------------------- section
def rollout_section(
    spans: Iterable[SpanLike],
    windows: Sequence[tuple[int | None, int, int]],
    training: Training = (),
    *,
    slowest: int = SLOWEST_SHOWN,
) -> dict[str, Any] | None:
    """The ``rollout`` section, or None when the trace has no rollout spans of ours.

    ``windows``: (step, start_ns, end_ns); ``training``: (category, start_ns, end_ns) of the
    training roles' stage spans, or their intervals by category (the report's stage index keeps
    them so: a tuple per span was ~115 MB at 1M spans), for what the trainer did during each tail.
    """
    mine = [s for s in spans if s.cat.startswith(CATEGORY_PREFIX)]
    if not mine:
        return None
    reqs = _requests(mine)
    _assign_steps(reqs.values(), windows)
    validation = [r for r in reqs.values() if r.client is not None and r.client.args.get("validate") is True]
    train = [r for r in reqs.values() if not (r.client is not None and r.client.args.get("validate") is True)]
    turns: dict[tuple[Any, ...], int] = defaultdict(int)
    for r in train:
        key = _sample_key(r)
        turn = _int(r.arg("turn"))
        if key is not None and turn is not None:
            turns[key] = max(turns[key], turn)
    slow = sorted(train, key=lambda r: (-r.span.dur_ns, r.request_id))[:slowest]
    return {
        "requests": len(train),
        "validation_requests": len(validation),
        "client_spans": sum(r.client is not None for r in reqs.values()),
        "server_spans": sum(r.server is not None for r in reqs.values()),
        "linked": sum(r.client is not None and r.server is not None for r in reqs.values()),
        "rejected": sum(1 for r in train if r.arg("status") == REJECTED),
        "failed": sum(str(r.arg("status") or "").startswith("error") for r in reqs.values()),
        "tail_quantile": TAIL_QUANTILE,
        "steps": _step_rows(train, training, turns),
        "slowest": [_row(r, turns) for r in slow],
        "weight_sync": _weight_sync([s for s in mine if s.cat == SYNC_CAT], windows),
        "staleness": _staleness([s for s in mine if s.cat == STALENESS_CAT]),
    }
