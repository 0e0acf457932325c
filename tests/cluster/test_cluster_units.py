"""The node side and the driver's store of ``merge --ray``, without a cluster (issue 15).

A node's conversion (``cluster.node.convert``) is a generator of messages; here it runs in-process on
jobs planned from the three-host corpus, in its worker-pool form and in-process, and its messages are
landed by the driver's ``Receiver`` into a ``Store`` exactly as in a Ray merge. Job keys must not
depend on the interpreter (string hashing is randomised per process): two interpreters with different
``PYTHONHASHSEED`` must name every job alike, or a re-run would redo everything.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from rl_trace_observer.cluster.gather import NodeRun, Receiver
from rl_trace_observer.cluster.keys import Placement, for_node, job_key
from rl_trace_observer.cluster.node import NodeJob, convert, inventory
from rl_trace_observer.cluster.store import Store, StoreError
from rl_trace_observer.merge.files.sources import Source
from rl_trace_observer.merge.options import MergeOptions
from rl_trace_observer.merge.pipeline.clock import clock_plan
from rl_trace_observer.merge.pipeline.jobs import build_jobs
from rl_trace_observer.merge.pipeline.orchestrate import base_hint
from rl_trace_observer.merge.plan.build import apply_records_to_artifacts, order_processes, plan_sources
from rl_trace_observer.merge.plan.selection import Selection, select

from ..conftest import ROOT, clean_env, need
from ..corpus.cluster_run import build_cluster_run

need("pyarrow")


def _plan(dirs: dict[str, Path], shards: str) -> tuple[list[tuple[Any, str]], dict[str, Placement]]:
    """What the driver does with the nodes' inventories, here from ``inventory`` called directly."""
    sources, prepared, estimates, where = [], {}, {}, {}
    for label, root in sorted(dirs.items()):
        files = [
            [p.relative_to(root).as_posix(), p.stat().st_size, p.stat().st_mtime_ns]
            for p in sorted(root.rglob("*"))
            if p.is_file()
        ]
        facts = inventory(str(root), files, label)
        mtimes = {f[0]: f[2] for f in files}
        for f in facts["files"]:
            url = f"{label}:{root}/{f.rel}"
            sources.append(Source(url, f"/{label}/{f.rel}", "node", f"{label}/{f.rel}", f.size))
            prepared[url], estimates[url] = f.prepared, f.estimate
            where[url] = Placement("node-" + label, label, str(root), f.rel, f.size, mtimes[f.rel])
    sources.sort(key=lambda s: s.path)
    plan = plan_sources(sources, prepared)
    opts = MergeOptions(shards=shards)
    windows = select(plan, Selection())
    apply_records_to_artifacts(plan)
    order_processes(plan)
    clock = clock_plan(plan, "auto")
    jobs = build_jobs(plan, clock, "json.gz", base_hint(plan), windows, opts, lambda s: estimates[s.url])
    return [(job, job_key(job, where, True)) for job in jobs], where


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("units")
    run = build_cluster_run(base / "nodes")
    keyed, where = _plan(run["dirs"], str(base / "shards"))
    return {"base": base, "dirs": run["dirs"], "keyed": keyed, "where": where}


def _messages(items: list[NodeJob], workers: int) -> list[tuple[Any, ...]]:
    return [msg for batch in convert(items, workers, chunk=64 * 1024) for msg in batch]


def _pieces(messages: list[tuple[Any, ...]]) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    current = None
    for msg in messages:
        if msg[0] == "file":
            current = msg[1]
            out[current] = b""
        elif msg[0] == "data":
            assert current is not None
            out[current] += bytes(msg[1].raw())
    return out


def test_a_nodes_pool_and_in_process_conversion_send_the_same_bytes(planned: dict[str, Any]) -> None:
    keyed, where = planned["keyed"], planned["where"]
    items = [for_node(key, job, where)[0] for job, key in keyed]
    pooled = _messages([for_node(key, job, where)[0] for job, key in keyed], workers=2)
    inline = _messages(items, workers=1)
    assert pooled[-1][0] == "done" and pooled[-1][1]["workers_max_rss"] > 0  # a pool ran
    assert _pieces(pooled) == _pieces(inline)
    pieces = _pieces(inline)
    assert {f"{k}.piece" for _, k in keyed} <= set(pieces)
    assert any(name.startswith("shards/step=") for name in pieces)  # span shard parts travel too
    jobs = [m[1] for m in inline if m[0] == "job"]
    assert sorted(d.key for d in jobs) == sorted(k for _, k in keyed) and not any(d.error for d in jobs)


def test_the_driver_lands_a_nodes_messages_and_finds_them_again(
    planned: dict[str, Any], tmp_path: Path
) -> None:
    keyed, where = planned["keyed"], planned["where"]
    items = [for_node(key, job, where)[0] for job, key in keyed[:3]]
    messages = _messages(items, workers=1)
    out = tmp_path / "run.json.gz"
    store = Store(out, tmp_path / "shards")
    results: dict[str, Any] = {}
    receiver = Receiver(store, NodeRun("a", "node-a"), results)
    for msg in messages:
        receiver.handle(msg)
    assert receiver.finished and set(results) == {i.key for i in items}
    for item in items:
        done = store.get(item.key)
        assert done is not None and done.piece_size == store.piece(item.key).stat().st_size
    # a part that went missing makes the job not done: a re-run converts it again
    part = next(p for i in items for p in (results[i.key].shards or []))
    (tmp_path / "shards" / part["path"]).unlink()
    assert sum(store.get(i.key) is None for i in items) == 1
    # a byte changed on the way is refused, not landed
    store2 = Store(tmp_path / "other.json.gz", tmp_path / "shards2")
    bad = Receiver(store2, NodeRun("a", "node-a"), {})
    with pytest.raises(StoreError):
        for msg in messages:
            if msg[0] == "data":
                msg = ("data", pickle.PickleBuffer(bytearray(len(msg[1].raw()))))
            bad.handle(msg)


def test_job_keys_do_not_depend_on_the_interpreter(planned: dict[str, Any]) -> None:
    code = f"""
        import json, sys
        from pathlib import Path
        sys.path.insert(0, {str(ROOT)!r})
        from tests.cluster.test_cluster_units import _plan
        dirs = {{k: Path(v) for k, v in json.loads(sys.argv[1]).items()}}
        keyed, _ = _plan(dirs, sys.argv[2])
        print(json.dumps([k for _, k in keyed]))
    """
    dirs = json.dumps({k: str(v) for k, v in planned["dirs"].items()})
    keys = []
    for seed in ("1", "2"):
        env = clean_env(PYTHONHASHSEED=seed)
        proc = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code), dirs, str(planned["base"] / "shards")],
            env=env, capture_output=True, text=True, timeout=240, cwd=ROOT,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        keys.append(json.loads(proc.stdout.splitlines()[-1]))
    assert keys[0] == keys[1] == [k for _, k in planned["keyed"]]
    # and a file that changed (a Torch trace: no other job reads it) changes its job's key only
    i, (job, key) = next((i, jk) for i, jk in enumerate(planned["keyed"]) if jk[0].tasks[0].kind == "torch")
    url = job.tasks[0].source.url
    moved = dict(planned["where"])
    p = moved[url]
    moved[url] = Placement(p.node_id, p.label, p.root, p.rel, p.size, p.mtime_ns + 1)
    assert job_key(job, moved, True) != key
    others = [jk for n, jk in enumerate(planned["keyed"]) if n != i]
    assert [job_key(j, moved, True) for j, _ in others] == [k for _, k in others]
