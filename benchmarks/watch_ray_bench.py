"""``rl-trace watch --ray`` beside the local watch, on the same generated run, in the same invocation.

    python benchmarks/watch_ray_bench.py WORK [--steps 4] [--spans 5000]

A local Ray cluster of two nodes (``tests/ray_cluster.py``), each with its own directory
(``WORK/run/disk-a``, ``disk-b``: a per-node override, as a node-local disk) written step by step by
the real capture layer (``tests/corpus/live_run.py``, plus ``--spans`` extra spans per trainer
process and step). After each step both watches look once (settle 0; which one looks first
alternates): the local watch over ``WORK/run`` (both directories), the Ray watch over the two nodes.
Printed per step: each one's step-to-answer time (the look that answers it: read, merge, report),
the bytes the step added on the nodes, the bytes that reached the driver for the Ray watch's step
(the merge's pieces and shards, ``cluster.bytes_to_driver``) and for its look (the follow tasks'
facts). Both watches use ``--pad 0.05`` (the generated steps are 200 ms apart). The machine may be
shared: compare the ratios.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAD_S = 0.05  # the generated steps are 200 ms apart: the default 2 s pad would merge every earlier step
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("work", type=Path)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--spans", type=int, default=5000, help="extra spans per trainer process and step")
    args = ap.parse_args()
    os.environ["RAY_AUTH_MODE"] = "disabled"
    from tests.corpus.live_run import MS, LiveRun
    from tests.ray_cluster import local_ray_cluster

    from rl_trace_observer.analysis.live.options import WatchOptions
    from rl_trace_observer.analysis.live.ray_watch import NodesOptions, RayWatch
    from rl_trace_observer.analysis.live.watch import Watch
    from rl_trace_observer.cluster.merge import ClusterOptions, ray_merge

    shutil.rmtree(args.work, ignore_errors=True)
    base_ns = time.time_ns() - 3600 * 10**9
    runs = {
        "a": LiveRun(args.work / "run" / "disk-a", host="host-a", base_ns=base_ns),
        "b": LiveRun(args.work / "run" / "disk-b", host="host-b", base_ns=base_ns + MS),
    }
    dirs = {"node_a": str(runs["a"].folder), "node_b": str(runs["b"].folder)}
    cluster = ClusterOptions(node_output_dirs=dirs, node_workers=1, list_timeout_s=60)

    def disk() -> int:
        return sum(p.stat().st_size for p in (args.work / "run").rglob("*") if p.is_file())

    rows = []
    with local_ray_cluster(("node_a", "node_b"), "rwb"):
        local = Watch(WatchOptions(args.work / "run", args.work / "w-local", settle_s=0, pad_s=PAD_S))
        opts = WatchOptions(
            Path("disks"),
            args.work / "w-ray",
            settle_s=0,
            pad_s=PAD_S,
            merge=lambda o, m: ray_merge(o, m, cluster),
        )
        remote = RayWatch(opts, nodes_opts=NodesOptions(node_output_dirs=dirs))
        try:
            for step in range(1, args.steps + 1):
                before = disk()
                for name, run in runs.items():
                    t0 = run.step_window(step)[0]
                    for pid in (7001, 7002):
                        rec = run.recorders[pid]
                        for i in range(args.spans):
                            at = t0 + 61 * MS + (i * 8 * MS) // max(args.spans, 1)
                            rec.span("kernel_launch", at, at + 1000, lane=run.lanes[pid])
                    run.step(step, finish=name == "a")
                added = disk() - before
                took = {}
                follow0 = remote.follow_bytes
                order = [("local", local), ("ray", remote)]
                for label, w in order if step % 2 else order[::-1]:
                    t = time.monotonic()
                    assert w.look() == [step], label
                    took[label] = time.monotonic() - t
                rec = remote.steps[step]
                assert rec["events"] == local.steps[step]["events"], (
                    rec["events"],
                    local.steps[step]["events"],
                )
                rows.append(
                    (step, took["local"], took["ray"], added, rec["cluster"]["bytes_to_driver"],
                     remote.follow_bytes - follow0, rec["events"])
                )  # fmt: skip
        finally:
            for run in runs.values():
                run.close()
            remote.close()
    print("step  local_s  ray_s  ratio  bytes_added_on_nodes  ray_bytes_to_driver  follow_bytes  events")
    for s, lo, ra, added, to_driver, follow, events in rows:
        cells = f"{s:>4}  {lo:7.2f}  {ra:5.2f}  {ra / lo:5.2f}  {added:>20}  {to_driver:>19}"
        print(f"{cells}  {follow:>12}  {events}")


if __name__ == "__main__":
    main()
