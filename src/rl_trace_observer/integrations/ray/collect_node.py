"""Node side of ``rl-trace collect``: the only code that reads a node's output directory.

It runs inside Ray tasks pinned to one node but imports only the standard library and the capture
core, so a worker starts it cheaply and its path-safety rules are unit-tested without a cluster.
One entry point per collection round: ``write_probe``/``remove_probe`` (shared-filesystem
detection), ``list_output_dir`` (what is there, what is refused, what the process records expect)
and ``stream_files`` (a generator of bounded message batches carrying file bytes and sha256).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import stat
from collections.abc import Iterator
from typing import Any

from ...capture.file_names import is_process_record
from ...capture.identity import hostname

PROBE_PREFIX = ".rl-trace-collect-probe-"
# Sidecar files that collect_dest writes into DEST/<run_id>/ and DEST/<run_id>/<node>/.
COLLECTED_MARKERS = frozenset({".rl-trace-collect-index.json", ".rl-trace-collect-report.json"})
# write_atomic's temp files (".<name>.<pid>.tmp"): half-written by definition, never worth copying.
ATOMIC_TMP_RE = re.compile(r"^\..+\.\d+\.tmp$")
# Our own event logs and samples files are append-only by contract (docs/FORMATS.md §1, §13): a prefix
# read while the process keeps writing is a consistent snapshot, so growth is not a "change" for them.
APPEND_ONLY_SUFFIX = (".chrome.jsonl", ".samples.jsonl")  # event logs, the metric sampler's samples
MiB = 1024 * 1024
MAX_BATCH_MESSAGES = 4096  # many tiny files: bound the per-object count too

Message = tuple[Any, ...]


def safe_rel(rel: str) -> str | None:
    """Why ``rel`` is not a safe relative path, or None when it is (no absolute, no ``..``, no empties)."""
    if not rel or "\x00" in rel or rel.startswith("/") or "\\" in rel:
        return "not a plain relative path"
    if any(part in ("", ".", "..") for part in rel.split("/")):
        return "path has an empty, '.' or '..' component"
    return None


def chunk_view(data: Any) -> memoryview:
    """The bytes of a ``data`` message: a PickleBuffer in-process, Ray's zero-copy buffer after a hop."""
    if isinstance(data, pickle.PickleBuffer):
        return data.raw()
    return memoryview(data).cast("B")


def _inside(root: str, real: str) -> bool:
    return real == root or real.startswith(root.rstrip("/") + "/")


# ------------------------------------------------------------------------------------ probes
def node_output_dir(output_dir: str | None) -> str | None:
    """The directory the driver named, else this node's own ``RL_TRACE_OUTPUT_DIR``."""
    if output_dir:
        return output_dir
    return os.environ.get("RL_TRACE_OUTPUT_DIR", "").strip() or None


def write_probe(output_dir: str | None, token: str, key: str) -> str | None:
    """Leave a marker only this collection knows; nodes that see each other's share the directory."""
    directory = node_output_dir(output_dir)
    if directory is None or not os.path.isdir(directory):
        return None  # nothing to share: the listing round reports the missing directory
    try:
        path = os.path.join(directory, f"{PROBE_PREFIX}{token}-{key}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, token.encode())
        finally:
            os.close(fd)
        return None
    except OSError as exc:
        return f"cannot write the shared-filesystem probe in {directory}: {exc.strerror or exc}"


def remove_probe(output_dir: str | None, token: str, key: str) -> None:
    directory = node_output_dir(output_dir)
    if directory is not None:
        try:
            os.unlink(os.path.join(directory, f"{PROBE_PREFIX}{token}-{key}"))
        except OSError:
            pass


# ----------------------------------------------------------------------------------- listing
def _classify(entry: os.DirEntry[str], root: str) -> tuple[str, os.stat_result | None, str | None]:
    """('file'|'dir'|'refused', stat, reason) for one directory entry, never following links outward."""
    if entry.is_symlink():
        real = os.path.realpath(entry.path)
        if not _inside(root, real):
            return "refused", None, f"symlink leading outside the output directory (-> {real})"
        try:
            st = os.stat(real)
        except OSError:
            return "refused", None, "dangling symlink"
        if stat.S_ISREG(st.st_mode):
            return "file", st, None
        return "refused", None, "symlink to a directory or special file (not followed)"
    st = entry.stat(follow_symlinks=False)
    if stat.S_ISDIR(st.st_mode):
        return "dir", st, None
    if stat.S_ISREG(st.st_mode):
        return "file", st, None
    return "refused", None, "not a regular file (fifo, socket or device)"


def _walk(root: str, out: dict[str, Any], token: str) -> None:
    stack = [("", root)]
    while stack:
        prefix, directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError as exc:
            out["refused"].append([prefix or ".", f"cannot list directory: {exc.strerror or exc}"])
            continue
        if COLLECTED_MARKERS.intersection(e.name for e in entries):
            # DEST placed inside an output directory: collecting it again would nest a copy of
            # the collection in every re-run
            out["skipped"].append([prefix.rstrip("/") or ".", "output of an earlier rl-trace collect"])
            continue
        for entry in entries:
            rel = prefix + entry.name
            if entry.name.startswith(PROBE_PREFIX):
                if not prefix and entry.name.startswith(f"{PROBE_PREFIX}{token}-"):
                    out["probes"].append(entry.name[len(PROBE_PREFIX) + len(token) + 1 :])
                continue
            try:
                kind, st, reason = _classify(entry, root)
            except OSError as exc:
                kind, st, reason = "refused", None, f"cannot stat: {exc.strerror or exc}"
            if kind == "dir":
                stack.append((rel + "/", entry.path))
            elif kind == "refused":
                out["refused"].append([rel, reason])
            elif ATOMIC_TMP_RE.match(entry.name):
                out["skipped"].append([rel, "temporary file of an atomic write in progress"])
            else:
                assert st is not None
                out["files"].append([rel, st.st_size, st.st_mtime_ns])


def _read_record(path: str) -> dict[str, Any] | str:
    """The fields of a process record that the collector needs, or why it cannot be read."""
    try:
        with open(path, "rb") as fh:
            data = json.loads(fh.read(16 * MiB))
    except (OSError, ValueError) as exc:
        return f"unreadable process record: {exc}"
    if not isinstance(data, dict):
        return "process record is not a JSON object"
    arts = data.get("artifacts")
    return {
        "run_id": data.get("run_id"),
        "hostname": data.get("hostname"),
        "pid": data.get("pid"),
        "role": data.get("role"),
        "rank": data.get("rank"),
        "world_size": data.get("world_size"),
        "event_log": data.get("event_log"),
        "events": data.get("events"),  # {"written": 0, ...}: the event log was never created
        "ray_node_id": (data.get("ray") or {}).get("node_id"),
        "artifacts": [a for a in arts if isinstance(a, dict)] if isinstance(arts, list) else [],
    }


def list_output_dir(output_dir: str | None, token: str) -> dict[str, Any]:
    """Everything the driver needs to plan one node: files, refusals, probes seen, process records."""
    output_dir = node_output_dir(output_dir)
    out: dict[str, Any] = {
        "host": hostname(),
        "output_dir": output_dir,
        "root": None,
        "exists": False,
        "files": [],
        "refused": [],
        "skipped": [],
        "probes": [],
        "records": {},
        "error": None,
    }
    if output_dir is None:
        out["error"] = "no output directory: RL_TRACE_OUTPUT_DIR is unset on this node and none was given"
        return out
    root = os.path.realpath(output_dir)
    out["root"] = root
    if not os.path.isdir(root):
        return out
    out["exists"] = True
    _walk(root, out, token)
    for rel, _size, _mtime in out["files"]:
        if "/" not in rel and is_process_record(rel):
            out["records"][rel] = _read_record(os.path.join(root, rel))
    return out


# --------------------------------------------------------------------------------- streaming
def _open_inside(root: str, rel: str) -> tuple[int, os.stat_result]:
    """Open ``root/rel`` read-only and prove, on the open descriptor, that it is a regular file inside."""
    why = safe_rel(rel)
    if why:
        raise ValueError(why)
    path = os.path.join(root, rel)
    # O_NONBLOCK: a FIFO swapped in after listing must not hang the task on open().
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            real = os.path.realpath(path)
        if not _inside(root, real):
            raise ValueError(f"resolves outside the output directory (-> {real})")
        return fd, st
    except BaseException:
        os.close(fd)
        raise


class MemoryWatch:
    """Peak memory of this worker during one task: VmHWM reset via clear_refs, RssAnon sampled."""

    def __init__(self) -> None:
        try:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
            self.hwm_reset = True
        except OSError:
            self.hwm_reset = False
        now = self._status()
        self.start = now
        self.anon_peak = now.get("RssAnon", 0)

    @staticmethod
    def _status() -> dict[str, int]:
        out: dict[str, int] = {}
        try:
            with open("/proc/self/status") as fh:
                for line in fh:
                    key, _, value = line.partition(":")
                    if key in ("VmRSS", "VmHWM", "RssAnon", "RssShmem"):
                        out[key] = int(value.split()[0]) * 1024
        except (OSError, ValueError):
            pass
        return out

    def sample(self) -> None:
        self.anon_peak = max(self.anon_peak, self._status().get("RssAnon", 0))

    def report(self) -> dict[str, Any]:
        end = self._status()
        return {
            "pid": os.getpid(),
            "rss_start": self.start.get("VmRSS"),
            "anon_start": self.start.get("RssAnon"),
            "anon_peak": max(self.anon_peak, end.get("RssAnon", 0)),
            "hwm": end.get("VmHWM") if self.hwm_reset else None,
            "shmem_end": end.get("RssShmem"),
        }


def _changed(path: str, before: os.stat_result, read: int, append_only: bool) -> str:
    """'ok', 'growing' (append-only prefix is consistent) or 'changed' (the bytes may be torn)."""
    try:
        after = os.stat(path)
    except OSError:
        return "changed"
    same_file = after.st_ino == before.st_ino and after.st_dev == before.st_dev
    if (
        same_file
        and read == before.st_size
        and after.st_size == before.st_size
        and after.st_mtime_ns == before.st_mtime_ns
        and after.st_ctime_ns == before.st_ctime_ns
    ):
        return "ok"
    if append_only and same_file and read == before.st_size and after.st_size >= read:
        return "growing"
    return "changed"


def _stream_one(root: str, rel: str, attempt: int, chunk: int, mem: MemoryWatch) -> Iterator[Message]:
    """Messages for one attempt at one file: begin, data chunks, end (with status and sha256)."""
    try:
        fd, st = _open_inside(root, rel)
    except FileNotFoundError:
        yield ("end", rel, {"status": "vanished", "error": "file disappeared after listing"})
        return
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        yield ("end", rel, {"status": "refused", "error": reason})
        return
    yield ("begin", rel, st.st_size, attempt)
    digest, read = hashlib.sha256(), 0
    try:
        while read < st.st_size:  # read exactly the size seen at open: growth is judged below
            buf = bytearray(min(chunk, st.st_size - read))
            got = os.readv(fd, [buf])
            if not got:
                break
            if got < len(buf):
                del buf[got:]
            digest.update(buf)
            read += got
            mem.sample()
            # A PickleBuffer goes into Ray's object store out of band (no pickling copy) and the
            # driver receives a zero-copy view of it: this doubled throughput on large files.
            yield ("data", pickle.PickleBuffer(buf))
    except OSError as exc:
        yield ("end", rel, {"status": "error", "error": f"read failed: {exc.strerror or exc}"})
        return
    finally:
        os.close(fd)
    status = _changed(os.path.join(root, rel), st, read, rel.endswith(APPEND_ONLY_SUFFIX))
    info = {
        "status": status,
        "sha256": digest.hexdigest(),
        "size": read,
        "mtime_ns": st.st_mtime_ns,
        "attempt": attempt,
    }
    yield ("end", rel, info)


def stream_files(
    output_dir: str, rels: list[str], chunk_size: int = 8 * MiB, retries: int = 3
) -> Iterator[list[Message]]:
    """Yield lists of messages with at most ``chunk_size`` bytes of file data: small files share one.

    A file whose stat changes while it is read is re-read up to ``retries`` times here, on the node,
    so the driver just sees a second ``begin`` for it. The last batch ends with ``("done", memory)``.
    """
    root = os.path.realpath(output_dir)
    mem = MemoryWatch()
    batch: list[Message] = []
    payload = 0
    for rel in rels:
        for attempt in range(retries + 1):
            status = "ok"
            for msg in _stream_one(root, rel, attempt, chunk_size, mem):
                size = chunk_view(msg[1]).nbytes if msg[0] == "data" else 0
                if batch and (payload + size > chunk_size or len(batch) >= MAX_BATCH_MESSAGES):
                    yield batch  # every batch carries at most chunk_size bytes of file data
                    batch, payload = [], 0
                batch.append(msg)
                payload += size
                if msg[0] == "end":
                    status = msg[2]["status"]
            if status != "changed":
                break
    batch.append(("done", mem.report()))
    yield batch
