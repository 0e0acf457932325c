"""pyarrow, imported on first use: the core install (capture, merge, CLI) works without it."""

from __future__ import annotations

from typing import Any

INSTALL_HINT = "span shards need pyarrow: pip install 'rl-trace-observer[shards]'"


class ShardsUnavailable(RuntimeError):
    """pyarrow is not installed; the message says how to install it."""


def pyarrow() -> Any:
    try:
        import pyarrow as pa
    except ImportError as exc:
        raise ShardsUnavailable(INSTALL_HINT) from exc
    return pa


def parquet() -> Any:
    pyarrow()
    import pyarrow.parquet as pq

    return pq


def compute() -> Any:
    pyarrow()
    import pyarrow.compute as pc

    return pc
