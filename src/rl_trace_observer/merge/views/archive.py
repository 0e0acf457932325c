"""A Perfetto v58+ trace archive from span shards: ``rl-trace merge SHARDS_DIR -o run.tar``.

Newer Perfetto (v58+) merges a TAR of trace files itself, told by a ``perfetto_manifest.json`` which
machine each file is and how its clock relates to a reference file's (one fixed ``offset_ns`` per
file). For users of those versions the archive holds one ``<host>.pftrace`` per host (Perfetto shows
each as its own machine) and the manifest, which carries our measured offsets:

- every host's file is written in that host's own clock as we measured it: the merged (corrected)
  times plus the host's offset from the reference (``timeline.clock.hosts.<host>.offset_ns``, the
  tightest measurement), and the manifest relates it to the reference host's file by minus that
  offset — so Perfetto shows exactly the merged timeline;
- what a manifest cannot state stays baked into the per-host times instead: drift (one fixed offset
  per file) and per-artifact alignment (one offset per machine, not per profiler file). That is the
  archive's loss: changing a host's offset in Perfetto's merge dialog moves the whole host by a
  constant and cannot undo or redo either correction. The merged ``.pftrace`` states both in full.

The manifest is the archive's first member (Perfetto applies it before any trace, wherever it is).
"""

from __future__ import annotations

import io
import json
import tarfile
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ...common.atomic import atomic_output
from ..options import MergeOptions, MergeResult, UsageError
from ..shards.dataset import Shards
from .view import Empty, ViewSelection, write_rows, write_view

MANIFEST_MEMBER = "perfetto_manifest.json"
CLOCK = "BOOTTIME"  # what packets without a clock id are on: a file's own trace clock


def host_offsets(shards: Shards) -> dict[str, int]:
    """Each host's measured offset from the reference clock (0 where none was applied)."""
    hosts = {p["host"] for p in shards.parts()}
    clock = ((shards.manifest() or {}).get("timeline") or {}).get("clock") or {}
    measured = clock.get("hosts") or {}
    out = {}
    for host in sorted(h for h in hosts if h is not None):
        h = measured.get(host) or {}
        out[host] = int(h.get("offset_ns") or 0) if h.get("applied") else 0
    return out


def reference_host(shards: Shards, offsets: dict[str, int]) -> str:
    clock = ((shards.manifest() or {}).get("timeline") or {}).get("clock") or {}
    ref = (clock.get("reference") or {}).get("host")
    return ref if ref in offsets else min(offsets, key=lambda h: (offsets[h] != 0, h))


def merge_archive(shards_dir: str, output: str, opts: MergeOptions) -> MergeResult:
    """``-o run.tar`` from span shards, with its manifest (``archive``: files, reference, the
    ``perfetto_manifest``)."""
    if opts.steps or opts.roles:
        raise UsageError(f"{output}: a Perfetto archive holds the whole run (no --step or --role)")

    def make(shards: Shards, out: Path, manifest: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
        made = write_archive(shards_dir, output)
        counts = made.pop("counts")
        manifest["archive"] = made
        return counts, []

    return write_view(shards_dir, output, opts, "tar", make)


def write_archive(shards_dir: str, output: str) -> dict[str, Any]:
    """Write the archive; returns what went in (for the view's manifest)."""
    shards = Shards.open(shards_dir)
    offsets = host_offsets(shards)
    if not offsets:
        raise Empty()
    ref = reference_host(shards, offsets)
    base = shards.base_ns + min(0, *offsets.values())  # no host's own time falls below it
    files: list[dict[str, Any]] = []
    totals: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="rl-trace-archive-") as tmp:
        for host, off in offsets.items():
            name = f"{quote(host, safe='')}.pftrace"
            try:
                counts, _ = write_rows(
                    shards,
                    Path(tmp) / name,
                    "pftrace",
                    ViewSelection(hosts=(host,), shift_ns=off, base_ns=base),
                )
            except Empty:
                continue
            for key in ("events_kept", "slices", "flows", "counter_samples", "processes", "threads"):
                totals[key] = totals.get(key, 0) + int(counts.get(key) or 0)
            files.append({"path": name, "host": host, "offset_ns": off, "events": counts["events_kept"]})
        if not files:
            raise Empty()
        ref_file = next((f["path"] for f in files if f["host"] == ref), files[0]["path"])
        manifest = perfetto_manifest(files, ref_file, shards)
        with (
            atomic_output(Path(output)) as raw,
            tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            _add_bytes(tar, MANIFEST_MEMBER, json.dumps(manifest, indent=1).encode())
            for f in files:
                path = Path(tmp) / f["path"]
                info = tar.gettarinfo(str(path), arcname=f["path"])
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                with open(path, "rb") as fh:
                    tar.addfile(info, fh)
    return {"files": files, "reference": ref_file, "counts": totals, "perfetto_manifest": manifest}


def perfetto_manifest(files: list[dict[str, Any]], ref_file: str, shards: Shards) -> dict[str, Any]:
    """``perfetto_manifest`` version 1: machines by host, each file related to the reference's clock."""
    entries = []
    for f in files:
        entry: dict[str, Any] = {"path": f["path"], "machine": {"name": f["host"]}}
        if f["path"] != ref_file:
            # the host's clock reads T when the reference's reads T - offset: offset_ns is minus ours
            entry["clocks"] = {
                "clock": CLOCK,
                "sync_to": {"file": ref_file, "clock": CLOCK},
                "offset_ns": -f["offset_ns"],
            }
        entries.append(entry)
    attributes: dict[str, Any] = {"rl_trace.tool": "rl-trace-observer", "rl_trace.base_ns": shards.base_ns}
    runs = shards.doc.get("runs") or []
    if len(runs) == 1:
        attributes["rl_trace.run_id"] = str(runs[0])
    attributes["rl_trace.note"] = "drift and per-artifact alignment are baked into each host's times"
    return {
        "perfetto_manifest": {
            "version": 1,
            "trace_time": {"clock": CLOCK, "file": ref_file},
            "files": entries,
            "attributes": attributes,
        }
    }


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))
