"""``rl-trace sql`` and the report (with its answers) on a generated run, against today's streaming
report of the same merge, measured in the same run.

    python benchmarks/gen_run.py /tmp/run --events 10_000_000
    python benchmarks/answers_bench.py /tmp/run [--work /tmp/answers-bench]

Merges RUN once into ``WORK/run.json.gz`` with span shards (``WORK/shards``), then runs each command in
its own child and prints CPU seconds (user + sys of the child tree), wall seconds and the child's peak
RSS, each also as a ratio to the baseline (the streaming report on the ``.json.gz``, which now
computes the answers too; ``answers only`` times the answers alone on the report's loaded spans).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

WRAP = """
import resource, subprocess, sys, time
t = time.monotonic()
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE).returncode
wall = time.monotonic() - t
u = resource.getrusage(resource.RUSAGE_CHILDREN)
print(rc, u.ru_utime + u.ru_stime, wall, u.ru_maxrss * 1024)
"""

ANSWERS_ONLY = """
import sys, time
from rl_trace_observer.analysis.answers import StepWindow, answer_sections
from rl_trace_observer.analysis.report import compute
from rl_trace_observer.analysis.report.load import load_trace
data = load_trace(sys.argv[1])
t = time.process_time()
compute.build_summary(data)
total = time.process_time() - t
spans, _ = compute._stage_spans(data)
markers = [s for s in spans if compute.classify(s.name) == compute.STEP]
work = [s for s in spans if compute.classify(s.name) != compute.STEP]
windows = [StepWindow(w.step, w.start_ns, w.end_ns) for w in compute.step_windows(markers)]
rows = compute.work_spans(compute._Index(data, work))
t = time.process_time()
answer_sections(rows, windows)
print(len(rows), total, time.process_time() - t)
"""


COUNT = "SELECT count(*) FROM spans"


def measure(cmd: list[str]) -> tuple[float, float, int]:
    out = subprocess.run([sys.executable, "-c", WRAP, *cmd], capture_output=True, text=True, check=True)
    rc, cpu, wall, rss = out.stdout.split()
    if rc != "0":
        raise SystemExit(f"failed ({rc}): {' '.join(cmd)}\n{out.stderr}")
    return float(cpu), float(wall), int(rss)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path)
    ap.add_argument("--work", type=Path, default=Path("/tmp/answers-bench"))
    args = ap.parse_args()
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    trace, shards = work / "run.json.gz", work / "shards"
    rl = [sys.executable, "-m", "rl_trace_observer.cli.main"]
    if not trace.is_file():
        t = time.monotonic()
        subprocess.run([*rl, "merge", str(args.run), "-o", str(trace), "--shards", str(shards)], check=True)
        print(f"merged {args.run} in {time.monotonic() - t:.1f} s")
    doc = json.loads((shards / "rl-trace-shards.json").read_text())
    print(f"{doc['rows']:,} rows in {len(doc['files'])} shard parts, {doc['bytes'] / 1e6:.0f} MB; "
          f"trace {trace.stat().st_size / 1e6:.0f} MB")  # fmt: skip
    from rl_trace_observer.analysis.query.sql import EXAMPLES

    bare = work / "bare.json.gz"  # the same trace without its manifest: sql must convert it
    if not bare.exists():
        bare.hardlink_to(trace)

    cases = [
        ("report .json.gz (baseline: streaming)",
         [*rl, "report", str(trace), "-q", "--json", str(work / "a.json")]),
        ("report shards", [*rl, "report", str(shards), "-q", "--json", str(work / "b.json")]),
        ("sql shards: stage time (README)", [*rl, "sql", str(shards), EXAMPLES["stage_time"], "--csv"]),
        ("sql shards: arrivals (README)", [*rl, "sql", str(shards), EXAMPLES["arrivals"], "--csv"]),
        ("sql shards: full scan", [*rl, "sql", str(shards),
                                   "SELECT source, count(*), sum(dur_ns) FROM spans GROUP BY ALL", "--csv"]),
        ("sql .json.gz via its manifest's shards", [*rl, "sql", str(trace), COUNT, "--csv"]),
        ("sql .json.gz without shards (converted)", [*rl, "sql", str(bare), COUNT, "--csv"]),
    ]  # fmt: skip
    base = None
    print(f"{'case':42} {'CPU s':>8} {'wall s':>8} {'peak MB':>8}  vs baseline (CPU, peak)")
    for name, cmd in cases:
        cpu, wall, rss = measure(cmd)
        base = base or (cpu, rss)
        print(
            f"{name:42} {cpu:8.1f} {wall:8.1f} {rss / 1e6:8.0f}  {cpu / base[0]:.2f}x, {rss / base[1]:.2f}x"
        )
    out = subprocess.run(
        [sys.executable, "-c", ANSWERS_ONLY, str(trace)], capture_output=True, text=True, check=True
    )
    spans, total, answers = out.stdout.split()
    print(f"on {spans} stage spans: build_summary {float(total):.3f} CPU s, of which the answers "
          f"{float(answers):.3f} s")  # fmt: skip


if __name__ == "__main__":
    main()
