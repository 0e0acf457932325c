"""One local multi-node Ray cluster for a test module: named nodes (a custom resource each, so tasks
can be placed on them), one CPU each, no dashboard, a short private temp dir, always shut down."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def local_ray_cluster(
    names: list[str] | tuple[str, ...], prefix: str
) -> Iterator[tuple[Any, dict[str, Any], str]]:
    """(cluster, {name: node}, RAY_TMPDIR) with ``ray`` connected; ``names[0]`` is the head node."""
    import ray
    from ray.cluster_utils import Cluster

    saved = os.environ.get("RAY_TMPDIR")
    ray_tmp = tempfile.mkdtemp(prefix=prefix, dir="/tmp")  # short: unix socket paths are limited
    os.environ["RAY_TMPDIR"] = ray_tmp
    os.environ["RAY_AUTH_MODE"] = "disabled"
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "resources": {names[0]: 1}, "include_dashboard": False},
    )
    try:
        nodes = {names[0]: cluster.head_node}
        for name in names[1:]:
            nodes[name] = cluster.add_node(num_cpus=1, resources={name: 1}, include_dashboard=False)
        ray.init(address=cluster.address, log_to_driver=False)
        yield cluster, nodes, ray_tmp
    finally:
        ray.shutdown()
        cluster.shutdown()
        if saved is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved
        shutil.rmtree(ray_tmp, ignore_errors=True)
