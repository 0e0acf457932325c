"""An output and its manifest are one unit: committed together, checked together.

Why: the manifest is how the report knows what it reads (clock quality, which inputs were whole, the
events kept). A merge that failed used to write its manifest (``status=failed, events_kept=0``) over
the one that described the output it left in place, and a merge killed between its two renames left
a new output beside the previous merge's manifest.

So: the output is completed under a temp name; only a merge that succeeds (``--strict``: without
problems, or where no earlier output is there to keep) commits — the manifest, which records the
output's size and a CRC-32 of its last 64 KiB (for ``.gz`` outputs these hold the gzip trailer's
CRC of the whole content), goes to a temp file, the output is renamed into place, then the manifest.
A merge that fails leaves an earlier pair untouched and writes its own manifest beside them
(``<output>.failed.manifest.json``, :func:`failed_path`). Two renames cannot be one, so a ``kill -9``
between them leaves a new output with the earlier manifest: :func:`mismatch` tells, from the bytes,
and the readers say so and do not use that manifest.
"""

from __future__ import annotations

import os
import time
import zlib
from pathlib import Path
from typing import Any

from ...common.atomic import write_atomic
from ...common.encoding import dumps_pretty
from ...config import pause_requested
from ..output import owned

TAIL_BYTES = 64 << 10


def identity(path: Path) -> dict[str, int]:
    """What the manifest records of its output: size and the CRC-32 of the last ``TAIL_BYTES``."""
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(max(0, size - TAIL_BYTES))
        tail = f.read(TAIL_BYTES)
    return {"size": size, "tail_crc32": zlib.crc32(tail), "tail_bytes": len(tail)}


def mismatch(trace: Path, manifest: dict[str, Any]) -> str | None:
    """Why ``manifest`` does not describe ``trace`` (one clause), or None when it does (or cannot say:
    a manifest without the output's size)."""
    out = manifest.get("output")
    if not isinstance(out, dict):
        return None  # not one of ours to judge (a hand-written manifest)
    if out.get("written") is False:
        return f"its manifest is from a merge that wrote nothing (status {manifest.get('status')})"
    size = out.get("size")
    if not isinstance(size, int):
        return None
    try:
        now = identity(trace)
    except OSError as exc:
        return f"cannot read it ({exc.strerror or exc})"
    if now["size"] != size:
        return f"its manifest describes a {size}-byte output and the file has {now['size']} bytes"
    crc = out.get("tail_crc32")
    if isinstance(crc, int) and crc != now["tail_crc32"]:
        return "its manifest describes another output of the same size (the checksum of its end differs)"
    return None


def failed_path(manifest_path: Path) -> Path:
    """Where a failed merge's manifest goes when an earlier output (and its manifest) are kept."""
    name = manifest_path.name
    if name.endswith(".manifest.json"):  # still a manifest by name (never read back as an input)
        return manifest_path.with_name(name.removesuffix(".manifest.json") + ".failed.manifest.json")
    return manifest_path.with_name(name.removesuffix(".json") + ".failed.json")


def pause(point: str) -> None:
    """Tests only (``config.TEST_PAUSE_VAR``): stop here, after saying so, to be killed."""
    ready = pause_requested(point)
    if ready is not None:
        ready.write_text(str(os.getpid()))
        time.sleep(600)


def commit(pending: Path, out: Path, manifest_path: Path, manifest: dict[str, Any]) -> None:
    """The completed output ``pending`` and its manifest into place, output first (see the module)."""
    manifest["output"].update(identity(pending))
    mtmp = owned.temp_path(manifest_path)
    manifest_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        _write_synced(mtmp, dumps_pretty(manifest))  # complete before the output moves
        pause("output-complete")
        os.replace(pending, out)
        pause("output-renamed")
        os.replace(mtmp, manifest_path)
    except BaseException:
        mtmp.unlink(missing_ok=True)
        raise
    failed_path(manifest_path).unlink(missing_ok=True)  # an older failure's: this merge succeeded


def _write_synced(path: Path, data: bytes) -> None:
    with path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def record_failure(out: Path, manifest_path: Path, manifest: dict[str, Any]) -> Path:
    """Write a failed merge's manifest where it breaks no pair; returns where it went."""
    if out.exists():  # an earlier output stays, with the manifest that describes it
        manifest["output"]["kept_earlier"] = True
        manifest_path = failed_path(manifest_path)
    manifest_path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(manifest_path, dumps_pretty(manifest))
    return manifest_path
