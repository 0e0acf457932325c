"""The report as a library call: input → summary → files. ``rl-trace report`` is a shell over this.

summary = summarize("run.json.gz")   # or a span shard directory, a .pftrace with shards, a run directory
write_outputs(summary, html="r.html", json_path="r.json")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from ...capture.atomic import write_atomic
from . import html as report_html
from .compute import build_summary
from .inputs import artifacts_section, clock_section, resolve
from .load import load_trace
from .shards import load_shards

__all__ = ["summarize", "write_outputs"]


def summarize(path: str | Path, *, manifest: str | Path | None = None, gpu: bool = True) -> dict[str, Any]:
    """Read a merged trace (and its manifest), or merge a run directory first; return the summary
    (``gpu=False``: without the GPU section, the benchmark's baseline)."""
    with resolve(path, manifest) as src:
        data = load_shards(src.shards, gpu) if src.shards is not None else load_trace(src.trace, gpu=gpu)
        summary = build_summary(
            data,
            clock=clock_section(src.manifest, data.metadata),
            artifacts=artifacts_section(src.manifest),
        )
        summary["source"]["path"] = str(src.merged_from or src.trace)
        summary["source"]["manifest"] = (
            str(src.manifest_path) if src.merged_from is None and src.manifest_path else None
        )
        summary["source"]["merged_by_report"] = src.merged_from is not None
    return summary


def json_bytes(summary: dict[str, Any]) -> bytes:
    return orjson.dumps(summary, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)


def write_outputs(
    summary: dict[str, Any], *, html: str | Path | None = None, json_path: str | Path | None = None
) -> list[Path]:
    """Write the requested files atomically; returns their paths."""
    written = []
    if html is not None:
        write_atomic(Path(html), report_html.render(summary).encode("utf-8"))
        written.append(Path(html))
    if json_path is not None:
        write_atomic(Path(json_path), json_bytes(summary))
        written.append(Path(json_path))
    return written
