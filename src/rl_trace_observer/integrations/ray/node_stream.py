"""Draining a node-pinned streaming task: batches of messages, a silence limit, a clear end.

Collection (``collect``) and the cluster merge (``merge --ray``) both run one generator task per node
and read its batches on the driver; a node that stays silent for the stall timeout is treated as lost
while the other nodes go on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Stalled(RuntimeError):
    """The node sent nothing for ``stall_timeout_s``: treated like a lost node, the others go on."""


def pinned(remote: Any, node_id: str, in_flight: int) -> Any:
    """``remote`` as a task on ``node_id`` only, at most ``in_flight`` batches ahead of the driver."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return remote.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        _generator_backpressure_num_objects=in_flight,
    )


def drain(
    ray: Any,
    gen: Any,
    *,
    finished: Callable[[], bool],
    handle: Callable[[Any], None],
    stall_timeout_s: float,
    what: str,
) -> None:
    """Hand every message of ``gen``'s batches to ``handle`` until ``finished()``; raise
    :class:`Stalled` after ``stall_timeout_s`` of silence, RuntimeError when the task ends early."""
    while not finished():
        ready, _ = ray.wait([gen], timeout=stall_timeout_s)
        if not ready:
            raise Stalled(f"no {what} from the node for {stall_timeout_s:g} s")
        try:
            ref = next(gen)
        except StopIteration:
            raise RuntimeError("the node's task ended without its final message") from None
        batch = ray.get(ref)
        del ref
        for msg in batch:
            handle(msg)
        del batch
