"""Anchors that process records give their files: ``artifacts[].anchor_ns``, by the file's path
relative to the run directory (what the watch's follower calls it).

A file whose times count from its own origin (AReaL's perf traces, docs/areal.md) becomes step
markers only with its anchor. Records are small and rewritten atomically; each is read again only
when its size or mtime changed.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path
from typing import Any

import orjson

from ...capture.file_names import is_process_record
from .follow import walk


class RecordAnchors:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._seen: dict[str, tuple[int, int, dict[str, int]]] = {}  # record -> (size, mtime, anchors)

    def look(self) -> dict[str, int]:
        """file (relative to the run directory) -> anchor ns, from every process record now."""
        out: dict[str, int] = {}
        for rel, st in walk(self.root):
            if not is_process_record(posixpath.basename(rel)):
                continue
            known = self._seen.get(rel)
            if known is None or known[:2] != (st.st_size, st.st_mtime_ns):
                known = (st.st_size, st.st_mtime_ns, self._read(rel))
                self._seen[rel] = known
            out.update(known[2])
        return out

    def _read(self, rel: str) -> dict[str, int]:
        try:
            record: Any = orjson.loads((self.root / rel).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return {}  # being replaced, or not ours: the next look reads it again
        arts = record.get("artifacts") if isinstance(record, dict) else None
        out = {}
        folder = posixpath.dirname(rel)
        root = os.path.abspath(self.root)
        for art in arts if isinstance(arts, list) else ():
            if not isinstance(art, dict):
                continue
            anchor, path = art.get("anchor_ns"), art.get("path")
            if not isinstance(anchor, int) or isinstance(anchor, bool) or not isinstance(path, str):
                continue
            if path.startswith("/"):  # registered outside the output dir: under the run only if it is
                inner = os.path.relpath(path, root)
                if inner.startswith(".."):
                    continue
                out[inner.replace(os.sep, "/")] = anchor
            else:
                out[posixpath.normpath(posixpath.join(folder, path))] = anchor
        return out
