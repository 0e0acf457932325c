"""The driver's last step for a Ray merge: each finished job's stored piece, handed to the merge's one
stitcher (:class:`rl_trace_observer.merge.job.stitch.Stitcher`) in plan order, as a local merge hands
over its workers' part files — so the bytes are the same.

A piece is hard-linked out of the store before the stitcher consumes (and deletes) it, so the store
keeps it for a re-run until the merge is complete.
"""

from __future__ import annotations

import os

from ..merge.output.spill import Spilled
from .node import JobDone
from .store import Store


def linked_piece(store: Store, key: str, done: JobDone) -> Spilled:
    """A throw-away name for the stored piece: the stitcher deletes what it copied."""
    src = store.piece(key)
    link = src.with_name(f".{src.name}.{os.getpid()}.out")
    link.unlink(missing_ok=True)
    try:
        os.link(src, link)
    except OSError:  # no hard links here: copy
        link.write_bytes(src.read_bytes())
    return Spilled(str(link), done.piece_size, done.deflated)
