"""The rollout section as plain tables (title, headers, rows of text), so the terminal and the HTML
report show the same cells: each renderer only draws (and the HTML one escapes) them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .stages import SYNC_ROOT_NAME
from .style import LABELS, fmt_ns, span_step_label, step_label

MAX_STEPS = 50
MAX_REPLICA_ROWS = 64
MAX_SYNCS = 12


@dataclass
class PlainTable:
    """Column 0 is the key (what a row is about): a narrow terminal never cuts it."""

    title: str
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)
    left: tuple[int, ...] = ()  # text columns (left-aligned)
    note: str = ""
    short: dict[int, str] = field(default_factory=dict)  # headers on a narrow terminal
    drop: tuple[int, ...] = ()  # columns a narrow terminal leaves out first, in this order
    styles: list[str] = field(default_factory=list)  # per row, for the terminal (e.g. "red")


def _v(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def _lat(stats: dict[str, int] | None, key: str) -> str:
    return fmt_ns(stats[key]) if stats else "—"


def _trainer(tail: dict[str, Any]) -> str:
    parts = sorted(((v, k) for k, v in tail.get("trainer_ns", {}).items() if v > 0), reverse=True)
    total = tail.get("dur_ns") or 0
    if not parts or not total:
        return "—"
    return ", ".join(f"{LABELS.get(k, k)} {100 * v / total:.0f}%" for v, k in parts[:3])


def _phases(phases: dict[str, int]) -> str:
    return ", ".join(f"{k} {fmt_ns(v)}" for k, v in sorted(phases.items(), key=lambda kv: -kv[1])) or "—"


IMBALANCE_NOTE = (
    "imbalance: max / mean over the step's replicas of requests, response tokens and busy time "
    "(1 = even; busy = the union of a replica's server spans)"
)
WEIGHT_SYNC_NOTE = (
    f"total: the trainer's {SYNC_ROOT_NAME} call, start to end, in the process that ran it (it waits for "
    "every replica); a replica's time: the union of its own weight-sync phases inside that call; "
    "step: the step window the call started in (the step tables count each lane's own weight-sync "
    "stage spans instead)"
)


def _imbalance(imb: dict[str, Any]) -> str:
    text = f"{_v(imb.get('requests'))}× req, {_v(imb.get('response_tokens'))}× tok"
    return text + (f", {_v(imb['busy_ns'])}× busy" if imb.get("busy_ns") is not None else "")


def tables(rollout: dict[str, Any] | None, *, slowest: int = 10) -> list[PlainTable]:
    """Every rollout table worth showing; empty when the trace has no rollout spans."""
    if not rollout:
        return []
    out = []
    steps = PlainTable(
        "Rollout requests per step (latency = agent loop's wait; tail = after 90% had finished)",
        [
            "step",
            "requests",
            "p50",
            "p95",
            "p99",
            "max",
            "tail",
            "tail reqs",
            "trainer during tail",
            "imbalance",
        ],
        left=(8, 9),
        short={1: "reqs", 7: "tail reqs", 8: "trainer in tail"},
        drop=(3, 7, 8),
        note=f"{rollout['requests']} requests, {rollout['linked']} seen by client and server"
        + (f", {rollout['rejected']} rejected" if rollout.get("rejected") else "")
        + (f", {rollout['failed']} failed" if rollout.get("failed") else "")
        + (
            f", {rollout['validation_requests']} validation requests not counted"
            if rollout["validation_requests"]
            else ""
        )
        + f"; {IMBALANCE_NOTE}",
    )
    for st in rollout["steps"][:MAX_STEPS]:
        lat, tail, imb = st["latency_ns"], st["tail"], st["imbalance"]
        steps.rows.append(
            [
                step_label(st["step"]),
                str(st["requests"]),
                _lat(lat, "p50"),
                _lat(lat, "p95"),
                _lat(lat, "p99"),
                _lat(lat, "max"),
                fmt_ns(tail["dur_ns"]),
                str(tail["requests"]),
                _trainer(tail),
                _imbalance(imb),
            ]
        )
    out.append(steps)
    reps = PlainTable(
        "Replicas per step", ["step", "replica", "requests", "tokens out", "busy", "tokens/s"], left=(1,)
    )
    for st in rollout["steps"][:MAX_STEPS]:
        for r in st["replicas"]:
            if len(reps.rows) < MAX_REPLICA_ROWS:
                reps.rows.append(
                    [
                        step_label(st["step"]),
                        _v(r["replica"]),
                        str(r["requests"]),
                        str(r["response_tokens"]),
                        fmt_ns(r["busy_ns"]),
                        "—" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:,.0f}",
                    ]
                )
    out.append(reps)
    slow = PlainTable(
        "Slowest requests",
        [
            "request id",
            "step",
            "replica",
            "latency",
            "server",
            "queue",
            "prefill",
            "decode",
            "turn",
            "status",
        ],
        left=(0, 9),
        short={0: "request", 2: "repl."},
        drop=(4, 8, 9),
    )
    for r in rollout["slowest"][:slowest]:
        turn = "—" if r["turn"] is None else f"{r['turn']}/{_v(r['turns'])}"
        if r.get("attempt"):
            turn += f" (retry {r['attempt']})"
        slow.rows.append(
            [
                str(r["request_id"]),
                step_label(r["step"]),
                _v(r["replica"]),
                fmt_ns(r["latency_ns"]),
                fmt_ns(r["server_ns"]),
                fmt_ns(r["queue_ns"]),
                fmt_ns(r["prefill_ns"]),
                fmt_ns(r["decode_ns"]),
                turn,
                _v(r["status"]),
            ]
        )
    out.append(slow)
    ws = rollout.get("weight_sync")
    if ws and ws["syncs"]:
        sync = PlainTable(
            "Weight sync per version (the slowest replica held it up)",
            [
                "version",
                "step",
                "total",
                "trainer phases",
                "slowest replica",
                "its time",
                "its phases",
                "bytes (all)",
            ],
            left=(3, 6),
            note=WEIGHT_SYNC_NOTE,
            short={4: "slowest"},
            drop=(6, 3, 7),
        )
        for s in ws["syncs"][:MAX_SYNCS]:
            worst = next((r for r in s["replicas"] if r["replica"] == s["slowest_replica"]), None)
            sync.rows.append(
                [
                    _v(s["version"]),
                    span_step_label(s["step"]),  # the window it started in, or the next (rollout.sync_step)
                    fmt_ns(s["dur_ns"]),
                    _phases(s["trainer_phases_ns"]),
                    _v(s["slowest_replica"]),
                    fmt_ns(worst["dur_ns"]) if worst else "—",
                    _phases(worst["phases_ns"]) if worst else "—",
                    _v(sum(r["bytes"] or 0 for r in s["replicas"]) or None),
                ]
            )
        out.append(sync)
    if rollout.get("staleness"):
        stale = PlainTable(
            "Staleness when the trainer took each batch (lag in policy versions)",
            ["step", "samples", "lag: samples", "max lag", "mean lag", "trainer waited"],
            left=(2,),
        )
        for row in rollout["staleness"][:MAX_STEPS]:
            stale.rows.append(
                [
                    step_label(row["step"]),
                    _v(row["samples"]),
                    ", ".join(f"{k}: {v}" for k, v in row["lag_steps"].items()) or "—",
                    _v(row["max_lag_steps"]),
                    _v(row["mean_lag_steps"]),
                    fmt_ns(row["wait_ns"]),
                ]
            )
        out.append(stale)
    return out
