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
    from .merge.pipeline.local import merge, merge_steps

__all__ = ["MergeOptions", "MergeResult", "UsageError", "merge", "merge_steps", "ray_merge", "report"]


def __getattr__(name: str) -> Any:
    """``merge`` and ``merge_steps`` are the pipeline's own functions (one definition each, in
    :mod:`.merge.pipeline.local`), imported on first use so that importing this module stays light:
    ``merge(inputs, output, options)`` writes ``output`` (``.pftrace[.gz]``, ``.json[.gz]``) and
    ``<output>.manifest.json``; one span shard directory as the input writes a view of it instead;
    ``merge_steps`` is ``--split-steps`` (one output per step)."""
    if name in ("merge", "merge_steps"):
        from .merge.pipeline import local

        return getattr(local, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
