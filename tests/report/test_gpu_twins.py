"""The GPU loaders' compiled fast paths (``_gpu_native``: the JSON loader's one-pass columns, the
shards' args scan over Arrow's buffers, the union of busy columns) against their reference paths on
the same input: the kernel store they fill must be identical, column for column."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rl_trace_observer.analysis.gpu import loops
from rl_trace_observer.analysis.gpu.store import KernelStore
from rl_trace_observer.analysis.report import load, shards
from rl_trace_observer.analysis.report.stream import Event
from rl_trace_observer.common import twins

from ..conftest import requires

TWIN = twins.twin("rl_trace_observer.analysis.gpu._gpu_native")
needs_twin = pytest.mark.skipif(TWIN is None, reason="the compiled twin is not built")


@contextmanager
def _python() -> Iterator[None]:
    saved = twins.twin
    twins.twin = lambda name: None  # type: ignore[assignment]
    try:
        yield
    finally:
        twins.twin = saved  # type: ignore[assignment]


def _columns(store: KernelStore) -> tuple[Any, ...]:
    cols = (
        "k_pid",
        "k_tid",
        "k_ts",
        "k_dur",
        "k_name",
        "k_corr",
        "k_stream",
        "l_pid",
        "l_tid",
        "l_ts",
        "l_dur",
        "l_corr",
    )
    return (*(list(getattr(store, c)) for c in cols), store.names, store.kinds, store.others, store.untracked)


_ids = st.sampled_from([None, -2, -1, 0, 1, 2, 3, 7, 7, True, 2.0, "7", 2**64])
_args = st.one_of(
    st.just(None),
    st.just("not json"),
    st.builds(
        lambda s, c: json.dumps({k: v for k, v in (("stream", s), ("correlation", c)) if v is not None}),
        _ids,
        _ids,
    ),
)
_event = st.builds(
    lambda pid, tid, ts, dur, name, cat, args: Event(
        "X", name, cat, pid, tid, ts, dur, msgspec.Raw(args.encode()) if args is not None else msgspec.UNSET
    ),
    st.one_of(st.integers(0, 600), st.integers(0, 600), st.integers(0, 600), st.just("gpu")),
    st.integers(0, 9),
    st.one_of(
        st.integers(0, 10**6),
        st.floats(0, 2**34, allow_nan=False),
        st.integers(0, 10**6).map(lambda v: v / 1000),
    ),
    st.one_of(st.none(), st.just(0), st.integers(-5, 500), st.floats(-1, 500, allow_nan=False)),
    st.sampled_from(["gemm", "ncclKernel_AllReduce", "Memcpy HtoD", "gemm", "gemm", "nccl", "x", "y", 7]),
    st.sampled_from(["kernel", "gpu_memcpy", "cuda_runtime"]),
    _args,
)


@needs_twin
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(_event, max_size=4), st.lists(_event, max_size=4)), max_size=4))
@example(
    [([Event("X", "gemm", "kernel", 5, 3, 10.5, 2, msgspec.Raw(b'{"stream": 7, "correlation": -2}'))], [])]
)
def test_json_loader_columns_equal_the_reference(chunks: list[tuple[list[Event], list[Event]]]) -> None:
    def fill() -> tuple[Any, ...]:
        store = KernelStore()
        try:
            for kernels, launches in chunks:
                load._gpu_columns(store, kernels, launches)
        except OverflowError:
            return ("overflow",)
        return _columns(store)

    compiled = fill()
    with _python():
        python = fill()
    assert compiled == python


_space = st.lists(st.sampled_from([" ", "\t", "\n", "\v", "\f", "\r"]), max_size=2).map("".join)
_pair = st.builds(
    lambda key, a, b, sign, digits, c, end: f"{key}{a}:{b}{sign}{digits}{c}{end}",
    st.sampled_from(['"stream"', '"correlation"', '"streams"', "stream"]),
    _space,
    _space,
    st.sampled_from(["", "-"]),
    st.sampled_from(["", "0", "7", "0012", "123456789012345678", "9223372036854775808"]),
    _space,
    st.sampled_from([",", "}", "", "x", "7"]),
)
_text = st.lists(
    st.one_of(_pair, st.sampled_from([":", " ", "-", "0", "7", ",", "}", "{", '"x"', "é", '"stream"'])),
    max_size=6,
).map("".join)


@needs_twin
@requires("pyarrow")
@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.none(), _text, st.builds(str, _args)), max_size=12))
def test_args_scan_equals_arrows_regex(texts: list[str | None]) -> None:
    import pyarrow as pa

    table = pa.table({"args": pa.array(texts, pa.string())})
    for key, pattern in ((b'"stream"', shards._STREAM), (b'"correlation"', shards._CORRELATION)):
        for part in (table, table.slice(1)):
            try:
                want = [v if v is not None and v >= 0 else -1 for v in shards._arg_ints(part, pattern)]
            except pa.ArrowInvalid:  # past int64: the fast path must hand the part to Arrow
                with pytest.raises(shards._NotFast):
                    shards._fast_args(TWIN, part, key)
                continue
            try:
                assert list(shards._fast_args(TWIN, part, key)) == want
            except shards._NotFast:  # a candidate past 18 digits: Arrow reads the part (allowed)
                pass


@needs_twin
@requires("pyarrow")
@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["kernel", "gpu_memset", "cuda_runtime", "cpu_op"]),
            st.sampled_from(["gemm", "ncclDevKernel_x", "Memset", None]),
            st.one_of(st.integers(0, 900), st.none()),
            st.integers(-5, 10**6),
            st.one_of(st.integers(-3, 300), st.none()),
            st.one_of(_text, st.builds(str, _args)),
        ),
        max_size=20,
    )
)
def test_shards_gpu_columns_equal_the_reference(rows: list[tuple[Any, ...]]) -> None:
    import pyarrow as pa

    table = pa.table(
        {
            "category": pa.array([r[0] for r in rows], pa.string()),
            "name": pa.array([r[1] for r in rows], pa.string()),
            "trace_pid": pa.array([r[2] for r in rows], pa.int64()),
            "trace_tid": pa.array([3] * len(rows), pa.int64()),
            "ts_ns": pa.array([r[3] for r in rows], pa.int64()),
            "dur_ns": pa.array([r[4] for r in rows], pa.int64()),
            "args": pa.array([r[5] for r in rows], pa.string()),
        }
    )

    def fill() -> tuple[Any, ...]:
        data = load.TraceData(path="x")
        try:
            shards._gpu(table, 100, data)
            shards._gpu(table.slice(len(rows) // 2), 100, data)  # a second part: names already known
        except (TypeError, pa.ArrowInvalid) as exc:
            return (type(exc).__name__,)
        return _columns(data.gpu)

    compiled = fill()
    with _python():
        python = fill()
    assert compiled == python


@needs_twin
@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 300), st.integers(0, 40)), max_size=10), max_size=4))
def test_union_of_busy_columns_equals_the_reference(sets: list[list[tuple[int, int]]]) -> None:
    from array import array

    lists = [(array("q", [s for s, _ in x]), array("q", [s + d for s, d in x])) for x in sets]
    got = TWIN.union_columns(lists)
    want = loops.union_columns(lists)
    assert (list(got[0]), list(got[1])) == (list(want[0]), list(want[1]))
    starts, ends = want
    assert list(TWIN.prefix_lengths(starts, ends)) == list(loops.prefix_lengths(starts, ends))
