"""The ``--ray`` options that ``merge`` and ``watch`` share (same names, same help, same meaning), and
the cluster options they make: one declaration, so the two commands cannot drift apart."""

from __future__ import annotations

from typing import Annotated, Any

import typer

Address = Annotated[str | None, typer.Option("--address", help="--ray: cluster address (default: auto).")]
OutputDir = Annotated[
    str | None,
    typer.Option(
        "--output-dir", help="--ray: directory to read on every node (default: RL_TRACE_OUTPUT_DIR)."
    ),
]
NodeDir = Annotated[
    list[str] | None,
    typer.Option("--node-dir", help="--ray: KEY=DIR for one node (node id, resource or IP)."),
]
NodeWorkers = Annotated[
    int, typer.Option("--node-workers", min=0, help="--ray: worker processes per node (each ~0.5 GB more).")
]
StallTimeout = Annotated[
    float,
    typer.Option("--stall-timeout", min=1.0, help="--ray: seconds of silence after which a node is stalled."),
]


def cluster_options(
    address: str | None, output_dir: str | None, node_dir: list[str] | None, node_workers: int, stall_s: float
) -> Any:
    """``ClusterOptions`` from those options (``--node-dir`` parsed: a bad one is a usage error)."""
    from ..cluster.merge import ClusterOptions
    from .node_dirs import node_dirs

    return ClusterOptions(
        address=address,
        output_dir=output_dir,
        node_output_dirs=node_dirs(node_dir),
        node_workers=node_workers,
        stall_timeout_s=stall_s,
    )
