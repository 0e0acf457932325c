"""``rl-trace diff`` (noise band, ranking, --fail-if exit codes) on hand-built report summaries, the SQL
``stage()`` macro against the stage table, and — on the shared demo run — ``rl-trace sql`` re-deriving
the report's figures with the documented queries (docs/report.md), and the report showing every answer."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from rl_trace_observer.analysis.query import diff as d
from rl_trace_observer.analysis.report.stages import classify

from ..conftest import need

ROOT = Path(__file__).resolve().parents[2]


def summary(update_ms: list[float], gen_ms: list[float], path: str = "x") -> dict[str, Any]:
    steps = []
    for i, (u, g) in enumerate(zip(update_ms, gen_ms, strict=True)):
        steps.append(
            {
                "step": i + 1,
                "dur_ns": int((u + g) * 1e6),
                "roles": [
                    {"role": "trainer", "mean_ns": {"update": u * 1e6, "idle": g * 1e6}},
                    {"role": "rollout", "mean_ns": {"generation": g * 1e6, "idle": u * 1e6}},
                ],
            }
        )
    return {"schema": "rl-trace-report/3", "source": {"path": path}, "steps": steps}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rl_trace_observer.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


# ------------------------------------------------------------------------------------------- diff
def test_diff_delta_noise_and_ranking() -> None:
    a = summary([100, 102, 98, 100], [200, 200, 200, 200], "a")
    b = summary([120, 122, 118, 120], [201, 199, 200, 200], "b")
    rows = {r["key"]: r for r in d.compare(a, b)["rows"]}
    up = rows["trainer/update"]
    assert (up["a_ns"], up["b_ns"], up["delta_ns"], up["delta_pct"]) == (
        100_000_000,
        120_000_000,
        20_000_000,
        20.0,
    )
    # s = 1.633 ms in both: 2·√(2·s²/4) = 2.309 ms
    assert up["noise_ns"] == 2_309_401 and not up["within_noise"]
    assert rows["rollout/generation"]["within_noise"] and rows["rollout/generation"]["delta_ns"] == 0
    ranked = [r["within_noise"] for r in d.compare(a, b)["rows"]]
    assert ranked == sorted(ranked)  # changes outside their noise band come first


def test_fail_if_thresholds() -> None:
    a, b = summary([100, 100], [200, 200]), summary([115, 115], [150, 150])
    result = d.compare(a, b)
    assert d.check(result, [d.Threshold.parse("update>+10%")]) == [
        "trainer/update +15.0 %: 100.0 ms → 115.0 ms per step (noise ±0.0 ms) (threshold update>+10%)"
    ]
    assert d.check(result, [d.Threshold.parse("update>+20%")]) == []
    assert d.check(result, [d.Threshold.parse("step>+0ms")]) == []  # step: 300 → 265 ms, -35 ms
    assert d.check(result, [d.Threshold.parse("step<-40ms")]) == []
    assert len(d.check(result, [d.Threshold.parse("step<-30ms")])) == 1
    assert len(d.check(result, [d.Threshold.parse("rollout/generation<-20%")])) == 1
    with pytest.raises(d.ThresholdError, match="expected KEY>VALUE"):
        d.Threshold.parse("update 10")
    with pytest.raises(d.ThresholdError, match="no series 'nope'"):
        d.check(result, [d.Threshold.parse("nope>1%")])


def test_diff_cli_exit_codes_and_outputs(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(summary([100, 101, 99], [200, 200, 200], "a")))
    b.write_text(json.dumps(summary([130, 131, 129], [200, 200, 200], "b")))
    ok = cli("diff", str(a), str(a), "--fail-if", "update>+10%", "-q")
    assert ok.returncode == 0 and "ok: 1 threshold(s) passed" in ok.stderr
    bad = cli("diff", str(a), str(b), "--fail-if", "update>+10%", "--json", str(tmp_path / "d.json"),
              "--html", str(tmp_path / "d.html"))  # fmt: skip
    assert bad.returncode == 1
    (line,) = [x for x in bad.stderr.splitlines() if x.startswith("FAIL")]
    assert line.startswith("FAIL: trainer/update +30.0 %: 100.0 ms → 130.0 ms per step")
    assert "trainer/update" in bad.stdout  # the terminal table
    doc = json.loads((tmp_path / "d.json").read_text())
    assert doc["schema"] == "rl-trace-diff/1" and doc["rows"][0]["key"] in ("trainer/update", "rollout/idle")
    assert "Content-Security-Policy" in (tmp_path / "d.html").read_text()
    usage = cli("diff", str(a), str(b), "--fail-if", "update=10")
    assert usage.returncode == 2 and "expected KEY>VALUE" in usage.stderr
    missing = cli("diff", str(a), str(tmp_path / "nope.json.gz"))
    assert missing.returncode == 2 and "nope.json.gz" in missing.stderr  # a usage error everywhere


# -------------------------------------------------------------------------------------------- sql
@settings(max_examples=200, deadline=None)
@given(
    hs.lists(
        hs.one_of(
            hs.sampled_from(
                ["global_step", "train_batch", "vllm_generate", "actor_update", "update_weights",
                 "wake_up", "ref_compute_log_prob", "sleep", "x_sleep_y", "sleepy", "ROLLOUT", "sampler",
                 "optimizer.step"]
            ),
            hs.text(alphabet="abcdeglmoprstuwy_-. ", max_size=20),
        ),
        min_size=1,
        max_size=20,
    )
)  # fmt: skip
def test_sql_stage_macro_is_the_stage_table(names: list[str]) -> None:
    duckdb = need("duckdb")
    from rl_trace_observer.analysis.query.sql import stage_macro

    con = duckdb.connect()
    con.execute(stage_macro())
    got = [r[0] for r in con.execute("SELECT stage(n) FROM unnest(?) AS t(n)", [names]).fetchall()]
    assert got == [classify(n) for n in names]


def test_sql_errors_are_one_line(tmp_path: Path) -> None:
    not_trace = tmp_path / "x.txt"
    not_trace.write_text("hi")
    proc = cli("sql", str(not_trace), "SELECT 1")
    assert proc.returncode == 1 and proc.stderr.strip().count("\n") == 0 and "x.txt" in proc.stderr
    proc = cli("sql", str(tmp_path / "missing"), "SELECT 1")
    assert proc.returncode == 2 and "missing" in proc.stderr  # a usage error everywhere


# ------------------------------------------------------------------------------- the demo run
def _sql(target: Path, query: str) -> list[dict[str, Any]]:
    proc = cli("sql", str(target), query, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_sql_rederives_the_report(demo: dict[str, Any]) -> None:
    """The three documented queries give the report's own numbers, on the shards and on the .json.gz
    (converted), and docs/report.md shows them verbatim."""
    from rl_trace_observer.analysis.query.sql import EXAMPLES

    out: Path = demo["out"]
    report = json.loads((out / "report.json").read_text())
    docs = (ROOT / "docs" / "report.md").read_text()
    for query in EXAMPLES.values():
        assert query in docs
    for target in (out / "shards", out / "trace.json.gz"):
        stage_time = {
            (r["step"], r["role"], r["stage"]): r["mean_ns"] for r in _sql(target, EXAMPLES["stage_time"])
        }
        want = {
            (st["step"], role["role"], cat): ns
            for st in report["steps"]
            for role in st["roles"]
            for cat, ns in role["mean_ns"].items()
            if cat != "idle" and ns
        }
        assert stage_time == pytest.approx(want)
        steps = _sql(target, EXAMPLES["steps"])
        assert sorted((r["step"], round(r["wall_ms"] * 1e6)) for r in steps) == [
            (st["step"], st["dur_ns"]) for st in report["steps"]
        ]
        arrivals = {
            (r["step"], r["role"], r["name"]): (r["last_lane"], r["lag_ns"])
            for r in _sql(target, EXAMPLES["arrivals"])
        }
        want_arrivals = {
            (e["step"], e["role"], e["point"].removeprefix("stage ")): (e["last_lane"], e["lag_ns"])
            for e in report["arrivals"]["events"]
            if e["role"] != "*"
        }
        assert arrivals == want_arrivals
    csv = cli("sql", str(out / "trace.pftrace"), "SELECT count(*) AS n FROM spans WHERE ph = 'X'", "--csv")
    assert (
        csv.returncode == 0 and csv.stdout.splitlines()[0] == "n" and int(csv.stdout.splitlines()[1]) > 1000
    )


@pytest.mark.slow
def test_demo_report_answers(demo: dict[str, Any]) -> None:
    out: Path = demo["out"]
    report = json.loads((out / "report.json").read_text())
    assert report["schema"] == "rl-trace-report/4"
    walls = {st["step"]: st["dur_ns"] for st in report["steps"]}
    for st in report["goodput"]["steps"]:
        for role in st["roles"]:
            assert role["productive_ns"] + role["overhead_ns"] + role["idle_ns"] == walls[st["step"]]
    roles = {r["role"]: r for r in report["idle"]["roles"]}
    # the default demo is synchronous: trainers wait for generation, replicas for the trainer
    assert roles["trainer"]["causes_ns"]["waiting_for_rollout"] > 0
    assert roles["rollout"]["causes_ns"]["waiting_for_trainer"] > 0
    points = {(r["role"], r["point"]) for r in report["arrivals"]["summary"]}
    assert {
        ("trainer", "stage actor_update"),
        ("rollout", "stage vllm_generate"),
        ("*", "step end"),
    } <= points
    for path in report["critical_path"]:
        assert sum(s["dur_ns"] for s in path["segments"]) == path["dur_ns"] == walls[path["step"]]
        assert {"generation", "update"} <= set(path["by_stage_ns"])
    html = (out / "report.html").read_text()
    assert (
        "Critical path per step" in html and "Idle time by cause" in html and "Stragglers by arrival" in html
    )
    assert "Goodput per role" in demo["stdout"]
    assert "rl-trace sql " in demo["stdout"] and "rl-trace diff " in demo["stdout"]
    assert "--critical-path" in demo["stdout"]
    # the demo's driver logs VERL-style timers: each step's is put beside the timeline's figure
    checked = {(r["metric"], r["step"]) for r in report["metric_check"]["rows"]}
    assert {("timing_s/step", s) for s in walls} <= checked
    assert {("timing_s/gen", s) for s in walls} <= checked
    step_rows = [r for r in report["metric_check"]["rows"] if r["metric"] == "timing_s/step"]
    assert all(r["ours"] == walls[r["step"]] and r["verl"] <= r["ours"] for r in step_rows)


@pytest.mark.slow
def test_diff_gate_on_the_demo(demo: dict[str, Any], tmp_path: Path) -> None:
    out: Path = demo["out"]
    same = cli("diff", str(out / "report.json"), str(out / "shards"), "--fail-if", "update>+5%", "-q")
    assert same.returncode == 0, same.stderr
    slower = json.loads((out / "report.json").read_text())
    for st in slower["steps"]:
        for role in st["roles"]:
            if role["role"] == "trainer":
                role["mean_ns"]["update"] *= 1.5
    b = tmp_path / "slower.json"
    b.write_text(json.dumps(slower))
    gate = cli("diff", str(out / "report.json"), str(b), "--fail-if", "trainer/update>+10%", "-q")
    assert gate.returncode == 1 and "FAIL: trainer/update +50.0 %" in gate.stderr


PATH_SLICES_SQL = (
    "select count(*) from slice s join thread_track tt on s.track_id = tt.id join thread using (utid) "
    "join process using (upid) where process.name = 'critical path'"
)
PATH_FLOWS_SQL = (
    "select a.name, b.name from flow f join slice a on f.slice_out = a.id join slice b on f.slice_in = b.id "
    "where a.category = 'rl_insight' and b.category = 'rl_insight' order by a.ts"
)


@pytest.mark.slow
@pytest.mark.perfetto
@pytest.mark.parametrize("source", ["shards", "trace.json.gz"])
def test_critical_path_drawn_into_the_trace_opens_in_perfetto(
    demo: dict[str, Any], tmp_path: Path, source: str
) -> None:
    from rl_trace_observer.testing.perfetto import engine

    reason = engine.unavailable_reason()
    if reason:
        pytest.skip(reason)
    out: Path = demo["out"]
    drawn = tmp_path / "path.json.gz"
    proc = cli(
        "report", str(out / source), "-q", "--critical-path", str(drawn), "--json", str(tmp_path / "r.json")
    )
    assert proc.returncode == 0, proc.stderr
    paths = json.loads((tmp_path / "r.json").read_text())["critical_path"]
    res = engine.shared_engine().load(drawn, [PATH_SLICES_SQL, PATH_FLOWS_SQL])
    assert res.loaded and res.error_stats == (), res.summary()
    assert res.query(PATH_SLICES_SQL).rows == ((sum(len(p["segments"]) for p in paths),),)
    want = []
    for p in paths:
        spans = [s["name"] for s in p["segments"] if s["trace_pid"] is not None and s["dur_ns"] >= 2]
        want += list(itertools.pairwise(spans))
    assert list(res.query(PATH_FLOWS_SQL).rows) == want
