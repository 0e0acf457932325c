"""The trainer's end of TokenSpeed's weight-update group: join as rank 0, broadcast in buckets.

TokenSpeed's engine ranks join at ``rank_offset + global_rank`` through ``rendezvous`` on a TCP
store and torch's ``_new_process_group_helper`` (``ts:runtime/execution/model_runner.py``), then
receive each tensor of an ``/update_weights_from_distributed`` request with ``broadcast(src=0)`` in
the order of its ``names``. We build the same kind of standalone group (never a split of the
training job's default group: its ``bound_device_id`` is cleared meanwhile, as TokenSpeed does on
its side), and run the HTTP request and our broadcasts concurrently: the request returns once the
engine received and loaded the bucket.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

GROUP_NAME = "rl_trace_weight_update_group"


@contextlib.contextmanager
def _no_default_group_split() -> Iterator[None]:
    import torch.distributed as dist

    pg, saved = None, None
    if dist.is_initialized():
        pg = dist.distributed_c10d._get_default_group()
        saved = getattr(pg, "bound_device_id", None)
        if saved is not None:
            pg.bound_device_id = None
    try:
        yield
    finally:
        if pg is not None and saved is not None:
            pg.bound_device_id = saved


def join_group(master_address: str, master_port: int, world_size: int, backend: str, group_name: str) -> Any:
    """Rank 0 of a new standalone process group (blocks until every engine rank joined)."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import (
        Backend,
        PrefixStore,
        _new_process_group_helper,
        _world,
        default_pg_timeout,
        rendezvous,
    )

    init = f"tcp://{master_address}:{master_port}"
    store, rank, size = next(rendezvous(init, 0, world_size, timeout=default_pg_timeout))
    store.set_timeout(default_pg_timeout)
    with _no_default_group_split():
        pg, _ = _new_process_group_helper(
            size,
            rank,
            [],
            Backend(backend),
            PrefixStore(group_name, store),
            group_name=group_name,
            backend_options=None,
            timeout=default_pg_timeout,
        )
    _world.pg_group_ranks[pg] = {i: i for i in range(size)}
    del dist  # imported for its side effects on torch.distributed's state
    return pg


def dtype_name(tensor: Any) -> str:
    """``torch.bfloat16`` → ``bfloat16``: what the engine passes to ``getattr(torch, name)``."""
    return str(tensor.dtype).removeprefix("torch.")


def bucket_body(bucket: list[tuple[str, Any]], group_name: str, version: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "names": [n for n, _ in bucket],
        "dtypes": [dtype_name(t) for _, t in bucket],
        "shapes": [list(t.shape) for _, t in bucket],
        "group_name": group_name,
        "flush_cache": False,
    }
    if version is not None:
        body["weight_version"] = str(version)
    return body


def broadcast_all(bucket: list[tuple[str, Any]], group: Any) -> None:
    import torch.distributed as dist

    for _, tensor in bucket:
        dist.broadcast(tensor, src=0, group=group)


def nbytes(tensor: Any) -> int:
    return int(tensor.numel() * tensor.element_size())


async def buckets(
    items: AsyncIterator[tuple[str, Any]], limit_bytes: int
) -> AsyncIterator[list[tuple[str, Any]]]:
    """Consecutive runs of ``items`` of at most ``limit_bytes`` each (a larger tensor goes alone), in
    order: the engine receives in the order of each request's ``names``."""
    bucket: list[tuple[str, Any]] = []
    size = 0
    async for name, tensor in items:
        n = nbytes(tensor)
        if bucket and size + n > limit_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += n
    if bucket:
        yield bucket
