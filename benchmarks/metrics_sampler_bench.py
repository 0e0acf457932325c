"""The metric sampler's cost: CPU of one sampler process with 8 engine targets and 8 GPUs, and the
effect of a running sampler on a training-like loop.

1. Sampler CPU: 8 stand-in engines (``testing.vllm_metrics``: vLLM's names, prometheus_client's
   HTTP server, ~190 samples per page) in ANOTHER process, whose counters, gauges and histograms
   move continuously (every page differs from the last: the cache's worst case); 8 GPUs through the
   NVML stand-in (``tests/nvml_standin.py`` — Python overhead of our calls only: the real driver
   calls are not measured here, see ``scripts/gpu/metrics_sampler_check.sh``); the host via psutil.
   The sampler loop runs in a child process for ``--seconds`` at 1 s and at 0.1 s; its CPU time
   (all threads, after set-up) / wall time = share of one core, and apart from it the CPU of its
   drain process (the capture writer's helper that writes the samples file). Baseline in the same
   run: the same child doing the same scrapes with prometheus_client's parser alone (no line cache).
2. Reading one page in this process, parser alone vs the line cache (same pages, values moving).
3. Training loop: a fixed pure-Python workload timed per iteration in a capture process, with a
   sampler running (``RL_TRACE_METRICS=1``) and without (``0``), alternated ``--rounds`` times;
   the ratio of medians and the spread of each.

    python benchmarks/metrics_sampler_bench.py [--seconds 20] [--rounds 6]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ENGINES = """
import sys, time, random
from rl_trace_observer.testing.vllm_metrics import VllmMetrics
engines = [VllmMetrics(model_name="bench", engine="0") for _ in range(8)]
print(" ".join(e.serve() for e in engines), flush=True)
rng = random.Random(1)
while True:  # every engine moves every 50 ms: each scrape sees a new page
    for e in engines:
        e.iteration(running=rng.randint(0, 64), waiting=rng.randint(0, 32), kv_usage=rng.random(),
                    prompt_tokens=rng.randint(0, 500), new_tokens=rng.randint(0, 200))
        e.finished(reason="stop", queue_s=rng.random(), prefill_s=rng.random() / 10,
                   decode_s=rng.random() * 5, ttft_s=rng.random(), e2e_s=rng.random() * 10,
                   prompt_tokens=rng.randint(1, 4000),
                   generation_tokens=rng.randint(1, 2000))
    time.sleep(0.05)
"""

SAMPLER = """
import fcntl, json, os, sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from tests import nvml_standin
from rl_trace_observer import config as config_mod
from rl_trace_observer.capture import streams
from rl_trace_observer.capture.sampler import loop, node
from rl_trace_observer.capture.sampler.exposition import PageReader
from rl_trace_observer.capture.sampler.lifetime import Lifetime
out = Path({out!r})
cfg = config_mod.load({{"RL_TRACE_OUTPUT_DIR": str(out), "RL_TRACE_METRICS_INTERVAL_S": {interval!r},
                        "RL_TRACE_METRICS_PROFILED_INTERVAL_S": {interval!r},
                        "RL_TRACE_METRICS_NODE_DIR": str(out / "nodes")}})
gpu = dict(util=50, used=1 << 30, gpm={{2: 40.0, 5: 10.0}})
nvml_standin.configure([nvml_standin.FakeGpu(**gpu) for _ in range(8)])
if {no_cache!r}:
    PageReader._fast = lambda self, text: None  # the baseline: prometheus_client's parser on every page
from rl_trace_observer.capture.sampler.sink import open_sink
sink = open_sink(out / "samples.jsonl", cfg)
s = loop.Sampler(cfg, out, sink, host="bench", nvml=nvml_standin)
for a in {addresses!r}:
    s._add({{"job": "vllm", "address": a, "labels": {{}}}})
folder = node.node_dir(out, cfg)
members = node._open_lock(folder / node.MEMBERS)
hold = node._open_lock(folder / node.MEMBERS)
fcntl.flock(hold, fcntl.LOCK_SH)  # a member: the loop runs until max_s ...
import subprocess
member = subprocess.Popen(["sleep", "3600"])  # ... and a live process listed as one (lifetime.py)
(folder / node.MEMBER_PIDS).mkdir(parents=True, exist_ok=True)
(folder / node.MEMBER_PIDS / str(member.pid)).write_text(node.start_time(member.pid) or "")
s.tick({interval})  # warm: first full parses, connections
sink.flush(10)
time.sleep(1.0)
def task_ns(pid):
    total = 0
    try:
        for tid in os.listdir(f"/proc/{{pid}}/task"):
            with open(f"/proc/{{pid}}/task/{{tid}}/schedstat") as f:
                total += int(f.read().split()[0])
    except OSError:
        pass
    return total
drain = streams.channel().drain_pid
import threading
def thread_ns(name):
    for t in threading.enumerate():
        if t.name == name and t.native_id:
            try:
                with open(f"/proc/self/task/{{t.native_id}}/schedstat") as f:
                    return int(f.read().split()[0])
            except OSError:
                return 0
    return 0
t0, c0, d0, p0 = time.monotonic(), time.process_time(), task_ns(drain), thread_ns("rl-trace-pump")
lifetime = Lifetime(folder, out, members)
loop.run(s, lifetime, max_s={seconds})
sink.flush(10)
wall, cpu, dcpu = time.monotonic() - t0, time.process_time() - c0, (task_ns(drain) - d0) / 1e9
pump = (thread_ns("rl-trace-pump") - p0) / 1e9
lifetime.close(); s.close(); sink.close(5); member.kill()
assert wall >= 0.9 * {seconds}, f"the loop left after {{wall:.1f}} s"
print(json.dumps({{"wall_s": wall, "cpu_s": cpu, "drain_cpu_s": dcpu, "pump_cpu_s": pump,
                   "scrapes": s.scrapes, "failures": s.failures, "samples": s.writer.samples,
                   "drain": bool(drain)}}))
"""

WORKLOAD = """
import os, sys, time, json
from rl_trace_observer.capture import get_recorder
rec = get_recorder()
if os.environ.get("RL_TRACE_METRICS") == "1":
    from rl_trace_observer.capture.sampler import node
    deadline = time.monotonic() + 20
    while not node.sampler_running(node.node_dir(rec.output_dir)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert node.sampler_running(node.node_dir(rec.output_dir)), "no sampler"
    from rl_trace_observer.capture.sampler import publish_targets
    targets = [{"job": "vllm", "address": a, "labels": {}} for a in sys.argv[1].split()]
    publish_targets(targets)
    time.sleep(1.5)
def work():
    x = 0
    for i in range(200_000):
        x = (x * 31 + i) % 1000003
    return x
times = []
for _ in range(60):
    t = time.perf_counter(); work(); times.append(time.perf_counter() - t)
print(json.dumps(times))
"""


def _engines() -> tuple[subprocess.Popen[str], list[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(ENGINES)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().split()


def sampler_cost(addresses: list[str], interval: float, seconds: float, no_cache: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        code = SAMPLER.format(
            root=str(ROOT),
            out=tmp,
            interval=str(interval),
            addresses=addresses,
            seconds=seconds,
            no_cache=no_cache,
        )
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=seconds + 120
        )
        if proc.returncode != 0:
            raise SystemExit(proc.stderr)
        got = json.loads(proc.stdout.strip().splitlines()[-1])
    got["core_pct"] = 100.0 * got["cpu_s"] / got["wall_s"]
    got["drain_pct"] = 100.0 * got["drain_cpu_s"] / got["wall_s"]
    got["pump_pct"] = 100.0 * got["pump_cpu_s"] / got["wall_s"]
    return got


def training_loop(addresses: list[str], metrics: bool) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RL_TRACE_")}
        env.update(
            RL_TRACE_OUTPUT_DIR=f"{tmp}/out",
            RL_TRACE_METRICS_NODE_DIR=f"{tmp}/nodes",  # removed with the run: no folder left behind
            RL_TRACE_METRICS="1" if metrics else "0",
        )
        proc = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(WORKLOAD), " ".join(addresses)],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if proc.returncode != 0:
            raise SystemExit(proc.stderr)
        from rl_trace_observer import config as config_mod
        from rl_trace_observer.capture.sampler import node

        cfg = config_mod.load({"RL_TRACE_METRICS_NODE_DIR": f"{tmp}/nodes"})
        node.wait_for_sampler(Path(f"{tmp}/out"), 10, cfg)
        return list(json.loads(proc.stdout.strip().splitlines()[-1]))


def page_read_ms(pages: int = 200) -> tuple[float, float, int]:
    """One vLLM-named page read in this process, its values moving between reads: ms per page with
    prometheus_client's parser alone and with the sampler's line cache (same pages), and its lines."""
    import random
    import time

    from prometheus_client import generate_latest

    from rl_trace_observer.capture.sampler.exposition import PageReader
    from rl_trace_observer.testing.vllm_metrics import VllmMetrics

    rng = random.Random(2)
    engine = VllmMetrics(model_name="bench", engine="0")
    texts = []
    for _ in range(pages):
        engine.iteration(
            running=rng.randint(0, 64),
            waiting=rng.randint(0, 32),
            kv_usage=rng.random(),
            prompt_tokens=rng.randint(0, 500),
            new_tokens=rng.randint(0, 200),
        )
        engine.finished(
            reason="stop",
            queue_s=rng.random(),
            prefill_s=rng.random() / 10,
            decode_s=rng.random() * 5,
            ttft_s=rng.random(),
            e2e_s=rng.random() * 10,
            prompt_tokens=rng.randint(1, 4000),
            generation_tokens=rng.randint(1, 2000),
        )
        texts.append(generate_latest(engine.registry).decode())  # fmt: skip
    out = []
    for cached in (False, True):
        reader = PageReader()
        if not cached:
            reader._fast = lambda text: None  # type: ignore[method-assign]
        reader.read(texts[0])
        t0 = time.perf_counter()
        for text in texts[1:]:
            reader.read(text)
        out.append((time.perf_counter() - t0) * 1e3 / (pages - 1))
    return out[0], out[1], texts[-1].count("\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start")
    parser_ms, cached_ms, lines = page_read_ms()
    print(
        f"reading one vLLM-named page ({lines} lines, values moving): prometheus_client's parser "
        f"{parser_ms:.3f} ms, with the line cache {cached_ms:.3f} ms ({parser_ms / cached_ms:.0f}x less)"
    )
    engines, addresses = _engines()
    try:
        print(
            "sampler process, 8 engine targets (pages change every scrape) + 8 GPUs (NVML stand-in) + host:"
        )
        for interval in (1.0, 0.1):
            for no_cache in (True, False):
                r = sampler_cost(addresses, interval, args.seconds, no_cache)
                what = "parser only (baseline)" if no_cache else "with line cache        "
                print(
                    f"  interval {interval:>4} s  {what}: {r['core_pct']:6.2f} % of one core "
                    f"({r['cpu_s']:.2f} CPU s / {r['wall_s']:.1f} s, {r['scrapes']} scrapes, "
                    f"{r['failures']} failed; of it the writer's pump thread {r['pump_pct']:.2f} %); "
                    f"its drain process {r['drain_pct']:.2f} % more"
                )
        print("training-like loop (200k-step pure-Python loop, 60 iterations, median ms), alternating:")
        on, off = [], []
        for i in range(args.rounds):
            for metrics in (False, True) if i % 2 == 0 else (True, False):
                times = training_loop(addresses, metrics)
                (on if metrics else off).append(statistics.median(times) * 1e3)
        for label, got in (("without sampler", off), ("with sampler:  ", on)):
            rounds = ", ".join(f"{v:.2f}" for v in got)
            print(f"  {label}: {statistics.median(got):.2f} ms (rounds: {rounds})")
        print(f"  ratio with/without: {statistics.median(on) / statistics.median(off):.3f}")
        print(f"load average at end {os.getloadavg()[0]:.2f}")
    finally:
        engines.kill()


if __name__ == "__main__":
    main()
