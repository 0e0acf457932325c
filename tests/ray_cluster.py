"""One local multi-node Ray cluster for a test module: named nodes (a custom resource each, so tasks
can be placed on them), one CPU each, no dashboard, a short private temp dir, always shut down."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STARTUP_ATTEMPTS = 3  # Ray waits a hard-coded 30 s for a raylet to register (ray/_private/node.py)


def _kill_leftovers(ray_tmp: str) -> None:
    """End the processes of a cluster that never came up: ours, named by our private temp dir."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if ray_tmp.encode() in cmdline:
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except OSError:
                pass


def _start(names: list[str] | tuple[str, ...], prefix: str) -> tuple[Any, dict[str, Any], str]:
    """A started cluster; on an overloaded machine Ray's own start-up wait can run out (its 30 s are not
    what any test here checks): then that attempt is torn down and the cluster started afresh."""
    from ray.cluster_utils import Cluster

    for attempt in range(STARTUP_ATTEMPTS):
        ray_tmp = tempfile.mkdtemp(prefix=prefix, dir="/tmp")  # short: unix socket paths are limited
        os.environ["RAY_TMPDIR"] = ray_tmp
        cluster = None
        try:
            cluster = Cluster(
                initialize_head=True,
                head_node_args={"num_cpus": 1, "resources": {names[0]: 1}, "include_dashboard": False},
            )
            nodes = {names[0]: cluster.head_node}
            for name in names[1:]:
                nodes[name] = cluster.add_node(num_cpus=1, resources={name: 1}, include_dashboard=False)
            return cluster, nodes, ray_tmp
        except Exception as exc:
            if "timed out during startup" not in str(exc) or attempt + 1 == STARTUP_ATTEMPTS:
                raise
            if cluster is not None:
                cluster.shutdown()
            _kill_leftovers(ray_tmp)
            shutil.rmtree(ray_tmp, ignore_errors=True)
    raise AssertionError("unreachable")  # pragma: no cover


@contextlib.contextmanager
def local_ray_cluster(
    names: list[str] | tuple[str, ...], prefix: str
) -> Iterator[tuple[Any, dict[str, Any], str]]:
    """(cluster, {name: node}, RAY_TMPDIR) with ``ray`` connected; ``names[0]`` is the head node."""
    import ray

    saved = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    cluster, nodes, ray_tmp = _start(names, prefix)
    try:
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
