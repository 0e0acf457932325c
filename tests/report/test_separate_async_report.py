"""The report on a ``separate_async`` trace, built by hand with the shapes the real run writes
(tests/integrations/test_verl_separate_async_e2e.py runs VERL for real):

- RL-Insight draws only the training rank's stages; the replica's ``engine_request`` spans become
  its generation lane (their union), so the rank's idle gets ``waiting_for_rollout`` and the replica
  an idle row of its own;
- VERL's RL-Insight logger writes the step's metrics AFTER the step window, without a step number
  and with ``/`` turned into ``_`` (``timing_s_gen``): they belong to that step and are checked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rl_trace_observer.analysis.answers.verl_metrics import canonical
from rl_trace_observer.analysis.report.output import summarize

MS = 1_000.0  # µs
TRAINER, RANK, SERVER = 10, 20, 30
PROCESSES = {
    TRAINER: "vm · pid 1 · trainer",
    RANK: "vm · pid 2 · actor_rollout rank 0",
    SERVER: "vm · pid 3 · rollout (mock_server_1)",
}


def _x(pid: int, name: str, cat: str, start_ms: float, dur_ms: float, **args: Any) -> dict[str, Any]:
    span = {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": 1, "args": args}
    return {**span, "ts": start_ms * MS, "dur": dur_ms * MS}


def _gauge(name: str, at_ms: float, value: float) -> dict[str, Any]:
    return {"ph": "C", "name": name, "cat": "rl_insight.gauge", "pid": TRAINER, "tid": 0, "ts": at_ms * MS,
            "args": {"value": value}}  # fmt: skip


def events() -> list[dict[str, Any]]:
    ev: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}
        for pid, name in PROCESSES.items()
    ]
    for step, lo in ((1, 0), (2, 1100)):  # two 1 s steps; VERL logs each one's metrics 50 ms after it
        ev.append(_x(TRAINER, "global_step", "verl", lo, 1000, step=step, state_lane_id="global_step"))
        ev.append(_x(RANK, "actor_update", "rl_insight", lo + 600, 300, state_lane_id="rank_0"))
        ev.append(_gauge("timing_s_gen", lo + 1050, 0.6))
        ev.append(_gauge("timing_s_step", lo + 1050, 1.0))
    # the replica: two overlapping requests [0, 400) ∪ [300, 600) in step 1; one [1100, 1300) in step 2
    for i, (start, dur) in enumerate(((0, 400), (300, 300), (1100, 200))):
        ev.append(_x(SERVER, "engine_request", "rl_trace.request", start, dur, request_id=f"r{i}", replica=1))
    return ev


def _summary(tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "trace.json"
    top = {"rl_trace_observer": {"schema": "rl-trace-merge/1", "base_ns": 0, "clock": "wall"}}
    path.write_text(json.dumps({**top, "traceEvents": events()}))
    return summarize(path)


def test_replica_requests_make_its_generation_lane(tmp_path: Path) -> None:
    s = _summary(tmp_path)
    step1 = {(r["role"], r["lane"]): r for r in s["steps"][0]["ranks"]}
    assert step1[("rollout", "replica_1")]["time_ns"]["generation"] == 600_000_000  # the union, not 700
    assert step1[("actor_rollout", "rank_0")]["time_ns"]["update"] == 300_000_000
    idle = {lane["lane"]: lane["causes_ns"] for lane in s["idle"]["steps"][0]["lanes"]}
    assert idle["rank_0"]["waiting_for_rollout"] == 600_000_000  # the rank waits while the replica works
    assert idle["replica_1"]["waiting_for_trainer"] == 300_000_000
    roles = {r["role"]: r for r in s["goodput"]["steps"][1]["roles"]}
    assert roles["rollout"]["idle_ns"] == 800_000_000


def test_verl_s_logged_metrics_belong_to_the_step_they_follow(tmp_path: Path) -> None:
    s = _summary(tmp_path)
    metrics = {m["name"]: [p["step"] for p in m["steps"]] for m in s["metrics"]}
    assert metrics["timing_s_gen"] == [1, 2] and metrics["timing_s_step"] == [1, 2]
    rows = {(r["metric"], r["step"]): r for r in s["metric_check"]["rows"]}
    assert rows[("timing_s_step", 1)]["ours"] == 1_000_000_000 and not rows[("timing_s_step", 1)]["disagree"]
    assert rows[("timing_s_gen", 1)]["ours"] == 600_000_000  # the replica's generation union
    assert rows[("timing_s_gen", 2)]["ours"] == 200_000_000 and rows[("timing_s_gen", 2)]["disagree"]


def test_verl_metric_spellings() -> None:
    assert canonical("timing_s_update_actor") == "timing_s/update_actor"
    assert canonical("timing_s/gen") == "timing_s/gen"
    assert canonical("fully_async/trainer/idle_ratio") == "trainer/idle_ratio"
    assert canonical("fully_async_rollouter_idle_ratio") == "rollouter/idle_ratio"
    assert canonical("actor_pg_loss") is None
