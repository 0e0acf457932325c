"""Per-span cost of ``rl_insight.trace_state`` under each backend, all measured in one run.

Modes (each in a fresh interpreter, because RL-Insight's state is per process):
- ``disabled``: rl-insight not initialised (VERL with the logger off);
- ``null_client``: rl-insight on, a client whose ``apply_event`` does nothing — RL-Insight's own
  bookkeeping, the floor any backend pays;
- ``rl_trace_observer``: our backend writing the JSONL event log;
- ``before``: the same with another checkout's ``src`` (``--before PATH``: e.g. the commit before a
  change, for a before/after in one run);
- ``forward_ray``: our backend + forwarding to RL-Insight's real Ray client (local Ray cluster);
- ``open_append_close``: a naive backend that opens, appends and closes the file for every event.

What is measured, per span: **CPU time of every thread of the training process**
(``time.process_time`` over the loop and a final flush, so the pump/flusher thread's share of
those spans is in it), the **CPU time of the drain process** (our writer's helper process, from
``/proc/<pid>/task/*/schedstat``; 0 for designs without one), the pump thread's share on its own,
and the median **wall time** of one call on the calling thread. "Added" = mode − ``null_client``.
Modes run in alternating rounds; of each figure the least disturbed round (the lowest) is kept.

Usage: ``python benchmarks/capture_overhead.py [--spans 20000] [--rounds 3] [--no-ray] [--before SRC]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from typing import Any

CHILD = r"""
import json, os, statistics, sys, threading, time
mode, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if mode == "forward_ray":
    import ray
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
import rl_insight.client
from rl_insight.client.base import register_monitor_client
if mode == "null_client":
    class Null:
        def apply_event(self, event):
            pass
    register_monitor_client("ray", lambda conf: Null())
elif mode == "open_append_close":
    import orjson
    path = os.path.join(out, "naive.jsonl")
    class Naive:
        def apply_event(self, event):
            with open(path, "ab") as f:
                f.write(orjson.dumps(event) + b"\n")
    register_monitor_client("ray", lambda conf: Naive())
elif mode in ("rl_trace_observer", "before", "forward_ray"):
    from rl_trace_observer.integrations.rl_insight import install
    assert install()
import rl_insight
if mode != "disabled":
    rl_insight.init()
trace_state = rl_insight.trace_state

def flush():
    from rl_trace_observer.capture import get_recorder
    rec = get_recorder() if mode in ("rl_trace_observer", "before", "forward_ray") else None
    if rec is not None:
        rec.events.flush()

def task_ns(path):
    total = 0
    try:
        for tid in os.listdir(path):
            with open(f"{path}/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
    except OSError:
        pass
    return total

def thread_ns(name):
    for t in threading.enumerate():
        if t.name == name and t.native_id:
            try:
                with open(f"/proc/self/task/{t.native_id}/schedstat") as f:
                    return int(f.read().split()[0])
            except OSError:
                return 0
    return 0

for i in range(2000):  # warm up (the drain is started and the lane named here)
    with trace_state("actor_update", state_lane_id="rank_0", step=i):
        pass
flush()
from rl_trace_observer.capture import get_recorder
rec = get_recorder() if mode in ("rl_trace_observer", "before", "forward_ray") else None
drain = getattr(getattr(rec.events, "_channel", None), "drain_pid", None) if rec is not None else None
helper = "rl-trace-pump" if drain else "rl-trace-flush"
perf = time.perf_counter_ns
samples = []
d0, h0, c0 = task_ns(f"/proc/{drain}/task") if drain else 0, thread_ns(helper), time.process_time_ns()
for i in range(n):
    t0 = perf()
    with trace_state("actor_update", state_lane_id="rank_0", step=i):
        pass
    samples.append(perf() - t0)
flush()
c1, h1, d1 = time.process_time_ns(), thread_ns(helper), task_ns(f"/proc/{drain}/task") if drain else 0
samples.sort()
print(json.dumps({"median_ns": samples[len(samples) // 2], "p99_ns": samples[int(len(samples) * 0.99)],
                  "cpu_ns": (c1 - c0) / n, "drain_cpu_ns": (d1 - d0) / n, "helper_cpu_ns": (h1 - h0) / n,
                  "drain": bool(drain)}))
if mode == "forward_ray":
    ray.shutdown()
"""

MODES = ("disabled", "null_client", "rl_trace_observer", "before", "forward_ray", "open_append_close")


def run_mode(mode: str, spans: int, before: str | None) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as out:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RL_TRACE_", "RL_INSIGHT_"))}
        env.pop("PYTHONPATH", None)
        env.update(
            RAY_AUTH_MODE="disabled", RL_TRACE_OUTPUT_DIR=out, RL_TRACE_METRICS="0"
        )  # the writer alone
        env["RL_INSIGHT_SERVER_URL"] = "http://127.0.0.1:9" if mode == "forward_ray" else "local://x"
        if mode == "forward_ray":
            env["RL_TRACE_FORWARD_TO_RL_INSIGHT"] = "1"
        if mode == "before" and before:
            env["PYTHONPATH"] = before
        proc = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(CHILD), mode, str(spans), out],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            cwd="/",
        )
        if proc.returncode != 0:
            raise SystemExit(f"{mode} failed:\n{proc.stderr[-3000:]}")
        result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
        return result


def _table(results: dict[str, dict[str, Any]]) -> None:
    floor = results["null_client"]
    head = ("mode", "CPU µs", "added", "drain CPU", "pump/flusher", "wall median", "added", "wall p99")
    print(f"{head[0]:<20}" + "".join(f"{h:>13}" for h in head[1:]))
    for mode, r in results.items():
        cells = (
            r["cpu_ns"] / 1000,
            (r["cpu_ns"] - floor["cpu_ns"]) / 1000,
            r["drain_cpu_ns"] / 1000,
            r["helper_cpu_ns"] / 1000,
            r["median_ns"] / 1000,
            (r["median_ns"] - floor["median_ns"]) / 1000,
            r["p99_ns"] / 1000,
        )
        print(f"{mode:<20}" + "".join(f"{c:>13.2f}" for c in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the least disturbed kept")
    parser.add_argument("--no-ray", action="store_true", help="skip the forward_ray mode")
    parser.add_argument("--before", metavar="SRC", help="another checkout's src/ for the 'before' mode")
    args = parser.parse_args()
    modes = [m for m in MODES if not (args.no_ray and m == "forward_ray") and (m != "before" or args.before)]
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for rnd in range(args.rounds):
        for mode in modes:
            if mode == "forward_ray" and rnd:
                continue  # one round: a Ray cluster start per round costs minutes on 2 cores
            runs[mode].append(run_mode(mode, args.spans, args.before))
    results = {m: {k: min(r[k] for r in rs) for k in rs[0]} for m, rs in runs.items()}  # per figure
    print(f"spans per run {args.spans}, rounds {args.rounds}, load average {os.getloadavg()[0]:.1f}")
    print("per span, µs; 'added' is against null_client (RL-Insight's own cost) of the same run")
    _table(results)
    floor = results["null_client"]
    ours = results["rl_trace_observer"]
    naive = results["open_append_close"]
    added = (ours["cpu_ns"] - floor["cpu_ns"]) / 1000
    ratio = (naive["cpu_ns"] - floor["cpu_ns"]) / max(ours["cpu_ns"] - floor["cpu_ns"], 1)
    print()
    print(
        f"added CPU of our backend: {added:.2f} µs/span in the training process (all threads; target ≤ 2.7) "
        f"+ {ours['drain_cpu_ns'] / 1000:.2f} µs/span in its drain process"
    )
    if "before" in results:
        b = results["before"]
        was = (b["cpu_ns"] - floor["cpu_ns"]) / 1000
        total = added + ours["drain_cpu_ns"] / 1000
        print(
            f"before: {was:.2f} µs/span added (no drain); after/before {added / max(was, 1e-9):.2f}x in "
            f"the training process, {total / max(was, 1e-9):.2f}x with the drain"
        )
    print(f"open-append-close costs {ratio:.1f}× our added CPU")
    print(
        json.dumps(
            {"added_cpu_us": round(added, 3), "ratio_vs_open_append_close": round(ratio, 2), "modes": results}
        )
    )


if __name__ == "__main__":
    main()
