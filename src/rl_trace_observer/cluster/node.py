"""Node side of a Ray merge: the only code that reads a node's files. No Ray import here.

Two entry points, each run as a task pinned to its node (:mod:`.merge`):

- :func:`inventory`: what planning needs of each file, read on the node (its head's verdict, its
  decompressed size, its duplicate fingerprint, the process records' bytes): kilobytes per file.
- :func:`convert`: the node's merge jobs, as planned on the driver, run here in a small pool; a
  generator that yields, as each job finishes, its result and the bytes of its output piece and
  span shards (bounded batches: Ray's generator backpressure holds the node when the driver is
  behind). Nothing is written outside a private temporary folder, removed at the end.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import resource
import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..capture.identity import hostname
from ..integrations.ray.collect_node import MemoryWatch
from ..merge.files.kinds import why_not_regular
from ..merge.files.sources import Source, decompressed_size
from ..merge.job import run_job
from ..merge.job.pool import BoundedPool, start_method
from ..merge.job.spec import Job, JobResult
from ..merge.output.spill import Spilled
from ..merge.plan.build import Prepared, prepare
from ..merge.timeline.model import Rebase

CHUNK_BYTES = 8 << 20
HEARTBEAT_S = 10.0  # while a long job runs, well inside any stall timeout
Message = tuple[Any, ...]


def local_source(root: str, rel: str, label: str, size: int) -> Source:
    """A node file as the node opens it; ``url`` and ``rel`` as the driver plans it (``label/rel``:
    the layout ``rl-trace collect`` gives the same file, so both plan it the same way)."""
    path = os.path.join(root, rel)
    return Source(
        url=display_url(label, root, rel),
        path=path,
        protocol="file",
        rel=f"{label}/{rel}",
        size=size,
        unreadable=why_not_regular(path),  # a FIFO, a symlink loop, ...: named, never opened
    )


def display_url(label: str, root: str, rel: str) -> str:
    """How a node's file is named in the manifest: ``<node label>:<absolute path on that node>``."""
    return f"{label}:{os.path.join(root, rel)}"


# ------------------------------------------------------------------------------------ inventory
@dataclass
class FileFacts:
    rel: str
    size: int
    estimate: int  # decompressed bytes (orders the jobs; the driver cannot open the file)
    prepared: Prepared


def inventory(root: str, files: list[list[Any]], label: str) -> dict[str, Any]:
    """Planning facts for ``files`` ([rel, size, mtime_ns] from the survey's listing)."""
    mem = MemoryWatch()
    facts = []
    for rel, size, _mtime in files:
        src = local_source(root, rel, label, int(size))
        facts.append(FileFacts(rel, int(size), decompressed_size(src), prepare(src)))
        mem.sample()
    return {"host": hostname(), "files": facts, "memory": mem.report()}


# -------------------------------------------------------------------------------------- convert
@dataclass
class NodeJob:
    """One planned job for this node, with its key (the driver's store names results by it)."""

    key: str
    job: Job


@dataclass
class JobDone:
    """What the driver keeps of a finished job, besides its piece and shard files."""

    key: str
    result: JobResult | None = None  # pieces emptied: the piece travels as a file
    piece_size: int = 0
    deflated: tuple[tuple[int, int], ...] = ()  # (crc32, length) of each deflate piece, in order
    shards: list[dict[str, Any]] = field(default_factory=list)
    rebase_ns: int | None = None  # the job met an event before the timeline base
    error: str | None = None


def _run_one(job: Job) -> tuple[JobResult | tuple[str, Any], int]:
    """``run_job`` with its failure as a value (one bad file must not take the node's other jobs
    down), and the peak memory of the process that ran it."""
    try:
        out: JobResult | tuple[str, Any] = run_job(job)
    except Rebase as rb:
        out = ("rebase", rb.min_ns)
    except Exception as exc:
        out = ("error", f"{type(exc).__name__}: {exc}")
    return out, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _piece_file(work: Path, item: NodeJob, res: JobResult) -> tuple[Path, int, tuple[tuple[int, int], ...]]:
    """The job's output bytes as one file: a worker process already spilled them; in-process jobs
    hand them back in memory."""
    path = work / f"{item.key}.piece"
    if len(res.pieces) == 1 and isinstance(res.pieces[0], Spilled):
        spilled = res.pieces[0]
        os.replace(spilled.path, path)
        return path, spilled.size, spilled.deflated
    deflated: list[tuple[int, int]] = []
    size = 0
    with open(path, "wb") as f:
        for piece in res.pieces:
            if isinstance(piece, tuple):
                size += f.write(piece[0])
                deflated.append((piece[1], piece[2]))
            else:
                size += f.write(piece)
    return path, size, tuple(deflated)


def _finish(work: Path, item: NodeJob, out: JobResult | tuple[str, Any]) -> tuple[JobDone, list[Path]]:
    if isinstance(out, tuple):
        kind, value = out
        done = JobDone(item.key, rebase_ns=value if kind == "rebase" else None)
        done.error = value if kind == "error" else None
        return done, []
    path, size, deflated = _piece_file(work, item, out)
    shards = out.shards  # kept in the result too: the driver folds them like a local merge's
    out.pieces = []
    files = [path] + [work / "shards" / p["path"] for p in shards]
    return JobDone(item.key, out, size, deflated, shards), files


def _results(
    items: list[NodeJob], workers: int
) -> Iterator[tuple[NodeJob, tuple[JobResult | tuple[str, Any], int]] | None]:
    """Jobs in completion order, with at most ``INFLIGHT_BYTES`` of estimated input being parsed; each
    with the peak memory of the process that ran it. ``None``: a heartbeat while a pool works."""
    if workers <= 1 or len(items) <= 1:  # in this process; a thread, so heartbeats can go out meanwhile
        with ThreadPoolExecutor(1, thread_name_prefix="rl-trace-job") as one:
            for item in items:
                fut = one.submit(_run_one, item.job)
                while True:
                    try:
                        got = fut.result(timeout=HEARTBEAT_S)
                        break
                    except FuturesTimeout:
                        yield None
                yield item, got
        return
    # not fork: a Ray worker has gRPC threads, and a forked copy of them can deadlock
    start = start_method("forkserver", "spawn")
    pool = BoundedPool(_run_item, _weight, workers, start, ordered=False, heartbeat_s=HEARTBEAT_S)
    yield from pool.run(sorted(items, key=lambda i: -i.job.weight))


def _run_item(item: NodeJob) -> tuple[JobResult | tuple[str, Any], int]:
    return _run_one(item.job)


def _weight(item: NodeJob) -> int:
    return item.job.weight


def _stream(path: Path, rel: str, chunk: int, mem: MemoryWatch) -> Iterator[Message]:
    """A file as messages: ("file", rel, size), ("data", bytes)*, ("end", rel, sha256)."""
    size = path.stat().st_size
    yield ("file", rel, size)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
            mem.sample()
            yield ("data", pickle.PickleBuffer(block))
    yield ("end", rel, digest.hexdigest())


def convert(items: list[NodeJob], workers: int = 2, chunk: int = CHUNK_BYTES) -> Iterator[list[Message]]:
    """Run this node's jobs; yield batches of messages carrying at most ``chunk`` bytes of data.

    Per job: ("job", JobDone) then its files (piece first, then shard parts, relative to the job's
    own folder). The last batch ends with ("done", memory report of this task)."""
    mem = MemoryWatch()
    work = Path(tempfile.mkdtemp(prefix="rl-trace-merge-"))
    try:
        for item in items:
            item.job.spill_path = str(work / f".{item.key}.spill")
            if item.job.shards is not None:
                item.job.shards.root = str(work / "shards")
        batch: list[Message] = []
        payload = 0
        pool_peak = 0
        for got in _results(items, workers):
            if got is None:
                yield [("beat",)]
                continue
            item, (out, peak) = got
            if workers > 1 and len(items) > 1:
                pool_peak = max(pool_peak, peak)
            done, files = _finish(work, item, out)
            batch.append(("job", done))
            for path in files:
                rel = path.relative_to(work).as_posix()
                for msg in _stream(path, rel, chunk, mem):
                    size = len(msg[1].raw()) if msg[0] == "data" else 0
                    if batch and payload + size > chunk:
                        yield batch
                        batch, payload = [], 0
                    batch.append(msg)
                    payload += size
                path.unlink(missing_ok=True)
            yield batch  # each job as soon as it is complete: kept by the driver even if we die next
            batch, payload = [], 0
        batch.append(("done", {**mem.report(), "host": hostname(), "workers_max_rss": pool_peak}))
        yield batch
    finally:
        shutil.rmtree(work, ignore_errors=True)
