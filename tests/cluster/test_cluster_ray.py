"""``rl-trace merge --ray`` on a real 3-node Ray cluster on this machine (issue 15).

Each node has its own output directory (a per-node override keyed by a custom resource stands in for
a node-local disk): ``a`` holds the trainer and actor rank 0 (the clock reference), ``b`` actor rank
1 on a host whose clock runs 25 ms ahead (measured), ``c`` a rollout server and a TokenSpeed rank.
One cluster serves the module; its Ray temp dir is private (see test_collect_ray.py for why).

What is proved: the Ray merge's ``.json.gz`` and ``.pftrace.gz`` are byte-identical to the merge of
the same files collected to one directory; both open in the real Perfetto engine with no import
error and the manifest's counts, host ``h-b`` moved back by its offset; a node lost while converting
is named and a re-run converts only its jobs; the report from the shards equals the one from JSON.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import signal
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import pytest

from rl_trace_observer.cli.main import main as cli_main
from rl_trace_observer.cluster.merge import ClusterOptions, ray_merge
from rl_trace_observer.integrations.ray.collect import collect
from rl_trace_observer.merge.options import MergeOptions
from rl_trace_observer.merge.pipeline import merge

from ..conftest import need
from ..corpus.cluster_run import OFFSET_NS, build_cluster_run
from ..ray_cluster import local_ray_cluster

ray = need("ray")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
NAMES = {"node_a": "a", "node_b": "b", "node_c": "c"}


@dataclass
class Harness:
    cluster: Any
    nodes: dict[str, Any]
    dirs: dict[str, str]  # resource name -> that node's output directory
    truth: dict[str, Any]
    base: Path

    def restart(self, name: str) -> None:
        self.nodes[name] = self.cluster.add_node(num_cpus=1, resources={name: 1}, include_dashboard=False)
        self.cluster.wait_for_nodes()

    def options(self, **kw: Any) -> ClusterOptions:
        return ClusterOptions(node_output_dirs=self.dirs, node_workers=1, list_timeout_s=120, **kw)


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    base = tmp_path_factory.mktemp("cluster")
    run = build_cluster_run(base / "nodes")
    with local_ray_cluster(("node_a", "node_b", "node_c"), "rtm") as (cluster, nodes, _):
        dirs = {k: str(run["dirs"][v]) for k, v in NAMES.items()}
        yield Harness(cluster, nodes, dirs, run["truth"], base)


def _sha(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _gzip_members(path: Path) -> int:
    data, members = path.read_bytes(), 0
    while data:
        dec = zlib.decompressobj(31)
        dec.decompress(data)
        assert dec.eof, "truncated gzip member"
        members += 1
        data = dec.unused_data
    return members


@pytest.fixture(scope="module")
def merged(harness: Harness) -> dict[str, Any]:
    """The Ray merge in both recommended formats (shards with the JSON one), and the reference: the
    same files collected over Ray into one directory and merged on one machine."""
    out = harness.base / "out"
    results = {
        "json.gz": ray_merge(
            str(out / "ray.json.gz"), MergeOptions(shards=str(out / "shards")), harness.options()
        ),
        "pftrace.gz": ray_merge(str(out / "ray.pftrace.gz"), MergeOptions(), harness.options()),
    }
    report = collect(str(harness.base / "dest"), node_output_dirs=harness.dirs, progress=False)
    single = {
        fmt: merge([str(report.run_dir)], str(out / f"single.{fmt}"), MergeOptions()) for fmt in results
    }
    return {"ray": results, "single": single, "out": out}


def test_the_ray_merge_is_byte_identical_to_merging_the_collected_files(merged: dict[str, Any]) -> None:
    for fmt, res in merged["ray"].items():
        single = merged["single"][fmt]
        assert res.exit_code == 0 and single.exit_code == 0, res.manifest["problems"]
        assert _sha(res.output) == _sha(single.output), fmt
        assert _gzip_members(Path(res.output)) == 1  # Perfetto rejects several members
        counts, ref = res.manifest["counts"], single.manifest["counts"]
        assert counts["events_kept"] == ref["events_kept"] > 300
        cluster = res.manifest["cluster"]
        assert (
            cluster["jobs"] > 0
            and cluster["jobs_missing"] == 0
            and {n["status"] for n in cluster["nodes"]} == {"ok"}
        )
        assert (
            cluster["bytes_to_driver"] > 0 and cluster["raw_bytes"] > 0
        )  # the ratio: benchmarks/ray_merge_bench.py
        assert all(n["memory"]["anon_peak"] < 1 << 30 for n in cluster["nodes"])
        assert {p["kind"] for p in res.manifest["problems"]} <= {"unlinked"}  # TokenSpeed has no record
        assert not (merged["out"] / f".{Path(res.output).name}.ray").exists()  # complete: the store is gone


def test_outputs_open_in_perfetto_with_the_manifest_counts_and_the_offset_host_moved_back(
    harness: Harness, merged: dict[str, Any], engine: Any
) -> None:
    sql = (
        "select p.name as process, s.ts from slice s join thread_track tt on s.track_id = tt.id "
        "join thread using (utid) join process p using (upid) where s.name = 'actor_update' "
        "and thread.name like 'RL-Insight%' order by s.ts"
    )
    truth = harness.truth["actor_update"]  # (host, step) -> reference-clock start
    for res in merged["ray"].values():
        base = res.manifest["timeline"]["base_ns"]
        loaded = engine.load(res.output, [sql])
        counts = res.manifest["counts"]
        assert loaded.ok, loaded.summary()
        assert (loaded.slices, loaded.flows, loaded.counters) == (
            counts["slices"], counts["flows"], counts["counter_samples"],
        )  # fmt: skip
        rows = loaded.queries[0].dicts()
        assert len(rows) == 4
        hb = res.manifest["timeline"]["clock"]["hosts"]["h-b"]
        assert hb["applied"] and hb["offset_ns"] == OFFSET_NS
        for row in rows:  # every actor_update at its reference-clock time, h-b's included
            host = row["process"].split(" · ")[0]
            starts = {t for (h, _), t in truth.items() if h == host}
            assert row["ts"] + base in starts, (row, starts)


def test_the_report_from_the_shards_equals_the_report_from_the_json(merged: dict[str, Any]) -> None:
    from rl_trace_observer.analysis.report.output import summarize

    res = merged["ray"]["json.gz"]
    from_json, from_shards = summarize(res.output), summarize(res.manifest["shards"]["dir"])
    for s in (from_json, from_shards):
        for key in ("path", "loader", "manifest"):
            s["source"].pop(key)
    assert from_shards == from_json
    assert from_json["steps"] and from_json["metrics"]


def test_a_node_lost_while_converting_is_named_and_a_rerun_converts_only_its_jobs(
    harness: Harness, merged: dict[str, Any]
) -> None:
    out = harness.base / "lost" / "run.json.gz"
    shards = harness.base / "lost" / "shards"
    seen: dict[str, Any] = {}

    def kill_c(phase: str, info: dict[str, Any]) -> None:
        seen.update(info)
        harness.cluster.remove_node(harness.nodes["node_c"])

    first = ray_merge(str(out), MergeOptions(shards=str(shards)), harness.options(on_phase=kill_c))
    lost = [n for n in first.manifest["cluster"]["nodes"] if n["status"] != "ok"]
    assert len(lost) == 1 and lost[0]["status"] in ("lost", "failed"), first.manifest["cluster"]
    node_problems = [p for p in first.manifest["problems"] if p["kind"] == "node"]
    assert len(node_problems) == 1 and lost[0]["label"] in node_problems[0]["path"]
    assert "re-run" in node_problems[0]["detail"]
    assert first.manifest["status"] == "partial" and first.manifest["cluster"]["jobs_missing"] > 0
    assert first.manifest["shards"]["complete"] is False
    assert (out.parent / f".{out.name}.ray").is_dir()  # what the other nodes converted is kept
    missing = first.manifest["cluster"]["jobs_missing"]

    harness.restart("node_c")  # the node is back, its disk with it
    second = ray_merge(str(out), MergeOptions(shards=str(shards)), harness.options())
    cluster = second.manifest["cluster"]
    assert second.exit_code == 0 and cluster["jobs_missing"] == 0
    assert sum(n["converted"] for n in cluster["nodes"]) == missing  # only what was missing ran
    assert cluster["jobs_reused"] == cluster["jobs"] - missing
    assert _sha(out) == _sha(merged["ray"]["json.gz"].output)
    assert second.manifest["shards"]["complete"] is True
    assert not (out.parent / f".{out.name}.ray").exists()


def test_a_stalled_node_is_named_and_the_others_merged(
    harness: Harness, tmp_path: Path, merged: dict[str, Any]
) -> None:
    """node_b's raylet is frozen (SIGSTOP) once the plan is made: its conversion never answers. The
    silence limit exceeds what a healthy node took in this module's own merges (timed, not guessed)."""
    raylet = harness.nodes["node_b"].all_processes["raylet"][0].process
    took = [n["seconds"] for res in merged["ray"].values() for n in res.manifest["cluster"]["nodes"]]
    stall_s = max(3.0, round(3 * max(took), 1))

    def freeze_b(phase: str, info: dict[str, Any]) -> None:
        os.kill(raylet.pid, signal.SIGSTOP)

    try:
        res = ray_merge(
            str(tmp_path / "stall.json.gz"),
            MergeOptions(),
            harness.options(on_phase=freeze_b, stall_timeout_s=stall_s),
        )
    finally:
        os.kill(raylet.pid, signal.SIGCONT)
    by_status = {n["status"] for n in res.manifest["cluster"]["nodes"]}
    assert by_status == {"ok", "stalled"}, res.manifest["cluster"]["nodes"]
    (problem,) = [p for p in res.manifest["problems"] if p["kind"] == "node"]
    assert f"stalled: no answer from the node for {stall_s:g} s" in problem["detail"]
    assert res.manifest["status"] == "partial" and res.manifest["counts"]["events_kept"] > 0


def test_the_command_line_merge_and_collect_convert(
    harness: Harness, tmp_path: Path, merged: dict[str, Any]
) -> None:
    node_args = [a for k, d in harness.dirs.items() for a in ("--node-dir", f"{k}={d}")]
    out = tmp_path / "cli.json.gz"
    assert cli_main(["merge", "--ray", *node_args, "--node-workers", "1", "-o", str(out)]) == 0
    assert _sha(out) == _sha(merged["ray"]["json.gz"].output)
    assert (
        cli_main(["merge", "--ray", *node_args, str(tmp_path), "-o", str(out)]) == 2
    )  # no inputs with --ray
    dest = tmp_path / "dest"
    assert cli_main(["collect", "--to", str(dest), "--convert", "--format", "json.gz", *node_args]) == 0
    run_dir = dest / "run-cluster"
    assert _sha(run_dir / "trace.json.gz") == _sha(out)
    doc = json.loads((run_dir / "shards" / "rl-trace-shards.json").read_text())
    assert (
        doc["rows"]
        == json.loads((run_dir / "trace.json.gz.manifest.json").read_text())["counts"]["events_kept"]
    )
    assert not any(p.suffix == ".jsonl" for p in run_dir.rglob("*"))  # converted, not copied
    with gzip.open(run_dir / "trace.json.gz") as f:
        assert json.load(f)["traceEvents"]
    # an object store: converted into a local temporary folder, then uploaded
    fs = fsspec.filesystem("memory")
    assert cli_main(["collect", "--to", "memory://conv", "--convert", "--format", "json.gz", *node_args]) == 0
    uploaded = fs.find("/conv/run-cluster")
    assert "/conv/run-cluster/trace.json.gz" in uploaded and any("/shards/step=" in p for p in uploaded)
    assert hashlib.sha256(fs.cat("/conv/run-cluster/trace.json.gz")).hexdigest() == _sha(out)
