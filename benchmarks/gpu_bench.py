"""The report's GPU analysis on a generated run: the report with it against the report without it
(today's report: ``summarize(..., gpu=False)`` keeps no kernel), measured in the same run.

    python benchmarks/gen_run.py /tmp/run --events 10_000_000
    python benchmarks/gpu_bench.py /tmp/run [--work /tmp/gpu-bench] [--rounds 2]

Merges RUN once into ``WORK/run.json.gz`` with span shards, then runs each case in its own child,
alternating A/B per round, and prints CPU seconds (user + sys), wall seconds and peak RSS with the
ratio to the baseline of the same round; then, in one process, the CPU time of the GPU analysis
alone (attribution + every figure) on the loaded kernels.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

WRAP = """
import resource, sys, time
t = time.monotonic()
from rl_trace_observer.analysis.report.output import summarize
s = summarize(sys.argv[1], gpu=sys.argv[2] == "1")
wall = time.monotonic() - t
u = resource.getrusage(resource.RUSAGE_SELF)
g = s.get("gpu") or {}
print(u.ru_utime + u.ru_stime, wall, u.ru_maxrss * 1024, g.get("kernels", 0), len(g.get("rows") or []))
"""

ALONE = """
import sys, time
from rl_trace_observer.analysis.report import compute
from rl_trace_observer.analysis.report.load import load_trace
data = load_trace(sys.argv[1])
t = time.process_time()
compute.model(data)
print(len(data.gpu), len(data.gpu.l_ts), time.process_time() - t)
"""


def measure(args: list[str]) -> tuple[float, float, int, int, int]:
    out = subprocess.run([sys.executable, "-c", WRAP, *args], capture_output=True, text=True, check=True)
    cpu, wall, rss, kernels, rows = out.stdout.split()
    return float(cpu), float(wall), int(rss), int(kernels), int(rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path)
    ap.add_argument("--work", type=Path, default=Path("/tmp/gpu-bench"))
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    trace, shards = work / "run.json.gz", work / "shards"
    if not trace.is_file():
        t = time.monotonic()
        rl = [sys.executable, "-m", "rl_trace_observer.cli.main"]
        subprocess.run([*rl, "merge", str(args.run), "-o", str(trace), "--shards", str(shards)], check=True)
        print(f"merged {args.run} in {time.monotonic() - t:.1f} s")
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'case':44} {'CPU s':>7} {'wall s':>7} {'peak MB':>8} {'kernels':>9}  vs baseline (CPU, peak)")
    for r in range(args.rounds):
        for source, label in ((trace, ".json.gz"), (shards, "shards")):
            base = None
            for gpu in (False, True) if r % 2 == 0 else (True, False):
                cpu, wall, rss, kernels, rows = measure([str(source), "1" if gpu else "0"])
                name = f"round {r + 1} report {label} " + ("with GPU" if gpu else "baseline (no GPU)")
                if not gpu:
                    base = (cpu, rss)
                    print(f"{name:44} {cpu:7.1f} {wall:7.1f} {rss / 1e6:8.0f} {kernels:9,}")
                else:
                    mine = (cpu, wall, rss, kernels, rows)
            assert base is not None
            cpu, wall, rss, kernels, rows = mine
            name = f"round {r + 1} report {label} with GPU"
            print(f"{name:44} {cpu:7.1f} {wall:7.1f} {rss / 1e6:8.0f} {kernels:9,}  "
                  f"{cpu / base[0]:.2f}x, {rss / base[1]:.2f}x ({rows} gpu rows)")  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-c", ALONE, str(trace)], capture_output=True, text=True, check=True
    )
    kernels, launches, alone = out.stdout.split()
    print(f"GPU analysis alone (attribution + figures, no loading): {float(alone):.2f} CPU s "
          f"for {int(kernels):,} kernels and {int(launches):,} launches")  # fmt: skip
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
