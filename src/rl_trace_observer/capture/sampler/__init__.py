"""The metric sampler: Prometheus targets, GPUs (NVML) and the host (psutil), once per node and run.

Never in a training thread: training processes only join (:func:`.node.join`: a daemon thread that
lists the process, takes a shared ``flock`` and hands over targets and profiling flags); the sampling
itself runs in its own process (:mod:`.process`), started by whichever member finds none running,
and writes through the capture writer (:mod:`..streams`). Its optional libraries (prometheus_client,
nvidia-ml-py, psutil: the ``metrics`` extra) are imported there only. See docs/metrics.md.
"""

from typing import Any

from ..recorder import after_configure
from .node import join, leave, mark_profiling, node_dir, publish_targets, wait_for_sampler


def join_sampler(config: Any, recorder: Any) -> None:
    """Every new recorder makes its process a member of the node's sampler (:func:`.node.join`: a
    thread is started, nothing waits); ``capture/__init__`` imports this package, so it always runs."""
    join(config, run_id=recorder.record().get("run_id"))


after_configure(join_sampler)

__all__ = ["join", "leave", "mark_profiling", "node_dir", "publish_targets", "wait_for_sampler"]
