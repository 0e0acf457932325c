"""``rl-trace collect`` on a real 3-node Ray cluster on this machine.

Each node gets its own output directory through a per-node override keyed by a custom resource
(``node_a``/``node_b``/``node_c``), standing in for a node-local disk. One cluster serves the module;
every test uses its own directories and destination, so tests do not share files. Ray's temp dir is
private to the module (``RAY_TMPDIR``): a ``Cluster`` writes ``ray_current_cluster`` there, and in the
default ``/tmp/ray`` that file would make other processes' plain ``ray.init()`` join this cluster.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import psutil
import pytest

from rl_trace_observer import config as config_mod
from rl_trace_observer.capture import Recorder
from rl_trace_observer.cli.main import main as cli_main
from rl_trace_observer.integrations.ray.collect import CollectReport, collect, collect_if_configured
from rl_trace_observer.integrations.ray.collect_dest import INDEX_NAME, REPORT_NAME

from ..conftest import ROOT, clean_env, need
from ..ray_cluster import local_ray_cluster

ray = need("ray")

pytestmark = pytest.mark.slow
NAMES = ("node_a", "node_b", "node_c")
RUN = "run-collect"
MiB = 1024 * 1024


@dataclass
class Harness:
    cluster: Any
    nodes: dict[str, Any]
    ray_tmp: str

    def restart(self, name: str) -> None:
        self.nodes[name] = self.cluster.add_node(num_cpus=1, resources={name: 1}, include_dashboard=False)


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    with local_ray_cluster(NAMES, "rtc") as (cluster, nodes, ray_tmp):
        yield Harness(cluster, nodes, ray_tmp)


def _node_dirs(
    base: Path, extra: dict[str, dict[str, bytes]] | None = None, traces: bool = True
) -> dict[str, str]:
    """Per node: two processes' real event logs and records, a registered trace, and ``extra`` files.

    The "traces" are random bytes: collection moves bytes, it does not parse them."""
    dirs = {}
    for i, name in enumerate(NAMES):
        out = base / name
        out.mkdir(parents=True)
        for local in range(2):
            rank = 2 * i + local
            rec = Recorder(
                config_mod.Config(output_dir=out, run_id=RUN, role="actor"), host=f"h{i}", pid=100 + rank
            )
            rec.update_identity(rank=rank, world_size=6)
            rec.span("actor_update", 1_795_000_000 * 10**9 + rank, 1_795_000_001 * 10**9, lane=f"rank_{rank}")
            if traces:
                trace = out / "profile" / f"actor_step1_rank{rank}.json"
                trace.parent.mkdir(exist_ok=True)
                trace.write_bytes(os.urandom(100_000 + rank))
                rec.register_artifact(trace, "torch", step=1, role="actor", rank=rank)
            rec.close()
        for rel, data in (extra or {}).get(name, {}).items():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (out / rel).write_bytes(data)
        dirs[name] = str(out)
    return dirs


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


def _sha(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(MiB):
            digest.update(block)
    return digest.hexdigest()


def _labels(report: CollectReport, dirs: dict[str, str]) -> dict[str, str]:
    """node_a/b/c -> label, matched through the output directory each node reported."""
    by_dir = {n.output_dir: n.label for n in report.nodes if n.output_dir}
    return {name: by_dir[os.path.realpath(d)] for name, d in dirs.items()}


def _run(dest: str | Path, dirs: dict[str, str], **kw: Any) -> CollectReport:
    return collect(str(dest), node_output_dirs=dirs, progress=False, **kw)


# ------------------------------------------------------------------------------------ tests
def test_every_node_lands_under_its_own_label_and_reruns_skip_verified(
    harness: Harness, tmp_path: Path
) -> None:
    dirs = _node_dirs(tmp_path / "nodes")
    dest = tmp_path / "dest"
    report = _run(dest, dirs)
    assert report.ok, report.problems()
    assert report.run_id == RUN and report.coverage == []
    labels = _labels(report, dirs)
    assert len(set(labels.values())) == 3
    for name, label in labels.items():
        landed = dest / RUN / label
        assert _tree(landed) == _tree(Path(dirs[name]))  # byte-identical, same relative paths
        index = json.loads((landed / INDEX_NAME).read_text())["files"]
        assert {rel: e["sha256"] for rel, e in index.items()} == {
            rel: hashlib.sha256(data).hexdigest() for rel, data in _tree(landed).items()
        }
        assert not (landed / ".rl-trace-partial").exists()
    saved = json.loads((dest / RUN / REPORT_NAME).read_text())
    assert saved["ok"] and {n["label"] for n in saved["nodes"]} == set(labels.values())

    again = _run(dest, dirs)
    assert again.ok and again.bytes_copied == 0
    assert all(n.files_skipped == n.files_found == 6 for n in again.nodes)

    changed = Path(dirs["node_b"]) / "profile" / "actor_step1_rank2.json"
    changed.write_bytes(os.urandom(5000))
    third = _run(dest, dirs)
    node_b = third.node(labels["node_b"])
    assert (node_b.files_copied, node_b.files_skipped) == (1, 5)
    assert (dest / RUN / labels["node_b"] / "profile" / changed.name).read_bytes() == changed.read_bytes()


def test_memory_destination_and_summary_table(harness: Harness, tmp_path: Path) -> None:
    from rich.console import Console

    dirs = _node_dirs(tmp_path / "nodes")
    report = _run("memory://collect-ray/dest", dirs)
    assert report.ok, report.problems()
    fs = fsspec.filesystem("memory")
    try:
        for name, label in _labels(report, dirs).items():
            for rel, data in _tree(Path(dirs[name])).items():
                assert fs.cat_file(f"/collect-ray/dest/{RUN}/{label}/{rel}") == data
        console = Console(record=True, width=200)
        report.render(console)
        text = console.export_text()
        assert report.run_dir == f"memory://collect-ray/dest/{RUN}"
        assert all(label in text for label in _labels(report, dirs).values()) and "complete" in text
    finally:
        fs.rm("/collect-ray", recursive=True)


def test_shared_directory_is_copied_once_and_verified_elsewhere(harness: Harness, tmp_path: Path) -> None:
    shared = _node_dirs(tmp_path / "nodes")["node_a"]
    dest = tmp_path / "dest"
    report = collect(str(dest), output_dir=shared, progress=False)
    statuses = sorted(n.status for n in report.nodes)
    assert statuses == ["complete", "shared", "shared"], report.problems()
    (leader,) = [n for n in report.nodes if n.status == "complete"]
    assert leader.label.startswith("shared-") and leader.files_copied == 6
    assert all(
        n.shared_with == leader.label and n.files_verified == 6 for n in report.nodes if n is not leader
    )
    assert [p.name for p in (dest / RUN).iterdir() if not p.name.startswith(".")] == [leader.label]
    assert _tree(dest / RUN / leader.label) == _tree(Path(shared))
    assert not list(Path(shared).glob(".rl-trace-collect-probe-*"))  # markers cleaned up
    # ranks 2..5 live on the other nodes' disks, which this run did not read: reported, not guessed
    assert report.coverage and "rank(s) 2, 3, 4, 5 of world size 6" in report.coverage[0]


def test_escaping_symlinks_and_special_files_are_refused(harness: Harness, tmp_path: Path) -> None:
    dirs = _node_dirs(tmp_path / "nodes")
    secret = tmp_path / "secret.txt"
    secret.write_text("do not copy")
    node_c = Path(dirs["node_c"])
    (node_c / "profile" / "escape.json").symlink_to(secret)
    (node_c / "escape-dir").symlink_to(tmp_path)
    os.mkfifo(node_c / "fifo.json")
    (node_c / "inside.json").symlink_to(node_c / "profile" / "actor_step1_rank4.json")
    dest = tmp_path / "dest"
    report = _run(dest, dirs)
    label = _labels(report, dirs)["node_c"]
    refused = dict(report.node(label).refused)
    assert set(refused) == {"profile/escape.json", "escape-dir", "fifo.json"}
    assert not report.ok and all("refused" in line for line in report.problems())
    landed = dest / RUN / label
    assert not (landed / "profile" / "escape.json").exists() and not (landed / "fifo.json").exists()
    assert (landed / "inside.json").read_bytes() == (
        node_c / "profile" / "actor_step1_rank4.json"
    ).read_bytes()
    assert b"do not copy" not in b"".join(_tree(dest).values())


def test_file_changed_during_copy_is_detected_and_retried(harness: Harness, tmp_path: Path) -> None:
    dirs = _node_dirs(tmp_path / "nodes", {"node_b": {"big.bin": b"a" * (2 * MiB)}})
    big = Path(dirs["node_b"]) / "big.bin"
    new = os.urandom(2 * MiB)

    def rewrite(label: str, rel: str, attempt: int) -> None:
        if rel == "big.bin" and attempt == 0:  # the node has read at most 2 chunks of 64 KiB so far
            with open(big, "r+b") as fh:
                fh.write(new)

    dest = tmp_path / "dest"
    report = _run(dest, dirs, chunk_size=64 * 1024, in_flight=1, on_file_begin=rewrite)
    label = _labels(report, dirs)["node_b"]
    assert report.ok, report.problems()
    assert report.node(label).retries == 1
    assert (dest / RUN / label / "big.bin").read_bytes() == new
    index = json.loads((dest / RUN / label / INDEX_NAME).read_text())["files"]
    assert index["big.bin"]["sha256"] == hashlib.sha256(new).hexdigest()


def test_200_mb_file_is_streamed_with_bounded_worker_memory(harness: Harness, tmp_path: Path) -> None:
    dirs = _node_dirs(tmp_path / "nodes")
    big = Path(dirs["node_c"]) / "rollout" / "proton.chrome_trace"
    big.parent.mkdir()
    try:
        with open(big, "wb") as fh:
            block = os.urandom(MiB)
            for i in range(200):
                fh.write(i.to_bytes(8, "little") + block[8:])
        dest = tmp_path / "dest"
        report = _run(dest, dirs)
        label = _labels(report, dirs)["node_c"]
        assert report.ok, report.problems()
        mem = report.node(label).worker_memory
        growth = mem["anon_peak"] - mem["anon_start"]
        # 8 MiB chunks, a few in flight: the worker's private memory must not follow the 200 MB file
        assert growth < 48 * MiB, mem
        assert _sha(dest / RUN / label / "rollout" / big.name) == _sha(big)
    finally:
        big.unlink(missing_ok=True)
        shutil.rmtree(tmp_path / "dest", ignore_errors=True)


def test_cli_collects_and_points_to_merge(
    harness: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dirs = _node_dirs(tmp_path / "nodes")
    dest = tmp_path / "dest"
    args = ["collect", "--to", str(dest), *[a for k, d in dirs.items() for a in ("--node-dir", f"{k}={d}")]]
    assert cli_main(args) == 0
    out, err = capsys.readouterr()
    assert f"next: rl-trace merge {dest / RUN}" in out and "complete" in out and "warning" not in err
    assert cli_main(["collect", "--to", str(dest), "--node-dir", "no-equals-sign"]) == 2
    os.symlink("/etc/hostname", Path(dirs["node_a"]) / "escape")
    assert cli_main([*args, "--json"]) == 0  # best effort: refused files are warnings...
    out, err = capsys.readouterr()
    assert json.loads(out)["ok"] is False and "warning: " in err and "refused escape" in err
    assert cli_main([*args, "--strict"]) == 1  # ...unless --strict


def test_cli_joins_a_running_cluster_by_address(harness: Harness, tmp_path: Path) -> None:
    dirs = _node_dirs(tmp_path / "nodes")
    dest = tmp_path / "dest"
    node_args = [a for k, d in dirs.items() for a in ("--node-dir", f"{k}={d}")]
    cmd = [sys.executable, "-m", "rl_trace_observer.cli.main", "collect", "--to", str(dest)]
    env = clean_env(RAY_TMPDIR=harness.ray_tmp)
    proc = subprocess.run(
        [*cmd, "--address", harness.cluster.address, *node_args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert len([p for p in (dest / RUN).iterdir() if p.is_dir()]) == 3


def test_registered_but_absent_files_and_profiled_steps_are_reported(
    harness: Harness, tmp_path: Path
) -> None:
    dirs = _node_dirs(tmp_path / "nodes")
    (Path(dirs["node_c"]) / "profile" / "actor_step1_rank5.json").unlink()
    report = _run(tmp_path / "dest", dirs, profiled_steps=[1, 2])
    node_c = report.node(_labels(report, dirs)["node_c"])
    assert node_c.missing == [
        (
            "profile/actor_step1_rank5.json",
            "torch artifact registered by rl-trace-process-h2-pid-105.json (step 1) "
            "is not in the output directory",
        )
    ]
    assert node_c.status == "complete" and node_c.files_copied == 5  # what exists still landed
    assert report.coverage == [f"role actor rank {r}: no artifact for profiled step(s) 2" for r in range(6)]
    assert not report.ok


def test_node_concurrency_is_bounded(harness: Harness, tmp_path: Path) -> None:
    dirs = _node_dirs(tmp_path / "nodes")
    seen: list[str] = []
    report = _run(
        tmp_path / "dest", dirs, max_nodes=1, on_file_begin=lambda label, rel, n: seen.append(label)
    )
    assert report.ok and len(seen) == 18
    switches = [label for i, label in enumerate(seen) if i == 0 or seen[i - 1] != label]
    assert len(switches) == 3  # one node after the other, never interleaved


def test_trainer_end_helper_collects_only_when_configured_and_never_raises(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    dirs = _node_dirs(tmp_path / "nodes")
    monkeypatch.delenv("RL_TRACE_COLLECT_TO", raising=False)
    monkeypatch.delenv("RL_TRACE_RUN_ID", raising=False)
    assert collect_if_configured(node_output_dirs=dirs) is None
    monkeypatch.setenv("RL_TRACE_COLLECT_TO", str(tmp_path / "dest"))
    report = collect_if_configured(node_output_dirs=dirs)
    assert report is not None and report.ok and (tmp_path / "dest" / RUN).is_dir()
    other = Recorder(config_mod.Config(output_dir=Path(dirs["node_a"]), run_id="other-run"), host="x", pid=9)
    other.close()
    with caplog.at_level(logging.WARNING, logger="rl_trace_observer"):
        assert collect_if_configured(node_output_dirs=dirs) is None  # two runs, none chosen
    assert "several runs" in caplog.text and "pass --run" in caplog.text


def test_collected_run_merges_directly(
    harness: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dirs = _node_dirs(tmp_path / "nodes", traces=False)
    report = _run("memory://collect-merge/dest", dirs)
    try:
        assert report.ok, report.problems()
        merged = tmp_path / "merged.json"
        assert cli_main(["merge", report.run_dir, "-o", str(merged), "--workers", "0"]) == 0
        events = json.loads(merged.read_text())["traceEvents"]
        spans = [e for e in events if e.get("ph") == "X" and e.get("name") == "actor_update"]
        assert len(spans) == 6 and len({e["pid"] for e in spans}) == 6  # 3 nodes x 2 processes
    finally:
        fsspec.filesystem("memory").rm("/collect-merge", recursive=True)


def _streaming_workers(ray_tmp: str) -> list[psutil.Process]:
    """This module's cluster's workers now running ``stream_files`` (Ray titles them ``ray::<task>``)."""
    out = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        try:
            if cmd and cmd[0].startswith("ray::stream_files") and proc.environ().get("RAY_TMPDIR") == ray_tmp:
                out.append(proc)
        except psutil.Error:
            continue
    return out


def test_a_hung_node_is_reported_stalled_and_leaves_no_partial_file(harness: Harness, tmp_path: Path) -> None:
    dirs = _node_dirs(tmp_path / "nodes", {"node_a": {"zz-big.bin": os.urandom(4 * MiB)}})
    stopped: list[psutil.Process] = []

    def freeze(label: str, rel: str, attempt: int) -> None:
        if rel == "zz-big.bin" and not stopped:  # mid-file: a disk or NFS hang on that node
            stopped.extend(_streaming_workers(harness.ray_tmp))
            for proc in stopped:
                proc.send_signal(signal.SIGSTOP)

    # The silence limit must exceed what a healthy node needs here and now: timed on this very run.
    healthy = _run(tmp_path / "healthy", dirs, chunk_size=64 * 1024, in_flight=1, max_nodes=1)
    assert healthy.ok, healthy.problems()
    stall_s = max(2.0, round(3 * max(n.seconds for n in healthy.nodes), 1))
    dest = tmp_path / "dest"
    try:
        report = _run(
            dest,
            dirs,
            chunk_size=64 * 1024,
            in_flight=1,
            stall_timeout_s=stall_s,
            max_nodes=1,
            on_file_begin=freeze,
        )
    finally:
        for proc in stopped:
            proc.send_signal(signal.SIGCONT)
    assert len(stopped) == 1
    hung = report.node(_labels(report, dirs)["node_a"])
    assert hung.status == "lost" and hung.notes[0].startswith(f"no data from the node for {stall_s:g} s")
    assert [n.status for n in report.nodes if n is not hung] == ["complete", "complete"]
    assert not list(dest.rglob("*.part")) and not list(dest.rglob("zz-big.bin"))
    again = _run(dest, dirs)
    assert again.ok, again.problems()
    assert again.node(hung.label).files_copied == 1  # only the file that was cut off


def test_node_killed_mid_collection_is_reported_and_a_rerun_completes(
    harness: Harness, tmp_path: Path
) -> None:
    """Runs last in this module: it removes node_b and adds it back (same disk, new node id)."""
    dirs = _node_dirs(tmp_path / "nodes", {"node_b": {"zz-big.bin": os.urandom(4 * MiB)}})
    killed: list[str] = []

    def kill(label: str, rel: str, attempt: int) -> None:
        if rel == "zz-big.bin" and not killed:
            killed.append(label)
            harness.cluster.remove_node(harness.nodes["node_b"])

    dest = tmp_path / "dest"
    report = _run(dest, dirs, chunk_size=64 * 1024, in_flight=1, on_file_begin=kill, stall_timeout_s=600)
    labels = _labels(report, dirs)
    lost = report.node(labels["node_b"])
    assert killed == [labels["node_b"]] and lost.status == "lost" and not report.ok
    # noticed as a death, not by the 600 s silence limit
    assert lost.notes[0].startswith("node lost during collection (")
    assert "re-run when the node is back" in lost.notes[0]
    assert [report.node(labels[n]).status for n in ("node_a", "node_c")] == ["complete", "complete"]
    landed_b = dest / RUN / labels["node_b"]
    assert not (landed_b / "zz-big.bin").exists()  # never a partial file under its final name
    assert not list(landed_b.rglob("*.part")) and lost.files_copied == 6  # smaller files came first

    harness.restart("node_b")
    rerun = _run(dest, dirs)
    assert rerun.ok, rerun.problems()
    back = rerun.node(labels["node_b"])
    assert (back.files_copied, back.files_skipped) == (1, 6)
    assert "restarted" in {n.status for n in rerun.nodes}  # the dead entry: its host is back
    assert _tree(landed_b) == _tree(Path(dirs["node_b"]))
