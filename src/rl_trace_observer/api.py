"""The library's public API, from one short path (``import rl_trace_observer as rto`` gives the same
names, loaded on first use):

    result = rto.merge(["collected/run-1"], "run.pftrace.gz", rto.MergeOptions(shards="run-shards"))
    summary = rto.report("run-shards", html="report.html", json_path="report.json")

:func:`merge` is ``rl-trace merge`` (on this machine), :func:`ray_merge` is ``rl-trace merge --ray``
(on a running Ray cluster's nodes; needs Ray), :func:`report` is ``rl-trace report``. Their options and
results are plain dataclasses; bad arguments raise :class:`UsageError`; problems with the data are in
the result's manifest, never raised.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .merge.options import MergeOptions, MergeResult, UsageError

if TYPE_CHECKING:
    from .cluster.merge import ClusterOptions

__all__ = ["MergeOptions", "MergeResult", "UsageError", "merge", "merge_steps", "ray_merge", "report"]


def merge(inputs: list[str], output: str, options: MergeOptions | None = None) -> MergeResult:
    """Every artifact under ``inputs`` (files, directories, fsspec URLs) → ``output`` (``.pftrace``,
    ``.pftrace.gz``, ``.json``, ``.json.gz``) and ``<output>.manifest.json``. One span shard directory
    as the input writes a view of it instead (``--step``/``--role`` in ``options``; ``.tar``: an
    archive with one file per host)."""
    from .merge.pipeline.local import merge as merge_here

    return merge_here(inputs, output, options)


def merge_steps(inputs: list[str], output: str, options: MergeOptions | None = None) -> list[MergeResult]:
    """``--split-steps``: one output per step (``run.step3.pftrace.gz``, ...)."""
    from .merge.pipeline.local import merge_steps as split

    return split(inputs, output, options)


def ray_merge(
    output: str, options: MergeOptions | None = None, cluster: ClusterOptions | None = None
) -> MergeResult:
    """The merge of a running Ray cluster's node-local outputs, converted on the nodes."""
    from .cluster.merge import ray_merge as on_the_nodes

    return on_the_nodes(output, options, cluster)


def report(
    path: str | Path,
    *,
    manifest: str | Path | None = None,
    html: str | Path | None = None,
    json_path: str | Path | None = None,
) -> dict[str, Any]:
    """Where each step's time went, for a merged trace, its span shards or a run directory (merged
    first): the JSON summary (schema ``rl-trace-report/4``), also written to ``html``/``json_path``."""
    from .analysis.report.output import summarize, write_outputs

    summary = summarize(path, manifest=manifest)
    write_outputs(summary, html=html, json_path=json_path)
    return summary
