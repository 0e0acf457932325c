"""What ``--shards`` costs a merge: the same run merged to ``.json.gz`` with and without span shards.

    python benchmarks/shards_bench.py [--run DIR | --events 2_000_000] [--repeat 3] [--workers 2]

Generates a run with ``benchmarks/gen_run.py`` unless ``--run`` names one, then merges it A/B/A/B…
(``--repeat`` times each, alternating, each in a fresh process: ``merge_bench``'s child, which samples
the process tree's peak RSS and how busy the machine was) and prints per merge: wall and CPU seconds
(parent + workers), peak RSS, and for the shards their rows and size on disk. The summary gives the
medians, the ratio with/without (CPU and wall), the extra CPU per shard row and bytes per row, and the
shards' size against the ``.json.gz``. The README's shards cost figures come from this script.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from merge_bench import _child, generated_run

SHARDS_CHILD = """
import json, resource, sys, time
from rl_trace_observer.merge.pipeline import MergeOptions, merge
run, out, workers, shards = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] or None
t0 = time.perf_counter(); c0 = time.process_time()
res = merge([run], out, MergeOptions(workers=workers, shards=shards))
kids = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall_s": time.perf_counter() - t0, "exit": res.exit_code,
                  "cpu_s": time.process_time() - c0 + kids.ru_utime + kids.ru_stime,
                  "events": res.manifest["counts"]["events_kept"], "size": res.manifest["output"]["size"],
                  "shards": res.manifest.get("shards")}))
"""


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _merge(run: Path, tmp: Path, workers: int, shards: bool) -> dict[str, Any]:
    out, sdir = tmp / "out.json.gz", tmp / "shards"
    r = _child(SHARDS_CHILD, str(run), str(out), str(workers), str(sdir) if shards else "")
    if r["exit"] not in (0, 1):  # 1: problems named (a generated run has none it cannot merge)
        raise SystemExit(f"merge failed: {r}")
    r["shard_bytes"] = _tree_bytes(sdir) if shards else 0
    r["rows"] = (r["shards"] or {}).get("rows", 0) if shards else 0
    out.unlink(missing_ok=True)
    shutil.rmtree(sdir, ignore_errors=True)
    return r


def _line(label: str, r: dict[str, Any]) -> str:
    extra = f" {r['rows']:11,d} {r['shard_bytes'] / 1e6:8.1f}" if r["rows"] else f" {'':>11s} {'':>8s}"
    load = f"{r['load'][0]:5.1f}/{r['load'][1]:<5.1f} {r['idle'] * 100:4.0f}%"
    return (
        f"{label:9s} {r['events']:11,d} {r['wall_s']:7.2f} {r['cpu_s']:7.2f} {r['tree_rss'] / 2**20:7.0f}MB"
        f" {(r['size'] or 0) / 1e6:8.1f}{extra}  {load}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, help="an existing run directory (else one is generated)")
    ap.add_argument("--events", type=lambda s: int(s.replace("_", "")), default=2_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="shards-bench-"))
    try:
        run = generated_run(args.run, tmp, args.events)
        rows: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
        print(
            f"\n{'merge':9s} {'events':>11s} {'wall s':>7s} {'cpu s':>7s} {'RSS':>9s} {'json.gz MB':>8s} "
            f"{'shard rows':>11s} {'shard MB':>8s}  {'load b/a':>11s} {'idle':>5s}"
        )
        for _ in range(args.repeat):
            for shards in (False, True):  # alternate: the machine's drift hits both alike
                r = _merge(run, tmp, args.workers, shards)
                rows[shards].append(r)
                print(_line("--shards" if shards else "plain", r), flush=True)
        med = {
            k: {m: statistics.median(r[m] for r in v) for m in ("wall_s", "cpu_s")} for k, v in rows.items()
        }
        with_, without = med[True], med[False]
        n_rows = rows[True][0]["rows"]
        size = statistics.median(r["size"] or 0 for r in rows[False])
        shard_bytes = statistics.median(r["shard_bytes"] for r in rows[True])
        print(
            f"\nmedians of {args.repeat}: CPU {without['cpu_s']:.2f} -> {with_['cpu_s']:.2f} s "
            f"({with_['cpu_s'] / without['cpu_s']:.2f}x), wall {without['wall_s']:.2f} -> "
            f"{with_['wall_s']:.2f} s ({with_['wall_s'] / without['wall_s']:.2f}x)"
        )
        print(
            f"  shards: {n_rows:,} rows, +{(with_['cpu_s'] - without['cpu_s']) / max(n_rows, 1) * 1e6:.2f} "
            f"µs CPU per row, {shard_bytes / max(n_rows, 1):.1f} bytes per row, {shard_bytes / 1e6:.1f} MB = "
            f"{shard_bytes / size:.2f}x the {size / 1e6:.1f} MB .json.gz"
        )
        print("  load: 1-minute load average before/after each merge; idle: CPU time the machine left idle")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
