"""The watch's ``/metrics`` in a REAL Prometheus (Debian's ``prometheus``), found through a REAL
RL-Insight server: the watch registers itself with ``rl_insight.update_prometheus_config``, the
server writes its ``file_sd`` file, Prometheus scrapes the watch. Every figure of every step comes
back from Prometheus' HTTP API equal to the report's, and every PromQL query of the shipped Grafana
dashboard (docs/grafana/rl-trace-watch.json) returns data."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import rl_trace_observer as rto
from rl_trace_observer.analysis.live.figures import step_figures
from rl_trace_observer.analysis.live.metrics import FAMILIES, step_samples
from rl_trace_observer.analysis.live.options import WatchOptions
from rl_trace_observer.analysis.live.rl_insight_targets import JOB, register_watch_endpoint
from rl_trace_observer.analysis.live.server import WatchServer
from rl_trace_observer.analysis.live.watch import Watch

from ..conftest import ROOT, need, requires
from ..corpus.live_run import LiveRun

PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    requires("pyarrow", "rl_insight"),
    pytest.mark.skipif(PROMETHEUS is None, reason="needs Debian's prometheus: apt-get install -y prometheus"),
]
DASHBOARD = ROOT / "docs" / "grafana" / "rl-trace-watch.json"
COUNTERS = {f for f, (kind, _) in FAMILIES.items() if kind == "counter"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_json(url: str, data: bytes | None = None) -> Any:
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=10) as resp:
        return json.loads(resp.read())


def wait_for(pred: Any, timeout: float = 60.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.2)


@pytest.fixture
def rl_insight_server(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """RL-Insight's own server app (its target store writes Prometheus' file_sd file)."""
    need("rl_insight")
    import uvicorn
    from omegaconf import OmegaConf
    from rl_insight.server.http_api import create_app

    prom_port = free_port()
    conf = OmegaConf.create(
        {
            "server": {"runtime_dir": str(tmp_path / "rli-runtime"), "data_dir": str(tmp_path / "rli-data")},
            "prometheus": {"prometheus_port": prom_port, "enable": True},
            "grafana": {"enable": False, "port": 0},
            "tempo": {"enable": False},
            "otel": {"otel_port": 0},
        }
    )
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(conf), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, 30, "RL-Insight server start")
        targets = tmp_path / "rli-data" / "targets" / "prometheus-targets.yml"
        yield {"url": f"http://127.0.0.1:{port}", "targets": targets, "prom_port": prom_port}
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def prometheus(tmp_path: Path, rl_insight_server: dict[str, Any]) -> Iterator[str]:
    port = rl_insight_server["prom_port"]
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: rl_insight_targets\n    file_sd_configs:\n"
        f"      - files: ['{rl_insight_server['targets']}']\n        refresh_interval: 1s\n"
    )
    proc = subprocess.Popen(
        [
            str(PROMETHEUS),
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(base), 30, "prometheus ready")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ready(base: str) -> bool:
    try:
        with urllib.request.urlopen(base + "/-/ready", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def query(base: str, promql: str) -> list[dict[str, Any]]:
    doc = http_json(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    assert doc["status"] == "success", doc
    return list(doc["data"]["result"])


def selector(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}" if inner else name


def test_every_figure_of_every_step_comes_back_from_prometheus(
    tmp_path: Path, rl_insight_server: dict[str, Any], prometheus: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = LiveRun(tmp_path / "run")
    run.add_sampler()  # two engine replicas: the dashboard's engine and KV-cache panels
    watch = Watch(WatchOptions(run.folder, tmp_path / "watch", settle_s=0))
    server = WatchServer(tmp_path / "watch", 0).start()
    monkeypatch.setenv("RL_INSIGHT_SERVER_URL", rl_insight_server["url"])
    try:
        said = register_watch_endpoint(server.port, "live-1")
        assert said and "registered" in said, said
        assert f"127.0.0.1:{server.port}" in rl_insight_server["targets"].read_text()
        targets = lambda: http_json(prometheus + "/api/v1/targets")["data"]["activeTargets"]  # noqa: E731
        wait_for(lambda: any(t["health"] == "up" for t in targets()), 60, "watch target up")
        assert {t["labels"].get("rl_insight_job") for t in targets()} == {JOB}
        seen: dict[int, dict[str, Any]] = {}
        for step in (1, 2, 3):
            run.step(step, slow=15 * (step - 1))
            assert watch.look() == [step]
            server.publish(watch.status())
            wait_for(
                lambda s=step: [
                    r for r in query(prometheus, "rl_trace_watch_last_step") if float(r["value"][1]) == s
                ],
                30,
                f"step {step} scraped",
            )
            record = watch.steps[step]
            assert "rl_trace_step_weight_sync_seconds" in step_samples(record)  # the corpus syncs each step
            for name, samples in step_samples(record).items():
                for labels, value in samples:
                    got = query(prometheus, selector(name, labels))
                    assert len(got) == 1, (name, labels, got)
                    assert float(got[0]["value"][1]) == value, (step, name, labels)
                    assert got[0]["metric"]["run"] == "live-1"
            seen[step] = record
        grafana = json.loads(DASHBOARD.read_text())  # while the watch is still being scraped
        exprs = [t["expr"] for p in grafana["panels"] for t in p["targets"]]
        assert len(exprs) >= 12
        served = {"rl_trace_watch_last_step", "rl_trace_watch_answer_seconds"} | {
            n for r in seen.values() for n in step_samples(r)
        }
        checked = 0
        for expr in exprs:  # every query is valid PromQL; one over series this run serves has data
            families = set(re.findall(r"rl_trace_\w+", expr))
            assert families <= set(FAMILIES), expr
            got = query(prometheus, expr)
            if families <= served | COUNTERS:
                assert got, f"no data for the dashboard's query {expr}"
                checked += 1
        assert checked >= 14, checked  # GPU and staleness panels need Kineto traces / consume spans
    finally:
        server.close()
        run.close()
    summary = rto.report(str(_post_hoc_shards(run.folder, tmp_path)))
    for step, record in seen.items():  # what Prometheus held is what the post-hoc report says
        post = json.loads(json.dumps(step_figures(summary, step)))
        assert record["figures"] == post
        assert step_samples(record)["rl_trace_step_duration_seconds"] == [
            ({}, post["steps"][0]["dur_ns"] / 1e9)
        ]


def _post_hoc_shards(run_dir: Path, tmp: Path) -> Path:
    shards = tmp / "post-shards"
    rto.merge([str(run_dir)], str(tmp / "post.pftrace"), rto.MergeOptions(shards=str(shards)))
    return shards
