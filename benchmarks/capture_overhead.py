"""Per-span cost of ``rl_insight.trace_state`` under each backend, all measured in one run.

Modes (each in a fresh interpreter, because RL-Insight's state is per process):
- ``disabled``: rl-insight not initialised (VERL with the logger off);
- ``null_client``: rl-insight on, a client whose ``apply_event`` does nothing — RL-Insight's own
  bookkeeping, the floor any backend pays;
- ``rl_trace_observer``: our backend writing the JSONL event log;
- ``forward_ray``: our backend + forwarding to RL-Insight's real Ray client (local Ray cluster);
- ``open_append_close``: a naive backend that opens, appends and closes the file for every event.

"Added cost of our backend" = median(rl_trace_observer) − median(null_client).
Usage: ``python benchmarks/capture_overhead.py [--spans 20000] [--no-ray]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

CHILD = r"""
import json, os, statistics, sys, time
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
elif mode in ("rl_trace_observer", "forward_ray"):
    from rl_trace_observer.integrations.rl_insight import install
    assert install()
import rl_insight
if mode != "disabled":
    rl_insight.init()
trace_state = rl_insight.trace_state
perf = time.perf_counter_ns
for i in range(2000):  # warm up
    with trace_state("actor_update", state_lane_id="rank_0", step=i):
        pass
samples = []
for i in range(n):
    t0 = perf()
    with trace_state("actor_update", state_lane_id="rank_0", step=i):
        pass
    samples.append(perf() - t0)
samples.sort()
print(json.dumps({"median_ns": samples[len(samples) // 2], "p99_ns": samples[int(len(samples) * 0.99)],
                  "mean_ns": statistics.fmean(samples)}))
if mode == "forward_ray":
    ray.shutdown()
"""

MODES = ("disabled", "null_client", "rl_trace_observer", "forward_ray", "open_append_close")


def run_mode(mode: str, spans: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as out:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RL_TRACE_", "RL_INSIGHT_"))}
        env.update(RAY_AUTH_MODE="disabled", RL_TRACE_OUTPUT_DIR=out)
        env["RL_INSIGHT_SERVER_URL"] = "http://127.0.0.1:9" if mode == "forward_ray" else "local://x"
        if mode == "forward_ray":
            env["RL_TRACE_FORWARD_TO_RL_INSIGHT"] = "1"
        proc = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(CHILD), mode, str(spans), out],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0:
            raise SystemExit(f"{mode} failed:\n{proc.stderr[-3000:]}")
        result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=3, help="runs per mode; the best median is kept")
    parser.add_argument("--no-ray", action="store_true", help="skip the forward_ray mode")
    args = parser.parse_args()
    modes = [m for m in MODES if not (args.no_ray and m == "forward_ray")]
    results = {}
    for mode in modes:
        runs = [run_mode(mode, args.spans) for _ in range(1 if mode == "forward_ray" else args.repeat)]
        results[mode] = min(runs, key=lambda r: r["median_ns"])
    floor = results["null_client"]["median_ns"]
    ours = results["rl_trace_observer"]["median_ns"]
    naive = results["open_append_close"]["median_ns"]
    print(f"{'mode':<20}{'median µs':>12}{'p99 µs':>10}{'added vs null µs':>18}")
    for mode, r in results.items():
        added = (r["median_ns"] - floor) / 1000
        print(f"{mode:<20}{r['median_ns'] / 1000:>12.2f}{r['p99_ns'] / 1000:>10.2f}{added:>18.2f}")
    added_ours = (ours - floor) / 1000
    ratio = (naive - floor) / max(ours - floor, 1)
    print()
    print(f"added cost of our backend: {added_ours:.2f} µs/span (target ≤ 5 µs)")
    print(f"open-append-close baseline costs {ratio:.1f}× our added cost (target ≥ 5×)")
    print(
        json.dumps(
            {
                "added_us": round(added_ours, 3),
                "ratio_vs_open_append_close": round(ratio, 2),
                "modes": results,
            }
        )
    )


if __name__ == "__main__":
    main()
