"""``rl-trace watch --ray`` on a real 2-node Ray cluster on this machine (issue 36, item 1).

Each node has its own output directory (a per-node override keyed by a custom resource stands in for
a node-local disk), written step by step by the real capture layer (:class:`LiveRun`): node ``a``
holds the driver with its ``global_step`` markers, two trainer ranks, two rollout replicas and the
metric sampler on host ``host-a``; node ``b`` the same processes' work on host ``host-b``, without
markers. Each look is one pinned follow task per node; each finished step is merged by the merge's
Ray executor cut to the step's window.

What is proved: every step is answered once, and its figures and shard rows equal what
``merge --ray --shards`` + ``report`` give afterwards, with old lines left unread on the nodes; a
watch stopped and started again (the command line, ``--once``) answers only the new steps and reads
every line exactly once; a node that leaves the cluster is named and the other node's steps are still
answered.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rl_trace_observer.analysis.live.figures import step_figures
from rl_trace_observer.analysis.live.options import WatchOptions
from rl_trace_observer.analysis.live.watch import load_state
from rl_trace_observer.cluster.merge import ClusterOptions, ray_merge
from rl_trace_observer.merge.options import MergeOptions, MergeResult

from ..conftest import ROOT, clean_env, need
from ..corpus.live_run import LiveRun
from ..ray_cluster import local_ray_cluster

ray = need("ray")
need("pyarrow")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
ROW_COLUMNS = ["step", "host", "pid", "role", "lane", "name", "ph", "ts_ns", "dur_ns", "args"]
NODES = ("node_a", "node_b")


@dataclass
class Harness:
    cluster: Any
    nodes: dict[str, Any]


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    with local_ray_cluster(NODES, "rtw") as (cluster, nodes, _):
        yield Harness(cluster, nodes)


class TwoNodes:
    """One run on two nodes' disks: ``a`` writes the step markers, ``b`` only its processes' work."""

    def __init__(self, base: Path) -> None:
        base_ns = time.time_ns() - 3600 * 10**9
        self.a = LiveRun(base / "disk-a", host="host-a", base_ns=base_ns)
        # its work 1 ms later than a's (else its logs would be byte-identical to a's: duplicates)
        self.b = LiveRun(base / "disk-b", host="host-b", base_ns=base_ns + 10**6)
        self.a.add_sampler()
        self.dirs = {"node_a": str(self.a.folder), "node_b": str(self.b.folder)}

    def step(self, step: int, *, finish: bool = True, slow: int = 0) -> None:
        self.b.step(step, finish=False, slow=slow)
        self.a.step(step, finish=finish, slow=slow)

    def close(self) -> None:
        self.a.close()
        self.b.close()

    def lines_on_disk(self) -> int:
        return sum(
            p.read_bytes().count(b"\n") for run in (self.a, self.b) for p in run.folder.rglob("*.jsonl")
        )

    def cluster(self, **kw: Any) -> ClusterOptions:
        return ClusterOptions(node_output_dirs=self.dirs, node_workers=1, list_timeout_s=30, **kw)

    def merge(self, output: str, opts: MergeOptions) -> MergeResult:
        return ray_merge(output, opts, self.cluster())

    def watch(self, out: Path, **kw: Any) -> Any:
        from rl_trace_observer.analysis.live.ray_watch import NodesOptions, RayWatch

        opts = WatchOptions(Path("disks"), out, settle_s=0, merge=self.merge, **kw)
        return RayWatch(opts, nodes_opts=NodesOptions(node_output_dirs=self.dirs, timeout_s=30))


def _plain(x: Any) -> Any:
    return json.loads(json.dumps(x))


def rows(shards: Path, step: int) -> list[tuple[Any, ...]]:
    from rl_trace_observer.merge.shards.dataset import Shards

    table = Shards.open(shards).table(ROW_COLUMNS, steps=[step])
    return sorted(tuple(r[c] for c in ROW_COLUMNS) for r in table.to_pylist())


def assert_equal_to_post_hoc(out: Path, runs: TwoNodes, tmp: Path, steps: list[int]) -> None:
    """``merge --ray --shards`` + ``report`` afterwards: the same figures and shard rows per step."""
    from rl_trace_observer.analysis.report.output import summarize

    shards = tmp / "post-shards"
    res = ray_merge(str(tmp / "post.pftrace"), MergeOptions(shards=str(shards)), runs.cluster())
    assert res.exit_code == 0, res.manifest["problems"]
    summary = summarize(shards)
    state = load_state(out)
    assert sorted(int(s) for s in state["steps"]) == steps
    for step in steps:
        record = json.loads((out / "steps" / f"step-{step}.json").read_text())
        assert record["figures"] == _plain(step_figures(summary, step)), step
        assert record["figures"]["steps"][0]["dur_ns"] > 0
        got = rows(out / record["piece"], step)
        assert got == rows(shards, step), step
        assert {r[1] for r in got} == {"host-a", "host-b"}  # both nodes' processes in every piece


def test_each_step_is_converted_on_the_nodes_and_equals_merge_ray_and_report(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rl_trace_observer.analysis.live import answer, seen

    monkeypatch.setattr(answer, "SKIP_MARGIN_NS", 0)  # the steps are 200 ms apart, not minutes
    monkeypatch.setattr(seen, "RUN_NS", 50 * 10**6)
    runs = TwoNodes(tmp_path)
    out = tmp_path / "watch"
    watch = runs.watch(out, pad_s=0.05)
    latency = []
    try:
        assert watch.look() == []  # nothing written yet
        for step in (1, 2, 3):
            runs.step(step, slow=10 * step)
            t0 = time.monotonic()
            assert watch.look() == [step]  # noticed as it finished, not before, not twice
            latency.append(time.monotonic() - t0)
            assert watch.look() == []
            assert (out / "views" / f"step-{step}.pftrace").stat().st_size > 0
        runs.step(4, finish=False)  # the run stops mid-step
    finally:
        runs.close()
    assert watch.look(final=True) == []
    status = watch.status()
    assert [s["step"] for s in status["steps"]] == [1, 2, 3]
    assert status["unfinished"] is not None and status["errors"] == []
    assert {d["status"] for d in status["nodes"].values()} == {"ok"} and len(status["nodes"]) == 2
    for record in status["steps"]:
        cluster = record["cluster"]
        assert cluster["jobs_missing"] == 0 and set(cluster["nodes"].values()) == {"ok"}, cluster
        assert cluster["bytes_to_driver"] > 0
    read = [
        json.loads((out / "views" / f"step-{s}.pftrace.manifest.json").read_text())["counts"]["events_read"]
        for s in (1, 2, 3)
    ]
    assert read[2] < read[0] * 2, read  # old lines were left unread on the nodes
    assert_equal_to_post_hoc(out, runs, tmp_path, [1, 2, 3])
    print(
        f"watch --ray: per-step answer latency {[round(x, 2) for x in latency]} s; to the driver per step "
        f"{[s['cluster']['bytes_to_driver'] for s in status['steps']]} B (raw on the nodes "
        f"{status['steps'][-1]['cluster']['raw_bytes']} B); the looks' facts {status['follow_bytes']} B"
    )


def test_a_watch_started_again_answers_only_new_steps_and_reads_every_line_once(
    harness: Harness, tmp_path: Path
) -> None:
    runs = TwoNodes(tmp_path)
    out = tmp_path / "watch"
    first = runs.watch(out)
    try:
        runs.step(1)
        runs.step(2)
        assert first.look() == [1, 2]
        shown = {s: first.steps[s]["answered_wall_ns"] for s in (1, 2)}
        runs.step(3)
        runs.step(4, finish=False)
    finally:
        runs.close()
    node_args = [a for k, d in runs.dirs.items() for a in ("--node-dir", f"{k}={d}")]
    cmd = [sys.executable, "-m", "rl_trace_observer.cli.main", "watch", "--ray", *node_args]
    cmd += ["--address", harness.cluster.address, "--out", str(out), "--settle", "0", "--once"]
    again = subprocess.run(cmd, env=clean_env(), cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, again.stderr
    assert "answered steps: 1, 2, 3" in again.stdout
    answered = [int(x.split()[1].rstrip(":")) for x in again.stderr.splitlines() if x.startswith("step ")]
    assert answered == [3]  # a recorded step is never answered twice
    assert "unfinished" in again.stderr
    state = load_state(out)
    assert {s: state["steps"][str(s)]["answered_wall_ns"] for s in (1, 2)} == shown
    lines = sum(node["seen"]["lines"] for node in state["nodes"].values())
    assert lines == runs.lines_on_disk()  # every line read exactly once across the restart
    assert_equal_to_post_hoc(out, runs, tmp_path, [1, 2, 3])


def test_command_line_usage_errors(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "rl_trace_observer.cli.main", "watch"]
    proc = subprocess.run([*base, "--ray"], env=clean_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--out" in proc.stderr
    proc = subprocess.run(
        [*base, "--ray", "/a", "--output-dir", "/b", "--out", str(tmp_path / "w")],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "once" in proc.stderr
    proc = subprocess.run([*base], env=clean_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--ray" in proc.stderr


def test_a_node_that_leaves_is_named_and_the_other_nodes_steps_are_answered(
    harness: Harness, tmp_path: Path
) -> None:
    """Last in the module: node ``b`` is removed (and added back at the end)."""
    runs = TwoNodes(tmp_path)
    out = tmp_path / "watch"
    watch = runs.watch(out)
    try:
        runs.step(1)
        assert watch.look() == [1]
        harness.cluster.remove_node(harness.nodes["node_b"])
        runs.step(2)
        assert watch.look() == [2]  # node a's markers and files: still answered
    finally:
        runs.close()
        harness.nodes["node_b"] = harness.cluster.add_node(
            num_cpus=1, resources={"node_b": 1}, include_dashboard=False
        )
    status = watch.status()
    lost = {label: d for label, d in status["nodes"].items() if d["status"] != "ok"}
    assert len(lost) == 1 and any(f"node {label}" in e for e in status["errors"] for label in lost)
    step2 = watch.steps[2]
    assert step2["problems"] >= 1  # the merge names the dead node too
    assert {r[1] for r in rows(out / step2["piece"], 2)} == {"host-a"}
