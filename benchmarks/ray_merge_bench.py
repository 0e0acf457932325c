"""``rl-trace merge --ray`` against collect-then-merge, on a local Ray cluster of N nodes (issue 15).

    python benchmarks/ray_merge_bench.py WORK [--events 10_000_000] [--nodes 4] [--format json.gz]
                                              [--node-workers 1] [--shards] [--keep]

What it does, in one run:

1. generates the run (``gen_run.py``, one host per node: ``WORK/run/node-a`` …) unless it is there;
2. starts a ``ray.cluster_utils.Cluster`` of ``--nodes`` nodes, each told its node-local directory
   through a custom resource (``--node-dir``, as a real cluster's per-node disk);
3. the baseline: ``rl-trace collect`` into ``WORK/dest`` (every raw byte through the driver), then
   ``rl-trace merge`` of the collected directory on this machine (2 worker processes);
4. ``rl-trace merge --ray`` of the same nodes (only compressed pieces, and shards with ``--shards``,
   come back);
5. prints: bytes through the driver (raw vs pieces), wall and CPU seconds of both (CPU: every process
   of the cluster and the driver, sampled), peak memory per node task, the sha256 of both outputs, and
   a projection for 64 nodes from the measured per-node throughput (assumptions stated).

CPU seconds are summed over the driver and all its descendant processes (the local cluster's raylets
and workers are its descendants), sampled every 0.2 s: a process that ends between samples loses at
most its last 0.2 s. The machine may be shared: compare the two ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
GB = 1e9


class CpuMeter:
    """CPU seconds of this process and every descendant, sampled in the background."""

    def __init__(self, period_s: float = 0.2) -> None:
        self.period = period_s
        self.seen: dict[int, tuple[float, float]] = {}  # pid -> (create_time, cpu seconds)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        me = psutil.Process()
        for p in [me, *me.children(recursive=True)]:
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    self.seen[p.pid] = (p.create_time(), t.user + t.system)
            except psutil.Error:
                continue

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.period)

    def total(self) -> float:
        self._sample()
        return sum(cpu for _, cpu in self.seen.values())

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def generate(run: Path, events: int, nodes: int) -> None:
    if run.is_dir() and sum(1 for _ in run.iterdir()) == nodes:
        print(f"reusing {run}")
        return
    shutil.rmtree(run, ignore_errors=True)
    cmd = [sys.executable, str(HERE / "gen_run.py"), str(run), "--events", str(events), "--hosts", str(nodes)]
    subprocess.run(cmd, check=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("work", type=Path)
    ap.add_argument("--events", type=lambda s: int(s.replace("_", "")), default=10_000_000)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--format", default="json.gz", choices=["json.gz", "pftrace.gz", "json", "pftrace"])
    ap.add_argument("--node-workers", type=int, default=1, help="worker processes per node task")
    ap.add_argument(
        "--shards", action="store_true", help="both merges also write span shards (they travel too)"
    )
    ap.add_argument("--keep", action="store_true", help="keep the outputs")
    args = ap.parse_args(argv)

    work: Path = args.work.resolve()
    run = work / "run"
    generate(run, args.events, args.nodes)
    names = [f"node_{chr(ord('a') + i)}" for i in range(args.nodes)]
    dirs = {name: str(run / f"node-{name[-1]}") for name in names}
    raw = tree_bytes(run)

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray_tmp = tempfile.mkdtemp(prefix="rmb", dir="/tmp")
    os.environ["RAY_TMPDIR"] = ray_tmp
    import ray
    from ray.cluster_utils import Cluster

    from rl_trace_observer.cluster.merge import ClusterOptions, ray_merge
    from rl_trace_observer.integrations.ray.collect import collect
    from rl_trace_observer.merge.options import MergeOptions
    from rl_trace_observer.merge.pipeline import merge

    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(work / "dest", ignore_errors=True)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "resources": {names[0]: 1}, "include_dashboard": False},
    )
    meter = CpuMeter()
    try:
        for name in names[1:]:
            cluster.add_node(num_cpus=1, resources={name: 1}, include_dashboard=False)
        ray.init(address=cluster.address, log_to_driver=False)
        shards = MergeOptions(shards=str(out / "shards")) if args.shards else MergeOptions()

        cpu0, t0 = meter.total(), time.monotonic()
        report = collect(str(work / "dest"), node_output_dirs=dirs, progress=False)
        t_collect = time.monotonic() - t0
        base_opts = MergeOptions(shards=str(out / "single-shards")) if args.shards else MergeOptions()
        single = merge([str(report.run_dir)], str(out / f"single.{args.format}"), base_opts)
        t_base, cpu_base = time.monotonic() - t0, meter.total() - cpu0
        copied = report.bytes_copied

        cpu0, t0 = meter.total(), time.monotonic()
        res = ray_merge(
            str(out / f"ray.{args.format}"),
            shards,
            ClusterOptions(node_output_dirs=dirs, node_workers=args.node_workers),
        )
        t_ray, cpu_ray = time.monotonic() - t0, meter.total() - cpu0
    finally:
        meter.close()
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)

    _print(args, raw, copied, t_collect, t_base, cpu_base, single, t_ray, cpu_ray, res, out)
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(work / "dest", ignore_errors=True)
    return 0 if res.exit_code == 0 else 1


def _print(
    args: Any, raw: int, copied: int, t_collect: float, t_base: float, cpu_base: float, single: Any,
    t_ray: float, cpu_ray: float, res: Any, out: Path,
) -> None:  # fmt: skip
    cluster = res.manifest["cluster"]
    events = res.manifest["counts"]["events_kept"]
    to_driver = cluster["bytes_to_driver"]
    same = sha256(Path(res.output)) == sha256(Path(single.output))
    print(f"\n{args.nodes} nodes, {events / 1e6:.2f} M events kept, raw {raw / GB:.2f} GB on the nodes")
    print(f"{'':34s} {'wall s':>8s} {'CPU s':>8s} {'to driver':>12s}")
    print(f"{'collect + merge (baseline)':34s} {t_base:8.1f} {cpu_base:8.1f} {copied / 1e6:9.1f} MB")
    print(f"{'  of which collect':34s} {t_collect:8.1f}")
    print(f"{'merge --ray':34s} {t_ray:8.1f} {cpu_ray:8.1f} {to_driver / 1e6:9.1f} MB")
    print(
        f"  of which: pieces {cluster['bytes_pieces'] / 1e6:.1f} MB (the output is "
        f"{Path(res.output).stat().st_size / 1e6:.1f} MB), shards {cluster['bytes_shards'] / 1e6:.1f} MB, "
        f"plans and results {(to_driver - cluster['bytes_pieces'] - cluster['bytes_shards']) / 1e6:.1f} MB"
    )
    print(f"bytes through the driver: {copied / max(to_driver, 1):.1f}x fewer than collect (target >= 10x)")
    print(f"wall time: merge --ray / collect+merge = {t_ray / t_base:.2f} (target <= 1)")
    print(f"same {args.format} as the single-machine merge of the collected files (sha256): {same}")
    if res.manifest.get("shards"):
        sh = res.manifest["shards"]
        print(f"span shards: {sh['rows']} rows, {sh['bytes'] / 1e6:.1f} MB")
    print("\nper node task: seconds, events/s, peak memory (task process; its largest worker process)")
    per_node_rates = []
    for n in cluster["nodes"]:
        mem = n.get("memory") or {}
        peak = max(mem.get("hwm") or 0, mem.get("anon_peak") or 0)
        share = n["raw_bytes"] / max(raw, 1)
        node_events = events * share
        rate = node_events / n["seconds"] if n["seconds"] else 0.0
        per_node_rates.append(rate)
        print(
            f"  {n['label']:18s} {n['status']:6s} {n['seconds']:7.1f} s  ~{rate / 1e6:.2f} M events/s  "
            f"peak {peak / 1e6:6.0f} MB; worker {(mem.get('workers_max_rss') or 0) / 1e6:6.0f} MB"
        )
    _projection(args, events, raw, to_driver, per_node_rates, t_ray, cluster, single)


def _projection(
    args: Any,
    events: int,
    raw: int,
    to_driver: int,
    rates: list[float],
    t_ray: float,
    cluster: Any,
    single: Any,
) -> None:
    """64 nodes, each holding what one node held here, on a 10 Gb/s (1.25 GB/s) driver link."""
    if not rates:
        return
    link = 1.25e9
    nodes = 64
    per_node_events = events / args.nodes
    node_s = per_node_events / (sum(rates) / len(rates))
    driver_s = to_driver / args.nodes * nodes / link  # pieces arrive while nodes work; bounded by the link
    single_rate = events / max(single.manifest.get("elapsed_s") or 1e-9, 1e-9)
    collect_s = raw / args.nodes * nodes / link
    merge_s = per_node_events * nodes / single_rate
    print(
        f"\nprojection, {nodes} nodes x {per_node_events / 1e6:.1f} M events each, 10 Gb/s to the driver, "
        "nodes as fast as here:"
    )
    print(
        f"  merge --ray     ~{max(node_s, driver_s):7.0f} s  (node conversion {node_s:.0f} s in parallel; "
        f"pieces {to_driver / args.nodes * nodes / GB:.1f} GB through the driver: {driver_s:.0f} s)"
    )
    print(
        f"  collect + merge ~{collect_s + merge_s:7.0f} s  (raw {raw / args.nodes * nodes / GB:.0f} GB: "
        f"{collect_s:.0f} s; one machine at {single_rate / 1e6:.2f} M events/s: {merge_s:.0f} s)"
    )


if __name__ == "__main__":
    sys.exit(main())
