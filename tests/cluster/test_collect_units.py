"""``rl-trace collect`` without a cluster: node-side listing and streaming, landing, expectations.

The node functions run here in-process exactly as a Ray task would run them; the Ray rounds,
node death and shared-filesystem detection are in ``test_collect_ray.py``.
"""

from __future__ import annotations

import gc
import hashlib
import io
import json
import os
import posixpath
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from fsspec.spec import AbstractBufferedFile
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from rl_trace_observer import config as config_mod
from rl_trace_observer.capture import Recorder
from rl_trace_observer.integrations.ray.collect_copy import CopyJob, Receiver, plan_todo
from rl_trace_observer.integrations.ray.collect_dest import INDEX_NAME, REPORT_NAME, Destination, safe_name
from rl_trace_observer.integrations.ray.collect_expect import (
    AmbiguousRun,
    dead_node_reports,
    node_missing,
    other_run_files,
    resolve_run_id,
    run_coverage,
)
from rl_trace_observer.integrations.ray.collect_node import (
    COLLECTED_MARKERS,
    chunk_view,
    list_output_dir,
    remove_probe,
    safe_rel,
    stream_files,
    write_probe,
)
from rl_trace_observer.integrations.ray.collect_report import CollectProgress, CollectReport, NodeReport

KiB = 1024


@pytest.fixture(autouse=True)
def _clean_memory_fs() -> Any:
    yield
    fs = fsspec.filesystem("memory")
    if fs.exists("/collect-units"):
        fs.rm("/collect-units", recursive=True)


def _messages(root: Path, rels: list[str], chunk: int = 64 * KiB, retries: int = 3) -> list[tuple[Any, ...]]:
    return [m for batch in stream_files(str(root), rels, chunk, retries) for m in batch]


def _files(msgs: list[tuple[Any, ...]]) -> dict[str, bytes]:
    """Reassemble what the driver would land: last complete attempt per file."""
    out: dict[str, bytes] = {}
    current: list[bytes] = []
    for m in msgs:
        if m[0] == "begin":
            current = []
        elif m[0] == "data":
            current.append(bytes(chunk_view(m[1])))
        elif m[0] == "end" and m[2]["status"] in ("ok", "growing"):
            out[m[1]] = b"".join(current)
    return out


# ------------------------------------------------------------------------------ path safety
@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab./\\\x00-")), max_size=12))
def test_safe_rel_never_lets_a_path_leave_its_root(rel: str) -> None:
    if safe_rel(rel) is None:
        joined = posixpath.normpath(posixpath.join("/root/out", rel))
        assert joined.startswith("/root/out/") and ".." not in rel.split("/")
        assert joined == f"/root/out/{rel}"  # already normal: what is listed is what is opened


def test_listing_refuses_escapes_and_special_files(tmp_path: Path) -> None:
    out, outside = tmp_path / "out", tmp_path / "secret"
    (out / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "key").write_text("secret")
    (out / "a.json").write_text("{}")
    (out / "sub" / "b.json.gz").write_bytes(b"\x1f\x8b")
    (out / "inside-link.json").symlink_to(out / "a.json")
    (out / "escape.json").symlink_to(outside / "key")
    (out / "escape-dir").symlink_to(outside)
    (out / "sub-link").symlink_to(out / "sub")
    (out / "dangling").symlink_to(out / "nowhere")
    os.mkfifo(out / "pipe")
    (out / ".rl-trace-process-h-pid-1.json.77.tmp").write_text("{")
    listing = list_output_dir(str(out), token="tok")
    assert sorted(f[0] for f in listing["files"]) == ["a.json", "inside-link.json", "sub/b.json.gz"]
    refused = dict(listing["refused"])
    assert set(refused) == {"escape.json", "escape-dir", "sub-link", "dangling", "pipe"}
    assert "outside the output directory" in refused["escape.json"]
    assert "outside the output directory" in refused["escape-dir"]
    assert "regular file" in refused["pipe"]
    assert [s[0] for s in listing["skipped"]] == [".rl-trace-process-h-pid-1.json.77.tmp"]


def test_a_collection_inside_the_output_directory_is_not_collected_again(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text("{}")
    dest = Destination(str(tmp_path / "collected"))
    dest.save_index("run", "node", {})
    dest.write_bytes(f"{dest.run_dir('run')}/{REPORT_NAME}", b"{}")
    (tmp_path / "collected" / "run" / "node" / "a.json").write_text("{}")
    listing = list_output_dir(str(tmp_path), token="t")
    assert [f[0] for f in listing["files"]] == ["a.json"]
    assert listing["skipped"] == [["collected/run", "output of an earlier rl-trace collect"]]
    assert set(COLLECTED_MARKERS) == {INDEX_NAME, REPORT_NAME}


def test_stream_refuses_a_symlink_swapped_in_after_listing(tmp_path: Path) -> None:
    out, outside = tmp_path / "out", tmp_path / "secret"
    out.mkdir()
    outside.write_text("secret")
    (out / "trace.json").symlink_to(outside)
    os.mkfifo(out / "pipe.json")  # O_NONBLOCK: must not hang
    msgs = _messages(out, ["trace.json", "pipe.json", "../secret"])
    ends = {m[1]: m[2] for m in msgs if m[0] == "end"}
    assert {k: v["status"] for k, v in ends.items()} == dict.fromkeys(ends, "refused")
    assert set(ends) == {"trace.json", "pipe.json", "../secret"}
    assert not any(m[0] == "data" for m in msgs)


def test_probes_are_seen_by_token_and_never_listed(tmp_path: Path) -> None:
    assert write_probe(str(tmp_path), "tok", "node1") is None
    assert write_probe(str(tmp_path), "other", "node2") is None
    listing = list_output_dir(str(tmp_path), token="tok")
    assert listing["probes"] == ["node1"] and listing["files"] == []
    remove_probe(str(tmp_path), "tok", "node1")
    assert list_output_dir(str(tmp_path), token="tok")["probes"] == []
    (tmp_path / "ro").mkdir(mode=0o500)
    if os.geteuid() != 0:  # root writes anywhere
        assert "cannot write" in str(write_probe(str(tmp_path / "ro"), "tok", "n"))
    assert write_probe(str(tmp_path / "missing"), "tok", "n") is None  # listing reports it instead


# -------------------------------------------------------------------------------- streaming
@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=70_000), min_size=1, max_size=6),
    chunk=st.sampled_from([4096, 5000, 16 * KiB, 64 * KiB]),
)
def test_stream_reassembles_every_file_with_bounded_batches(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], chunk: int
) -> None:
    root = tmp_path_factory.mktemp("s")
    want = {f"f{i}.bin": os.urandom(n) for i, n in enumerate(sizes)}
    for rel, data in want.items():
        (root / rel).write_bytes(data)
    batches = list(stream_files(str(root), list(want), chunk, 0))
    for batch in batches:
        assert sum(chunk_view(m[1]).nbytes for m in batch if m[0] == "data") <= chunk
    msgs = [m for b in batches for m in b]
    assert _files(msgs) == want
    ends = {m[1]: m[2] for m in msgs if m[0] == "end"}
    assert all(ends[r]["sha256"] == hashlib.sha256(d).hexdigest() for r, d in want.items())
    assert msgs[-1][0] == "done" and msgs[-1][1]["anon_peak"] >= 0


def test_file_changed_while_read_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_bytes(b"a" * 300_000)
    gen = stream_files(str(tmp_path), ["trace.json"], 64 * KiB, 3)
    first = next(gen)  # begin + first chunk: the rest is read after the rewrite below
    with open(path, "r+b") as fh:
        fh.write(b"b" * 300_000)
    msgs = first + [m for b in gen for m in b]
    ends = [m[2] for m in msgs if m[0] == "end"]
    assert [e["status"] for e in ends] == ["changed", "ok"]
    assert _files(msgs) == {"trace.json": b"b" * 300_000}


def test_growing_event_log_is_a_consistent_prefix(tmp_path: Path) -> None:
    log = tmp_path / "rl-insight-h-pid-1.chrome.jsonl"
    log.write_bytes(b'{"ph":"X"}\n' * 20_000)
    gen = stream_files(str(tmp_path), [log.name], 32 * KiB, 0)
    first = next(gen)
    with open(log, "ab") as fh:
        fh.write(b'{"ph":"C"}\n')
    msgs = first + [m for b in gen for m in b]
    (end,) = [m[2] for m in msgs if m[0] == "end"]
    assert end["status"] == "growing" and end["size"] == 20_000 * 11
    assert _files(msgs)[log.name] == b'{"ph":"X"}\n' * 20_000


def test_a_file_that_never_settles_gives_up_after_the_retries(tmp_path: Path) -> None:
    path = tmp_path / "hot.json"
    path.write_bytes(b"x" * 200_000)
    msgs: list[tuple[Any, ...]] = []
    for batch in stream_files(str(tmp_path), ["hot.json"], 64 * KiB, 2):
        msgs += batch
        with open(path, "r+b") as fh:
            fh.write(os.urandom(8))
    ends = [m[2] for m in msgs if m[0] == "end"]
    assert [e["status"] for e in ends] == ["changed"] * 3 and ends[-1]["attempt"] == 2


# ---------------------------------------------------------------------------------- landing
@pytest.mark.parametrize("url", ["local", "memory://collect-units/land"])
def test_landing_is_atomic_and_abort_leaves_nothing(tmp_path: Path, url: str) -> None:
    dest = Destination(str(tmp_path / "dest") if url == "local" else url)
    landing = dest.landing("run", "node", "sub/a.json")
    landing.write(b"half")
    assert "sub/a.json" not in dest.landed("run", "node")  # never visible under its final name
    landing.abort()
    assert dest.landed("run", "node") == {}
    landing = dest.landing("run", "node", "sub/a.json")
    landing.write(b"whole")
    landing.commit()
    assert dest.landed("run", "node") == {"sub/a.json": 5}
    dest.save_index("run", "node", {"sub/a.json": {"size": 5, "sha256": "x"}})
    assert dest.load_index("run", "node") == {"sub/a.json": {"size": 5, "sha256": "x"}}
    assert dest.labels("run") == ["node"]
    dest.clear_partials("run", "node")
    assert set(dest.fs.find(dest.node_dir("run", "node"))) == {
        f"{dest.node_dir('run', 'node')}/sub/a.json",
        f"{dest.node_dir('run', 'node')}/{INDEX_NAME}",
    }


class _PutOnCloseFile(AbstractBufferedFile):  # type: ignore[misc]
    """Object-store semantics (s3fs/gcsfs cannot be reached offline): same fsspec buffered-file base
    class, and the object exists only once the final upload runs, as with a PUT / multipart complete."""

    def _initiate_upload(self) -> None:
        self._parts: list[bytes] = []

    def _upload_chunk(self, final: bool = False) -> bool:
        self._parts.append(self.buffer.getvalue())
        if final:
            obj = MemoryFileSystem._open(self.fs, self.path, "wb")  # the plain in-memory object
            obj.write(b"".join(self._parts))
            obj.close()
        return True


class _ObjectStoreFS(MemoryFileSystem):  # type: ignore[misc]
    protocol = "objtest"

    def _open(self, path: str, mode: str = "rb", **kw: Any) -> Any:
        if "w" in mode:
            return _PutOnCloseFile(self, path, mode, block_size=5 * KiB)
        return super()._open(path, mode, **kw)


def test_object_store_mode_publishes_only_complete_objects() -> None:
    dest = Destination("memory://collect-units/objstore")
    dest.fs = _ObjectStoreFS()
    dest.mode = "direct"  # what s3/gs/azure get: no temp key, no rename
    landing = dest.landing("run", "node", "a.json")
    landing.write(os.urandom(12 * KiB))  # more than one block: a multipart upload has started
    landing.abort()
    gc.collect()  # fsspec closes (and would publish) buffered files on garbage collection
    landing = dest.landing("run", "node", "b.json")
    landing.write(b"ok")
    assert dest.landed("run", "node") == {}
    landing.commit()
    assert dest.landed("run", "node") == {"b.json": 2}


def test_safe_name_never_makes_hidden_or_relative_components() -> None:
    assert safe_name("..") == "_" and safe_name(".hidden") == "hidden"
    assert safe_name("ray-01/job:7") == "ray-01_job_7"


def _job(tmp_path: Path, files: list[list[Any]], retries: int = 1) -> CopyJob:
    rep = NodeReport(node_id="n" * 56, address="127.0.0.1", label="host")
    return CopyJob(rep, rep.node_id, str(tmp_path), files, "run", 64 * KiB, 2, retries, 10.0)


def test_receiver_lands_verified_files_and_rejects_corrupted_bytes(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "good.json").write_bytes(os.urandom(150_000))
    (src / "bad.json").write_bytes(os.urandom(150_000))
    files = [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(src.iterdir())]
    job = _job(src, files)
    dest = Destination(str(tmp_path / "dest"))
    receiver = Receiver(job, files, dest, CollectProgress(False), {})
    for msg in _messages(src, ["bad.json", "good.json"]):
        if msg[0] == "data" and receiver.rel == "bad.json":
            msg = ("data", b"X" + bytes(chunk_view(msg[1]))[1:])  # a changed byte in transit
        receiver.handle(msg)
    receiver.save_index()
    assert dest.landed("run", "host") == {"good.json": 150_000}
    assert [f[0] for f in job.report.failed] == ["bad.json"] and "sha256" in job.report.failed[0][1]
    index = dest.load_index("run", "host")
    assert index["good.json"]["sha256"] == hashlib.sha256((src / "good.json").read_bytes()).hexdigest()
    # resumable: the verified file is skipped next time, the failed one is tried again
    assert [f[0] for f in plan_todo(_job(src, files), index, dest.landed("run", "host"))] == ["bad.json"]
    os.utime(src / "good.json", ns=(1, 1))
    files = [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(src.iterdir())]
    assert len(plan_todo(_job(src, files), index, dest.landed("run", "host"))) == 2


def test_receiver_refuses_paths_it_did_not_ask_for(tmp_path: Path) -> None:
    job = _job(tmp_path, [["a.json", 1, 1]])
    receiver = Receiver(job, job.files, Destination(str(tmp_path / "d")), CollectProgress(False), {})
    with pytest.raises(RuntimeError, match="unexpected path"):
        receiver.handle(("begin", "../../etc/passwd", 10, 0))


# ----------------------------------------------------------------------- expected vs found
def _populate(out: Path, run_id: str, pid: int, rank: int, world: int, steps: list[int]) -> Recorder:
    cfg = config_mod.Config(output_dir=out, run_id=run_id, role="actor")
    rec = Recorder(cfg, host="h", pid=pid)
    rec.update_identity(rank=rank, world_size=world)
    rec.span("actor_update", 1_795_000_000 * 10**9, 1_795_000_001 * 10**9, lane=f"rank_{rank}")
    for step in steps:
        trace = out / "prof" / f"actor_step{step}_rank{rank}.json.gz"
        trace.parent.mkdir(exist_ok=True)
        trace.write_bytes(b"\x1f\x8b")
        rec.register_artifact(trace, "torch", step=step, role="actor", rank=rank)
    rec.close()
    return rec


def test_expected_versus_found_from_process_records(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    _populate(out, "r1", 10, 0, 4, [1, 2])
    rec = _populate(out, "r1", 11, 1, 4, [1])
    _populate(out, "r0", 12, 0, 1, [1])
    (out / "prof" / "actor_step1_rank1.json.gz").unlink()
    rec.events.path.unlink()
    (out / "unclaimed.txt").write_text("kept")
    listing = list_output_dir(str(out), token="t")
    with pytest.raises(AmbiguousRun, match="r1 \\(2 processes\\)"):
        resolve_run_id(None, [listing])
    assert resolve_run_id("r1", [listing]) == ("r1", "given")
    excluded, runs = other_run_files(listing, "r1")
    assert runs == {"r0"} and "rl-trace-process-h-pid-12.json" in excluded
    assert "unclaimed.txt" not in excluded and "prof/actor_step1_rank0.json.gz" not in excluded
    missing = dict(node_missing(listing, "r1"))
    assert set(missing) == {"prof/actor_step1_rank1.json.gz", "rl-insight-h-pid-11.chrome.jsonl"}
    gaps = run_coverage([listing], "r1", profiled_steps=[3])
    assert gaps == [
        "role actor: no process record for rank(s) 2, 3 of world size 4 "
        "(their node may be gone or unreachable)",
        "role actor rank 0: no artifact for profiled step(s) 3",
        "role actor rank 1: no artifact for profiled step(s) 2, 3",
    ]


def test_dead_nodes_are_problems_unless_back_or_collected_before() -> None:
    dead = [
        {"NodeID": "b" * 56, "NodeManagerAddress": "10.0.0.1", "NodeManagerHostname": "hostA"},
        {"NodeID": "c" * 56, "NodeManagerAddress": "10.0.0.2", "NodeManagerHostname": "hostB"},
        {"NodeID": "d" * 56, "NodeManagerAddress": "10.0.0.3", "NodeManagerHostname": "hostC"},
    ]
    reps = dead_node_reports(dead, {("hostA", "10.0.0.1"): "hostA"}, {"d" * 56: "complete"})
    assert [r.status for r in reps] == ["restarted", "dead", "collected-earlier"]
    report = CollectReport(dest="d", run_id="r", run_dir="d/r", nodes=reps)
    assert not report.ok and report.problems() == [f"hostB: node dead ({reps[1].notes[0]})"]
    assert dead_node_reports([], {}, {}) == []


def test_report_round_trips_to_json() -> None:
    rep = NodeReport("n", "ip", label="host", refused=[("x", "symlink")])
    report = CollectReport(dest="d", run_id="r", run_dir="d/r", nodes=[rep])
    data = json.loads(json.dumps(report.to_dict()))
    assert data["ok"] is False and data["nodes"][0]["refused"] == [["x", "symlink"]]
    assert report.problems() == ["host: refused x: symlink"]


def test_progress_shows_bytes_files_and_nodes() -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=150)
    with CollectProgress(True, console) as bar:
        bar.plan(files=4, total_bytes=4 * 1024 * KiB, nodes=2)
        bar.advance(nbytes=2 * 1024 * KiB, files=2, nodes=1)
    text = console.file.getvalue()
    assert "2.1/4.2 MB" in text and "files 2/4" in text and "nodes 1/2" in text
    silent = Console(file=io.StringIO(), force_terminal=True)
    with CollectProgress(False, silent) as bar:
        bar.advance(nbytes=10, files=1)
    assert silent.file.getvalue() == ""
