"""The driver's store of finished jobs: what makes a Ray merge resumable.

Beside the output, ``.<output name>.ray/`` holds, per job key, the job's output piece
(``<key>.piece``) and its result (``<key>.done``: pickled, written last and atomically, so its
presence means the piece and the job's span shard parts are complete). The shard parts themselves
land in the shard directory under their final names (the key is in each name). A job's key is a
digest of everything that decides its bytes (:mod:`.keys`): a re-run with the same inputs and
options finds the jobs it already has and runs only the others. The store is removed when a merge
completes with every job; it stays while any node's jobs are missing.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

from .. import __version__
from .node import JobDone

_DONE_VERSION = 1


class StoreError(RuntimeError):
    """A node sent something the store did not expect (a bug, or a corrupt transfer)."""


class Store:
    def __init__(self, output: Path, shards: Path | None) -> None:
        self.root = output.parent / f".{output.name}.ray"
        self.shards = shards

    def piece(self, key: str) -> Path:
        return self.root / f"{key}.piece"

    def _done_path(self, key: str) -> Path:
        return self.root / f"{key}.done"

    def get(self, key: str) -> JobDone | None:
        """A job finished earlier, when everything it left is still there."""
        try:
            version, tool, done = pickle.loads(self._done_path(key).read_bytes())
        except (OSError, pickle.UnpicklingError, EOFError, ValueError, AttributeError, ImportError):
            return None
        if version != _DONE_VERSION or tool != __version__ or not isinstance(done, JobDone):
            return None
        if not self.piece(key).is_file() or self.piece(key).stat().st_size != done.piece_size:
            return None
        if done.shards and (
            self.shards is None or not all((self.shards / p["path"]).is_file() for p in done.shards)
        ):
            return None
        return done

    def put(self, done: JobDone) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self._done_path(done.key)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(pickle.dumps((_DONE_VERSION, __version__, done), protocol=pickle.HIGHEST_PROTOCOL))
        os.replace(tmp, path)

    def target(self, rel: str) -> Path:
        """Where a file a node sends lands: its piece in the store, its shard parts in the shard dir."""
        if rel.startswith("shards/"):
            if self.shards is None:
                raise StoreError(f"node sent span shards ({rel}) that were not asked for")
            return self.shards / rel[len("shards/") :]
        if "/" in rel or not rel.endswith(".piece"):
            raise StoreError(f"node sent an unexpected file {rel!r}")
        return self.root / rel

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class Landing:
    """One file arriving from a node: written under a temporary name, checked, then renamed."""

    def __init__(self, final: Path, size: int) -> None:
        self.final, self.size = final, size
        final.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = final.with_name(f".{final.name}.{os.getpid()}.recv")
        self.f: Any = open(self.tmp, "wb")  # noqa: SIM115 - closed in commit/abort
        self.digest = hashlib.sha256()
        self.received = 0

    def write(self, view: memoryview) -> None:
        self.f.write(view)
        self.digest.update(view)
        self.received += view.nbytes

    def commit(self, sha256: str) -> None:
        self.f.close()
        if self.digest.hexdigest() != sha256 or self.received != self.size:
            self.tmp.unlink(missing_ok=True)
            raise StoreError(f"{self.final.name}: the bytes received differ from the bytes the node sent")
        os.replace(self.tmp, self.final)

    def abort(self) -> None:
        self.f.close()
        self.tmp.unlink(missing_ok=True)
