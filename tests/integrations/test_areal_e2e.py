"""AReaL's OWN tracer in several processes on CPU, merged by the real CLI, with the anchor and without.

Three processes run ``areal/utils/perf_tracer.py`` from the areal 1.0.4 wheel (how, and what of AReaL
is stood in for: :mod:`rl_trace_observer.testing.areal`): two rollout ranks, whose session tracer is
on and whose rollout batches run real sessions (generate, reward, finalize; one task in five
rejected), and an actor rank. Each starts after a different delay, so their perf_counter origins are
hundreds of ms apart: concatenated as AReaL's own converter does, they would be that far off. Each
writes the truth (its origin on the wall clock, measured in the process).

- ``RL_TRACE_AREAL=1`` (the integration on): every rank lands within a few µs of its truth.
- off: the rollout ranks are placed on their session files, each within the bound the manifest
  states; the actor rank, with neither an anchor nor sessions, is not merged and the manifest says so.

Both merges go through ``rl-trace merge`` and ``rl-trace report``; the anchored one is loaded in the
Perfetto engine.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rl_trace_observer.testing.areal import WHEEL_MISSING as AREAL_WHEEL_MISSING
from rl_trace_observer.testing.areal import find_wheel, unpack_tracer

WHEEL = find_wheel()
pytestmark = pytest.mark.skipif(WHEEL is None, reason=AREAL_WHEEL_MISSING)
RANKS = (("rollout", 0, 0.0), ("rollout", 1, 0.7), ("actor", 0, 0.35))  # role, rank, start delay (s)
STEPS, TASKS = 3, 6
REJECTED_PER_BATCH = 1  # task 4 of 6 (testing/areal.py: every fifth)
MARK = "areal_test.mark"
CLI = str(Path(sys.executable).parent / "rl-trace")


@dataclass
class Run:
    out: Path
    merged: Path
    manifest: dict[str, Any]
    truths: list[dict[str, Any]]
    events: list[dict[str, Any]]
    report: dict[str, Any]

    def errors_ns(self) -> dict[tuple[str, int], list[int]]:
        """(role, rank) → placed − true time of each step's mark (ns)."""
        base = self.manifest["timeline"]["base_ns"]
        out: dict[tuple[str, int], list[int]] = {}
        for truth in self.truths:
            raw = [json.loads(line) for line in Path(truth["perf_path"]).read_text().splitlines()]
            true = {
                e["args"]["global_step"]: truth["origin_wall_ns"] + e["ts"] * 1000
                for e in raw
                if e["name"] == MARK
            }
            placed = {
                e["args"]["global_step"]: base + round(e["ts"] * 1000)
                for e in self.events
                if e.get("name") == MARK
                and e["args"]["rank"] == truth["rank"]
                and e["args"]["role"] == truth["role"]
            }
            if placed:
                assert placed.keys() == true.keys()
                out[(truth["role"], truth["rank"])] = [placed[s] - true[s] for s in sorted(true)]
        return out


def _run(root: Path, tracer: Path, anchored: bool) -> Run:
    out = root / ("anchored" if anchored else "plain")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RL_TRACE_")}
    env["RL_TRACE_METRICS"] = "0"
    inputs = out / "capture" if anchored else out / "areal"
    fileroot = inputs / "areal" if anchored else inputs
    if anchored:
        env.update(RL_TRACE_OUTPUT_DIR=str(inputs), RL_TRACE_AREAL="1")
    procs = []
    for role, rank, delay in RANKS:
        args = [
            "--tracer-root",
            str(tracer),
            "--fileroot",
            str(fileroot),
            "--role",
            role,
            "--rank",
            str(rank),
        ]
        args += ["--delay", str(delay), "--steps", str(STEPS), "--tasks", str(TASKS)]
        args += ["--truth", str(out / f"truth-{role}-{rank}.json")]
        args += ["--barrier", str(out / "barrier"), "--world", str(len(RANKS))]
        runner = ["-m", "rl_trace_observer.integrations.areal"] if anchored else []  # entry point unchanged
        command = [sys.executable, *runner, "-m", "rl_trace_observer.testing.areal", *args]
        procs.append(subprocess.Popen(command, env=env))
    assert [p.wait(timeout=300) for p in procs] == [0] * len(procs)
    truths = [json.loads((out / f"truth-{role}-{rank}.json").read_text()) for role, rank, _ in RANKS]
    merged = out / "merged.json.gz"
    shards = ["--shards", str(out / "shards")]
    merge = subprocess.run(
        [CLI, "merge", str(inputs), "-o", str(merged), *shards], capture_output=True, text=True
    )
    assert merge.returncode == 0, merge.stderr
    report = subprocess.run(
        [CLI, "report", str(merged), "--json", str(out / "report.json"), "-q"], capture_output=True, text=True
    )
    assert report.returncode == 0, report.stderr
    manifest = json.loads(Path(f"{merged}.manifest.json").read_text())
    with gzip.open(merged) as f:
        events = json.load(f)["traceEvents"]
    return Run(out, merged, manifest, truths, events, json.loads((out / "report.json").read_text()))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    root = tmp_path_factory.mktemp("areal")
    assert WHEEL is not None
    tracer = unpack_tracer(WHEEL, root / "tracer")
    return {"anchored": _run(root, tracer, True), "plain": _run(root, tracer, False)}


def _origins_apart(run: Run) -> int:
    origins = [t["origin_wall_ns"] for t in run.truths]
    return max(origins) - min(origins)


def test_ranks_start_far_apart_so_unaligned_traces_would_be_far_off(runs: dict[str, Run]) -> None:
    for run in runs.values():
        assert _origins_apart(run) > 300_000_000  # AReaL's own concatenation would be this far off


def test_with_the_anchor_every_rank_is_placed_within_microseconds(runs: dict[str, Run]) -> None:
    run = runs["anchored"]
    errors = run.errors_ns()
    assert set(errors) == {(role, rank) for role, rank, _ in RANKS}
    worst = max(abs(e) for errs in errors.values() for e in errs)
    spread = max(max(errs) for errs in errors.values()) - min(min(errs) for errs in errors.values())
    print(f"anchored: worst |placed - true| {worst} ns, across ranks {spread} ns")
    assert worst <= 20_000 and spread <= 20_000, errors
    perf = [a for a in run.manifest["artifacts"] if a["kind"] == "areal_perf"]
    assert len(perf) == 3 and all(a["anchor"]["source"].startswith("process record") for a in perf)
    # the sessions, measured as a check: the anchor puts them inside their rollout batches
    checks = [c for c in run.manifest["timeline"]["clock"]["artifacts"] if c.get("pairing")]
    assert len(checks) == 2 and all(c["anchor_outside_ns"] == 0 for c in checks), checks


def test_without_it_rollout_ranks_sit_on_their_sessions_within_the_stated_bound(runs: dict[str, Run]) -> None:
    run = runs["plain"]
    errors = run.errors_ns()
    assert set(errors) == {("rollout", 0), ("rollout", 1)}
    bounds = {
        (a["role"], a["rank"]): a["areal_clock"]["bound_ns"]
        for a in run.manifest["artifacts"]
        if a["kind"] == "areal_perf" and a.get("areal_clock")
    }
    for key, errs in errors.items():
        assert all(abs(e) <= bounds[key] for e in errs), (key, errs, bounds[key])
    spread = abs(errors[("rollout", 0)][0] - errors[("rollout", 1)][0])
    print(f"sessions only: errors {errors}, bounds {bounds}, across rollout ranks {spread} ns")
    assert spread <= bounds[("rollout", 0)] + bounds[("rollout", 1)]
    assert max(bounds.values()) < 50_000_000  # ms, not the origins' hundreds of ms
    (actor,) = [a for a in run.manifest["artifacts"] if a["kind"] == "areal_perf" and a["role"] == "actor"]
    assert not actor["selected"] or actor["events"]["kept"] == 0
    unanchored = [p for p in run.manifest["problems"] if p["kind"] == "unanchored"]
    assert len(unanchored) == 1 and "role actor rank 0" in unanchored[0]["detail"]


@pytest.mark.parametrize("name", ["anchored", "plain"])
def test_sessions_are_requests_under_their_rank_and_role_in_the_report(
    runs: dict[str, Run], name: str
) -> None:
    run = runs[name]
    rollout = run.report["rollout"]
    rollout_ranks = sum(1 for role, _, _ in RANKS if role == "rollout")
    assert rollout["requests"] == rollout_ranks * STEPS * TASKS
    assert rollout["rejected"] == rollout_ranks * STEPS * REJECTED_PER_BATCH
    assert [s["step"] for s in run.report["steps"]] == list(range(STEPS))  # AReaL's global_step
    # stages from AReaL's own span names, under the roles its folders name
    roles = {r["role"] for st in run.report["steps"] for r in st["roles"]}
    assert roles == ({"rollout", "actor"} if name == "anchored" else {"rollout"})
    busy = {r["role"]: r["total_ns"] for r in run.report["steps"][0]["roles"]}
    assert busy["rollout"]["generation"] > 0
    if name == "anchored":
        assert busy["actor"]["update"] > 0
    assert sorted(s["step"] for s in rollout["steps"]) == list(range(STEPS))
    for st in rollout["steps"]:
        assert st["requests"] == rollout_ranks * TASKS and st["latency_ns"]["p50"] > 0
        assert st["tail"]["requests"] >= 1
    # a rank's sessions are in its own process, beside its perf spans
    pid_of = {}
    for e in run.events:
        if e.get("name") == "workflow_executor.rollout_batch" and e.get("ph") == "X":
            pid_of[e["args"]["rank"]] = e["pid"]
    for e in run.events:
        if e.get("name") == "rollout_request":
            rank = int(e["args"]["request_id"].split("/")[2][1:])
            assert e["pid"] == pid_of[rank]
    areal = [a for a in run.manifest["artifacts"] if a["kind"].startswith("areal_")]
    assert areal and all(a["stack"] == "areal" for a in areal)
    assert {a["role"] for a in areal} == {"rollout", "actor"}


@pytest.mark.perfetto
def test_the_aligned_run_loads_in_perfetto(runs: dict[str, Run]) -> None:
    from rl_trace_observer.testing.perfetto.engine import shared_engine, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    res = shared_engine().load(
        runs["anchored"].merged, queries=["select count(*) as n from slice where name = 'rollout_request'"]
    )
    assert res.ok and res.error_stats == (), res.summary()
    assert res.queries[0].check().dicts()[0]["n"] == 2 * STEPS * TASKS


def test_sql_numbers_the_sessions_by_areal_step_when_anchored(runs: dict[str, Run]) -> None:
    """With the anchor the planner knows AReaL's steps before reading (``--step``, span tables);
    without it they exist only once the files are read: the report has them, the span table not."""
    query = "SELECT step, count(*) AS n FROM spans WHERE name = 'rollout_request' GROUP BY 1 ORDER BY 1"
    rows = {}
    for name, run in runs.items():
        res = subprocess.run(
            [CLI, "sql", str(run.out / "shards"), query, "--json"], capture_output=True, text=True
        )
        assert res.returncode == 0, res.stderr
        rows[name] = [(r["step"], r["n"]) for r in json.loads(res.stdout)]
    assert rows["anchored"] == [(s, 2 * TASKS) for s in range(STEPS)]
    assert rows["plain"] == [(None, 2 * STEPS * TASKS)]


def test_the_live_watch_answers_areal_steps_once_anchored(runs: dict[str, Run]) -> None:
    run = runs["anchored"]
    out = run.out / "watch"
    res = subprocess.run(
        [CLI, "watch", str(run.out / "capture"), "--once", "--out", str(out)], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    assert "answered steps: 0, 1, 2" in res.stdout, res.stdout
    step = json.loads((out / "steps" / "step-1.json").read_text())
    assert step["events"] > 0
