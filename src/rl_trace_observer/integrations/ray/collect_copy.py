"""Driver side of one node's copy: consume its generator task, land files, keep the sidecar index.

Memory stays bounded on both ends: the node task yields batches of at most ~``chunk_size`` payload
bytes and Ray's generator backpressure holds it once ``in_flight`` batches are unconsumed, so the
worker and the driver each hold a few chunks whatever the file size. Every file's sha256 is computed
on the node over the bytes read and again here over the bytes handed to the destination; a file only
gets its final name (and an index entry) when both agree and its stat did not change while read.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...capture.file_names import PROCESS_RECORD_PREFIX
from .collect_dest import Destination, Landing
from .collect_node import chunk_view, safe_rel
from .collect_report import CollectProgress, NodeReport
from .node_stream import Stalled, drain, pinned

INDEX_SAVE_INTERVAL_S = 2.0
FileHook = Callable[[str, str, int], None]


@dataclass
class CopyJob:
    """One node's work: where to read, where to land, what to send, and how."""

    report: NodeReport
    node_id: str
    output_dir: str
    files: list[list[Any]]  # [rel, size, mtime_ns] from the listing
    run_id: str
    chunk_size: int
    in_flight: int
    retries: int
    stall_timeout_s: float
    on_file_begin: FileHook | None = None


def _order(rel: str) -> int:
    """Process records and event logs first: they are small and tell the merger who is who."""
    name = rel.rsplit("/", 1)[-1]
    return 0 if name.startswith(PROCESS_RECORD_PREFIX) else 1 if name.endswith(".chrome.jsonl") else 2


def plan_todo(job: CopyJob, index: dict[str, dict[str, Any]], landed: dict[str, int]) -> list[list[Any]]:
    """Files not yet verified at DEST with the same source size and mtime (the resumable part)."""
    todo = []
    for rel, size, mtime_ns in job.files:
        entry = index.get(rel)
        if (
            entry
            and entry.get("src_size") == size
            and entry.get("mtime_ns") == mtime_ns
            and landed.get(rel) == entry.get("size")
        ):
            job.report.files_skipped += 1
        else:
            todo.append([rel, size, mtime_ns])
    todo.sort(key=lambda f: (_order(f[0]), f[1], f[0]))
    return todo


class Receiver:
    """State machine over the node's messages: begin → data* → end, per file and per attempt."""

    def __init__(
        self,
        job: CopyJob,
        todo: list[list[Any]],
        dest: Destination,
        bar: CollectProgress,
        index: dict[str, Any],
    ) -> None:
        self.job, self.dest, self.bar, self.index = job, dest, bar, index
        self.wanted = {f[0] for f in todo}
        self.landing: Landing | None = None
        self.digest = hashlib.sha256()
        self.rel = ""
        self.received = 0
        self.dirty = False
        self.last_save = time.monotonic()
        self.done = False
        self.settled: set[str] = set()  # files with a final outcome (landed, failed, refused, gone)

    def handle(self, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "data":
            if self.landing is None:
                raise RuntimeError("node sent file data before naming the file")
            view = chunk_view(msg[1])
            self.landing.write(view)
            self.digest.update(view)
            self.received += view.nbytes
            self.bar.advance(nbytes=view.nbytes)
        elif kind == "begin":
            self._begin(msg[1], msg[2], msg[3])
        elif kind == "end":
            self._end(msg[1], msg[2])
        elif kind == "done":
            self.job.report.worker_memory = dict(msg[1])
            self.done = True

    def _begin(self, rel: str, size: int, attempt: int) -> None:
        self.abort()
        why = safe_rel(rel)
        if why or rel not in self.wanted:  # the node may only send what was asked for
            raise RuntimeError(f"node sent an unexpected path {rel!r}: {why or 'not requested'}")
        if attempt:
            self.job.report.retries += 1
            self.bar.advance(extra_total=size)
        if self.job.on_file_begin is not None:
            self.job.on_file_begin(self.job.report.label, rel, attempt)
        self.rel, self.received, self.digest = rel, 0, hashlib.sha256()
        self.landing = self.dest.landing(self.job.run_id, self.job.report.label, rel)

    def _end(self, rel: str, info: dict[str, Any]) -> None:
        rep, status = self.job.report, info.get("status")
        landing, self.landing = self.landing, None
        if status != "changed" or info.get("attempt", 0) >= self.job.retries:
            self.settled.add(rel)
        if status in ("ok", "growing"):
            if landing is None or rel != self.rel:
                raise RuntimeError(f"node ended {rel!r} without sending it")
            sha = self.digest.hexdigest()
            if sha != info["sha256"] or self.received != info["size"]:
                landing.abort()
                rep.failed.append((rel, "sha256 of the bytes landed differs from the bytes read on the node"))
                return
            landing.commit()
            self._verified(rel, info, sha)
            if status == "growing":
                rep.notes.append(f"{rel}: still growing; collected its first {self.received} bytes")
        elif status == "changed":
            if landing is not None:
                landing.abort()
            if info.get("attempt", 0) >= self.job.retries:  # the node gave up re-reading it
                rep.failed.append((rel, f"kept changing while being read ({self.job.retries + 1} attempts)"))
        else:
            if landing is not None:
                landing.abort()
            target = (
                rep.missing if status == "vanished" else rep.refused if status == "refused" else rep.failed
            )
            target.append((rel, str(info.get("error") or status)))

    def _verified(self, rel: str, info: dict[str, Any], sha: str) -> None:
        self.index[rel] = {
            "size": self.received,
            "src_size": info["size"],  # as stat'ed when opened, so a re-run compares like with like
            "mtime_ns": info["mtime_ns"],
            "sha256": sha,
            "collected_wall_ns": time.time_ns(),
        }
        rep = self.job.report
        rep.files_copied += 1
        rep.bytes_copied += self.received
        self.bar.advance(files=1)
        self.dirty = True
        if time.monotonic() - self.last_save > INDEX_SAVE_INTERVAL_S:
            self.save_index()

    def save_index(self) -> None:
        if self.dirty:
            self.dest.save_index(self.job.run_id, self.job.report.label, self.index)
            self.dirty = False
            self.last_save = time.monotonic()

    def abort(self) -> None:
        if self.landing is not None:
            landing, self.landing = self.landing, None
            landing.abort()


def _consume(job: CopyJob, todo: list[list[Any]], receiver: Receiver, ray: Any, stream_remote: Any) -> None:
    gen = pinned(stream_remote, job.node_id, job.in_flight).remote(
        job.output_dir, [f[0] for f in todo], job.chunk_size, job.retries
    )
    try:
        drain(
            ray,
            gen,
            finished=lambda: receiver.done,
            handle=receiver.handle,
            stall_timeout_s=job.stall_timeout_s,
            what="data",
        )
    finally:
        if not receiver.done:
            try:
                ray.cancel(gen)
            except Exception:
                pass


def one_line(exc: BaseException) -> str:
    """An exception as one short line (its last non-empty line: Ray wraps the cause in a traceback)."""
    text = str(exc).strip().splitlines()
    cause = next((t.strip() for t in reversed(text) if t.strip()), type(exc).__name__)
    return cause[:300]


def copy_node(job: CopyJob, dest: Destination, bar: CollectProgress, ray: Any, stream_remote: Any) -> None:
    """Bring one node's files to DEST; every failure ends up in ``job.report``, nothing is raised."""
    rep, started = job.report, time.monotonic()
    receiver: Receiver | None = None
    todo: list[list[Any]] = []
    try:
        index = dest.load_index(job.run_id, rep.label)
        landed = dest.landed(job.run_id, rep.label)
        dest.clear_partials(job.run_id, rep.label)
        todo = plan_todo(job, index, landed)
        bar.plan(files=len(todo), total_bytes=sum(f[1] for f in todo), nodes=0)
        if todo:
            receiver = Receiver(job, todo, dest, bar, index)
            _consume(job, todo, receiver, ray, stream_remote)
    except Stalled as exc:
        rep.status = "lost"
        rep.notes.insert(0, str(exc))
    except ray.exceptions.RayTaskError as exc:
        rep.status = "partial"
        rep.failed.append(("(collector task)", one_line(exc)))
    except ray.exceptions.RayError as exc:
        rep.status = "lost"
        rep.notes.insert(0, f"node lost during collection ({type(exc).__name__})")
    except OSError as exc:
        rep.status = "partial"
        rep.failed.append(("(destination)", f"cannot write to {dest.url}: {exc.strerror or exc}"))
    except Exception as exc:
        rep.status = "partial"
        rep.failed.append(("(collector)", f"{type(exc).__name__}: {one_line(exc)}"))
    finally:
        if receiver is not None:
            receiver.abort()
            try:
                receiver.save_index()
            except Exception as exc:
                rep.failed.append(("(index)", f"cannot save the sidecar index: {one_line(exc)}"))
        dest.clear_partials(job.run_id, rep.label)
    pending = len(todo) - (len(receiver.settled) if receiver is not None else 0)
    if rep.status == "lost" and pending > 0:
        rep.notes[0] += f"; {pending} file(s) not collected: re-run when the node is back"
    if rep.status == "complete" and rep.failed:
        rep.status = "partial"
    rep.seconds = round(time.monotonic() - started, 3)
    bar.advance(nodes=1)
