"""Debian's ``prometheus`` and ``prometheus-node-exporter``, started by a test on 127.0.0.1 (nothing runs
as a service here) and stopped by it; Prometheus scrapes what a ``file_sd`` file names. Shared by the
tests that compare our metric sampler with what Prometheus stored (a standalone engine in
``test_vllm_real``, VERL's engines in ``test_verl_vllm_e2e``)."""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def missing(*exes: str) -> str | None:
    for exe in exes or ("prometheus", "prometheus-node-exporter"):
        if shutil.which(exe) is None:
            return f"needs Debian's {exe} (scripts/bootstrap.sh installs it as root)"
    return None


def _wait_http(url: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def start_node_exporter(log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """node_exporter with its default collectors on a free local port; returns (process, host:port)."""
    addr = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        ["prometheus-node-exporter", f"--web.listen-address={addr}"],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    _wait_http(f"http://{addr}/metrics")
    return proc, addr


def start_prometheus(
    root: Path, file_sd: Path, interval_s: float = 1.0
) -> tuple[subprocess.Popen[bytes], str]:
    """Prometheus scraping every target in ``file_sd`` every ``interval_s``; returns (process, base URL)."""
    root.mkdir(parents=True, exist_ok=True)
    if not file_sd.exists():
        file_sd.write_text("[]")
    config = root / "prometheus.yml"
    config.write_text(
        json.dumps(  # YAML is a superset of JSON
            {
                "global": {
                    "scrape_interval": f"{round(interval_s * 1000)}ms",
                    "scrape_timeout": f"{round(interval_s * 1000)}ms",
                },
                "scrape_configs": [
                    {
                        "job_name": "file_sd",
                        "file_sd_configs": [{"files": [str(file_sd)], "refresh_interval": "1s"}],
                    }
                ],
            }
        )
    )
    addr = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={root / 'data'}",
            f"--web.listen-address={addr}",
            "--web.enable-lifecycle",
        ],
        stdout=(root / "prometheus.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    _wait_http(f"http://{addr}/-/ready")
    return proc, f"http://{addr}"


def write_file_sd(path: Path, jobs: dict[str, list[tuple[str, dict[str, str]]]]) -> None:
    """Prometheus' ``file_sd`` file: one group per target, labelled with its job and its own labels
    (written whole and renamed: Prometheus never reads half a file)."""
    groups = [
        {"targets": [address], "labels": {**labels, "job": job}}
        for job, targets in sorted(jobs.items())
        for address, labels in targets
    ]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(groups))
    os.replace(tmp, path)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def query(base: str, promql: str, at: float | None = None) -> list[dict[str, Any]]:
    """``/api/v1/query``: the result list (instant vectors, or raw samples of a range selector)."""
    params = {"query": promql}
    if at is not None:
        params["time"] = f"{at:.3f}"
    url = f"{base}/api/v1/query?{urllib.parse.urlencode(params)}"
    body = json.loads(urllib.request.urlopen(url, timeout=10).read())
    assert body["status"] == "success", body
    return list(body["data"]["result"])


SeriesKey = tuple[str, tuple[tuple[str, str], ...]]
_TARGET_LABELS = {"job", "instance", "replica", "__name__"}


def series_key(name: str, labels: dict[str, str]) -> SeriesKey:
    """A series as the exporter's page names it: the labels the scraper adds (job, instance, the
    target's own) left out, so our sampler's series and Prometheus' compare."""
    return name, tuple(sorted((k, v) for k, v in labels.items() if k not in _TARGET_LABELS))


def stored_samples(
    base: str, selector: str, at: float, span_s: float
) -> dict[str, dict[SeriesKey, dict[float, float]]]:
    """Every raw sample Prometheus stored for ``selector`` in ``[at - span_s, at]``: instance ->
    series -> {scrape time (s) -> value} (a range selector: no staleness markers, no lookback)."""
    out: dict[str, dict[SeriesKey, dict[float, float]]] = {}
    for row in query(base, f"{selector}[{math.ceil(span_s)}s]", at=at):
        metric = row["metric"]
        series = out.setdefault(metric["instance"], {}).setdefault(series_key(metric["__name__"], metric), {})
        for ts, value in row["values"]:
            series[float(ts)] = float(value)
    return out


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))
