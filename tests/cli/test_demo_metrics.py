"""The demo's metrics end to end: its replicas' real ``/metrics`` (prometheus_client, vLLM's names),
registered through ``rl_insight.update_prometheus_config`` as VERL does, sampled by the node's
sampler process with the host, merged into counter tracks, reported, queried — on the shared demo
run (tests/conftest.py ``demo``), loaded in the real offline Perfetto engine."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ..conftest import DEMO_STEPS, need

TRACKS_SQL = (
    "select p.name as process, t.name as track, count(*) as n from counter c "
    "join process_counter_track t on c.track_id = t.id join process p using (upid) "
    "where t.name like 'vllm:%' or t.name like 'host_%' group by 1, 2 order by 1, 2"
)


def _manifest_metrics(demo: dict[str, Any]) -> dict[str, Any]:
    manifest = json.loads((demo["out"] / "trace.pftrace.manifest.json").read_text())
    (entry,) = [a for a in manifest["artifacts"] if a["kind"] == "metric_samples"]
    assert entry["owner"] and entry["role"] == "sampler" and entry["complete"]
    return entry["metrics"]


@pytest.mark.slow
def test_demo_manifest_says_what_was_sampled_and_that_no_gpu_was_found(demo: dict[str, Any]) -> None:
    m = _manifest_metrics(demo)
    assert m["gpus"]["found"] == 0 and "NVML" in m["gpus"]["reason"]
    assert m["host_metrics"]["available"]
    assert sorted((t["job"], t["labels"]["replica"]) for t in m["targets"]) == [("vllm", "0"), ("vllm", "1")]
    assert m["samples"] > 0  # the collected copy: taken while the sampler still ran (no stats yet)
    from rl_trace_observer.merge.formats.metric_samples.decode import decode

    (path,) = (demo["out"] / "run").glob("metrics-*.samples.jsonl")
    stats = decode(path.read_bytes()).last_stats()  # the sampler's own file, after it exited
    assert stats is not None and stats["scrapes"] > 0 and stats["cpu_s"] > 0
    records = [json.loads(p.read_text()) for p in (demo["out"] / "run").glob("rl-trace-process-*.json")]
    (driver,) = [r for r in records if r.get("metrics_targets")]
    assert driver["role"] == "driver" and len(driver["metrics_targets"]) == 2


@pytest.mark.slow
@pytest.mark.perfetto
@pytest.mark.parametrize("name", ["trace.pftrace", "trace.json.gz"])
def test_demo_counter_tracks_sit_under_the_replicas_and_the_host(demo: dict[str, Any], name: str) -> None:
    engine = pytest.importorskip("rl_trace_observer.testing.perfetto.engine")
    reason = engine.unavailable_reason()
    if reason:
        pytest.skip(reason)
    res = engine.shared_engine().load(demo["out"] / name, [TRACKS_SQL])
    assert res.loaded and res.error_stats == (), res.summary()
    rows = res.query(TRACKS_SQL).rows
    by_process: dict[str, set[str]] = {}
    for process, track, _n in rows:
        by_process.setdefault(process, set()).add(track)
    replicas = {p: t for p, t in by_process.items() if "rollout replica" in p}
    assert len(replicas) == 2, by_process.keys()  # each engine's tracks in its own server process
    for tracks in replicas.values():
        for want in (
            "vllm:num_requests_running",
            "vllm:kv_cache_usage_perc",
            "vllm:generation_tokens /s",
            "vllm:time_to_first_token_seconds p99",
        ):
            assert any(t.startswith(want) for t in tracks), (want, tracks)
    (host,) = [p for p in by_process if p.endswith("· Host")]
    assert any(t.startswith("host_cpu_percent") for t in by_process[host])


@pytest.mark.slow
def test_demo_report_telemetry_next_to_the_request_spans(demo: dict[str, Any]) -> None:
    summary = json.loads((demo["out"] / "report.json").read_text())
    tel = summary["telemetry"]
    assert tel["gpus"] == [] and tel["gpu_note"].startswith("no GPU was found")
    rows = tel["engines"]
    assert sorted({(r["step"], r["replica"]) for r in rows}) == [
        (s, r) for s in range(1, DEMO_STEPS + 1) for r in (0, 1)
    ]
    for r in rows:
        assert r["generation_tokens_low"] <= r["generation_tokens"] <= r["generation_tokens_high"]
        assert r["span_generation_tokens"] > 0 and r["disagrees"] is False, r
    assert any(r["running_max"] and r["running_max"] > 0 for r in rows)  # sampled while generating
    assert {r["role"] for r in tel["host_cpu"]} >= {"trainer", "rollout"}
    assert not any(m["name"].startswith(("vllm:", "host_")) for m in summary["metrics"])


@pytest.mark.slow
def test_demo_samples_table_counts_what_perfetto_shows(demo: dict[str, Any]) -> None:
    need("duckdb")
    from rl_trace_observer.analysis.query.sql import open_run

    with open_run(demo["out"] / "shards") as db:
        got = db.sql(
            "SELECT role, metric, kind, count(*) FROM samples WHERE metric LIKE 'vllm:%' "
            "AND kind IN ('gauge', 'rate') GROUP BY ALL ORDER BY ALL"
        ).fetchall()
        hosts = db.sql("SELECT DISTINCT device FROM samples WHERE metric = 'host_cpu_percent'").fetchall()
    assert ("rollout", "vllm:num_requests_running", "gauge") in [g[:3] for g in got]
    assert ("rollout", "vllm:generation_tokens", "rate") in [g[:3] for g in got]
    assert hosts == [("Host",)]


def test_naming_samples_builds_the_report_steps_its_step_column_needs() -> None:
    """``rl-trace sql`` builds the report's tables only when a query names them (issue 26); the
    ``samples`` view's ``step`` comes from ``steps``, so naming ``samples`` asks for it too."""
    from rl_trace_observer.analysis.query.report_tables import named_in

    assert named_in("SELECT step, count(*) FROM samples GROUP BY 1") == {"steps"}
    assert named_in("SELECT * FROM samples JOIN kernels USING (step)") == {"steps", "kernels"}
    assert named_in("SELECT count(*) FROM spans") == set()
