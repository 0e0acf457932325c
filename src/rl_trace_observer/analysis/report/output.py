"""The report as a library call: input → summary → files. ``rl-trace report`` is a shell over this.

summary = summarize("run.json.gz")   # or a span shard directory, a .pftrace with shards, a run directory
write_outputs(summary, html="r.html", json_path="r.json")
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

import orjson

from ...common.atomic import write_atomic
from ...common.collector_pause import collector_paused
from ...merge.shards.layout import ShardsError
from . import html as report_html
from .compute import build_summary
from .inputs import InputError, ResolvedInput, artifacts_section, clock_section, merged_first, resolve
from .load import TraceError, load_trace
from .shards import load_shards

__all__ = ["summarize", "write_outputs"]


def summarize(
    path: str | Path,
    *,
    manifest: str | Path | None = None,
    gpu: bool = True,
    only_steps: Collection[int | None] | None = None,
) -> dict[str, Any]:
    """Read a merged trace (and its manifest), or merge a run directory first; return the summary
    (``gpu=False``: without the GPU section, the benchmark's baseline; ``only_steps``: the per-step
    sections for these steps only, :func:`.compute.build_summary`).

    A file that cannot be read as it is (cut short, not one JSON document) is merged first: the
    summary then covers what the merger kept, ``source.read_error`` says why, and its artifacts
    section names the cut."""
    try:
        with resolve(path, manifest) as src:
            return _summarize(src, gpu, only_steps)
    except ShardsError as exc:  # a damaged shard document, no whole part: one line naming the file
        raise InputError(str(exc)) from None
    except TraceError as exc:
        if not Path(path).is_file():
            raise
        error = str(exc)
    try:
        with merged_first(Path(path)) as src:
            summary = _summarize(src, gpu, only_steps)
    except InputError:
        raise TraceError(error) from None  # not a trace at all: the reader's own words
    summary["source"]["read_error"] = error
    return summary


def _summarize(
    src: ResolvedInput, gpu: bool = True, only_steps: Collection[int | None] | None = None
) -> dict[str, Any]:
    with collector_paused():  # millions of objects that live until the summary is made
        data = load_shards(src.shards, gpu) if src.shards is not None else load_trace(src.trace, gpu=gpu)
        summary = build_summary(
            data,
            clock=clock_section(src.manifest, data.metadata),
            artifacts=artifacts_section(src.manifest),
            only_steps=only_steps,
        )
    summary["source"]["path"] = str(src.merged_from or src.trace)
    summary["source"]["manifest"] = (
        str(src.manifest_path) if src.merged_from is None and src.manifest_path else None
    )
    summary["source"]["merged_by_report"] = src.merged_from is not None
    summary["source"]["manifest_note"] = src.manifest_note  # a manifest beside it that is not its own
    summary["source"]["missing_parts"] = data.missing_parts  # damaged span shard parts left out
    summary["source"]["missing_note"] = data.missing_note
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
