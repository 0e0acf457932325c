"""Where collected files land: a local directory or any fsspec URL, never a partial file under its name.

Landing strategy per kind of store (chosen once, in ``Destination.__init__``):

* local file system: write ``<node dir>/.rl-trace-partial/.<token>.part``, then ``os.replace`` onto
  the final name (same file system, so the rename is atomic). No fsync per file: it cost 20-70% of
  the throughput, and what it protects against (a crash of the destination machine leaving a short
  or empty file under the final name) is caught anyway, because a re-run re-copies every file whose
  landed size differs from the index;
* object stores (s3, gs, azure, ...): write straight to the final key. An object only becomes visible
  when its single PUT or multipart upload completes on ``close()``; on failure we call ``discard()``
  (abort the upload) and mark the file closed, because fsspec's ``close`` (also run on garbage
  collection) would publish what was written so far;
* anything else (``memory://``, ftp, ...): write a temp key, close it, then ``mv`` onto the final key.

Per node directory a sidecar ``.rl-trace-collect-index.json`` records, for every verified file, the
source size/mtime and the sha256 of the bytes landed; a re-run skips files whose source stat and
landed size still match, which makes collection idempotent and resumable.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

INDEX_NAME = ".rl-trace-collect-index.json"  # both names are also in collect_node.COLLECTED_MARKERS
INDEX_SCHEMA = "rl-trace-collect-index/1"
PARTIAL_DIR = ".rl-trace-partial"
REPORT_NAME = ".rl-trace-collect-report.json"
RESERVED_PREFIX = ".rl-trace-"
OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "r2", "b2"})


def safe_name(text: str) -> str:
    """A single path component made of ``[A-Za-z0-9._-]`` that is never hidden, ``.`` or ``..``."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", text).lstrip(".")
    return name or "_"


class Landing:
    """One file being written: ``write`` chunks, then exactly one of ``commit`` or ``abort``."""

    def __init__(self, dest: Destination, final: str, partial_dir: str) -> None:
        self.dest, self.final = dest, final
        self.temp = final
        self._fd: int | None = None
        self._fh: Any = None
        if dest.mode != "direct":
            # hidden name too: readers that skip dot-files (the merger) never see a partial file
            self.temp = f"{partial_dir}/.{secrets.token_hex(8)}.part"
        if dest.mode == "local":
            os.makedirs(os.path.dirname(self.temp), exist_ok=True)
            self._fd = os.open(self.temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        else:
            dest.fs.makedirs(os.path.dirname(self.temp), exist_ok=True)
            self._fh = dest.fs.open(self.temp, "wb")

    def write(self, data: bytes | memoryview) -> None:
        if self._fd is not None:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
        else:
            self._fh.write(data)

    def commit(self) -> None:
        dest = self.dest
        if self._fd is not None:
            os.close(self._fd)  # no fsync: see the module docstring on durability
            self._fd = None
            os.makedirs(os.path.dirname(self.final), exist_ok=True)
            os.replace(self.temp, self.final)
            return
        self._fh.close()
        self._fh = None
        if dest.mode == "rename":
            dest.fs.makedirs(os.path.dirname(self.final), exist_ok=True)
            dest.fs.mv(self.temp, self.final)

    def abort(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            _unlink(self.temp)
        elif self._fh is not None:
            fh, self._fh = self._fh, None
            if self.dest.mode == "direct":
                fh.discard()  # aborts a multipart upload (s3fs, gcsfs)
                try:
                    # fsspec's buffered files close() on garbage collection, which would publish
                    # what was written so far: mark it closed so nothing is ever uploaded
                    fh.closed = True
                except AttributeError:
                    pass
            else:
                try:
                    fh.close()
                finally:
                    self.dest.remove(self.temp)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class Destination:
    """``DEST`` resolved once through fsspec; all paths below are the file system's own paths."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.fs, root = fsspec.core.url_to_fs(url)
        self.root = root.rstrip("/") or "/"
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        if isinstance(self.fs, LocalFileSystem):
            self.mode = "local"
        elif OBJECT_STORES.intersection(protocols):
            self.mode = "direct"
        else:
            self.mode = "rename"

    def display_run_dir(self, run_id: str) -> str:
        """``DEST/<run_id>`` written the way the user wrote DEST, ready for ``rl-trace merge``."""
        return f"{self.url.rstrip('/')}/{safe_name(run_id)}"

    def run_dir(self, run_id: str) -> str:
        return f"{self.root}/{safe_name(run_id)}"

    def node_dir(self, run_id: str, label: str) -> str:
        return f"{self.run_dir(run_id)}/{label}"

    def landing(self, run_id: str, label: str, rel: str) -> Landing:
        node_dir = self.node_dir(run_id, label)
        return Landing(self, f"{node_dir}/{rel}", f"{node_dir}/{PARTIAL_DIR}")

    def write_bytes(self, final: str, data: bytes) -> None:
        """A small file (index, report) landed the same atomic way as collected files."""
        partial_dir = f"{os.path.dirname(final)}/{PARTIAL_DIR}"
        landing = Landing(self, final, partial_dir)
        try:
            landing.write(data)
        except BaseException:
            landing.abort()
            raise
        landing.commit()
        if self.mode == "local":
            try:
                os.rmdir(partial_dir)  # only when empty: another thread may be landing files there
            except OSError:
                pass

    def remove(self, path: str) -> None:
        try:
            self.fs.rm(path)
        except (OSError, FileNotFoundError):
            pass

    def labels(self, run_id: str) -> list[str]:
        """Node directories already present under ``DEST/<run_id>`` (from earlier collections)."""
        try:
            entries = self.fs.ls(self.run_dir(run_id), detail=True)
        except (OSError, FileNotFoundError):
            return []
        names = [
            str(e["name"]).rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory"
        ]
        return sorted(n for n in names if not n.startswith("."))

    def landed(self, run_id: str, label: str) -> dict[str, int]:
        """Relative path -> size of every file under a node directory (one listing call)."""
        base = self.node_dir(run_id, label)
        try:
            found = self.fs.find(base, detail=True)
        except (OSError, FileNotFoundError):
            return {}
        out: dict[str, int] = {}
        for path, info in found.items():
            rel = str(path)[len(base) + 1 :]
            if rel and not rel.startswith(RESERVED_PREFIX):
                out[rel] = int(info.get("size") or 0)
        return out

    def load_index(self, run_id: str, label: str) -> dict[str, dict[str, Any]]:
        path = f"{self.node_dir(run_id, label)}/{INDEX_NAME}"
        try:
            with self.fs.open(path, "rb") as fh:
                data = json.loads(fh.read())
        except (OSError, FileNotFoundError, ValueError):
            return {}  # no or unreadable index: everything is re-verified, nothing is lost
        files = data.get("files") if isinstance(data, dict) else None
        return {k: v for k, v in files.items() if isinstance(v, dict)} if isinstance(files, dict) else {}

    def save_index(self, run_id: str, label: str, files: dict[str, dict[str, Any]]) -> None:
        body = {"schema": INDEX_SCHEMA, "node": label, "files": dict(sorted(files.items()))}
        text = json.dumps(body, indent=1).encode()
        self.write_bytes(f"{self.node_dir(run_id, label)}/{INDEX_NAME}", text)

    def clear_partials(self, run_id: str, label: str) -> None:
        """Temp files left by a collector that was killed; only ever under ``.rl-trace-partial``."""
        path = f"{self.node_dir(run_id, label)}/{PARTIAL_DIR}"
        try:
            if self.fs.exists(path):
                self.fs.rm(path, recursive=True)
        except (OSError, FileNotFoundError):
            pass
