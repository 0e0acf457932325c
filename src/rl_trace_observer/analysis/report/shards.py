"""What the report needs, read from span shards instead of a Chrome JSON file (any run size, any
merged output format: a ``.pftrace`` run has the same shards).

The same four things :mod:`.load` keeps — stage candidates (with their args), counters, the longest
spans, process/thread names — are picked per part with Arrow (only ``args`` of the kept rows becomes
Python), so memory follows what is kept plus one part. Times become relative to the trace's base, as
a Chrome JSON file states them, so the report from shards equals the report from the ``.json.gz`` of
the same merge (a test checks it on the demo run).
"""

from __future__ import annotations

import heapq
from array import array
from pathlib import Path
from sys import intern
from typing import Any

import orjson

from ...common.column_rows import as_array
from ...merge.shards.arrow import compute
from ...merge.shards.dataset import Shards
from ..gpu.kinds import GPU_CATEGORIES, LAUNCH_CATEGORIES
from .load import LONGEST_KEPT, STAGE_CATEGORIES, Counter, Span, TraceData, split_labels
from .span_table import SpanTable
from .stages import OTHER, classify

_KEY_ROOM = 2**62  # a part's shapes are numbered by one int64 key while its distinct values allow
_COLUMNS = ["ph", "name", "category", "ts_ns", "dur_ns", "trace_pid", "trace_tid", "job", "ordinal"]


def load_shards(root: str | Path, gpu: bool = True) -> TraceData:
    """The report's data from the whole parts of ``root`` (damaged ones named in ``missing_parts``)."""
    shards = Shards.open(root).whole()
    data = TraceData(path=str(root), mode="shards")
    data.missing_parts, data.missing_note = shards.missing, shards.missing_line()
    data.metadata = {
        "rl_trace_observer": shards.doc.get("trace", {}).get("header") or {},
        "displayTimeUnit": "ms",
    }
    data.events = shards.rows  # every kept event is one row: the merge's events_kept
    for p in shards.processes:
        data.process_names[p["trace_pid"]] = p["name"]
        data.process_args[p["trace_pid"]] = {"name": p["name"]}
    for t in shards.threads:
        data.thread_names[(t["trace_pid"], t["trace_tid"])] = t["name"]
    base = shards.base_ns
    kept = _Kept()
    counters: list[tuple[int, int, list[Counter]]] = []
    longest: list[tuple[int, int, int, Span]] = []  # (dur, -job, -ordinal, span): a min-heap of the top
    begins_ends: list[dict[str, Any]] = []
    known: dict[str, bool] = {}
    for table in shards.scan([*_COLUMNS, "args"]):
        _part(table, base, known, kept, counters, longest, begins_ends, data, gpu)
    _pair(begins_ends, base, known, kept, longest, data)
    data.spans = kept.in_trace_order()
    data.counters = [c for _, _, cs in sorted(counters, key=lambda k: k[:2]) for c in cs]
    data.longest = [s for *_, s in sorted(longest, key=lambda k: k[:3], reverse=True)]
    return data


def _stage(name: str, cat: str, known: dict[str, bool]) -> bool:
    hit = known.get(name)
    if hit is None:
        hit = known[name] = classify(name) != OTHER
    return hit or cat.startswith(STAGE_CATEGORIES)


def _args(text: Any) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _push(longest: list[tuple[int, int, int, Span]], item: tuple[int, int, int, Span]) -> None:
    if len(longest) < LONGEST_KEPT:
        heapq.heappush(longest, item)
    elif item[:3] > longest[0][:3]:
        heapq.heapreplace(longest, item)


def _part(
    table: Any,
    base: int,
    known: dict[str, bool],
    kept: _Kept,
    counters: list[tuple[int, int, list[Counter]]],
    longest: list[tuple[int, int, int, Span]],
    begins_ends: list[dict[str, Any]],
    data: TraceData,
    gpu: bool = True,
) -> None:
    pc = compute()
    ph = table.column("ph")
    slices = table.filter(pc.equal(ph, "X"))
    data.spans_seen += slices.num_rows
    names = slices.column("name").unique().to_pylist()
    stage_names = [n for n in names if n is not None and _stage(n, "", known)]
    cat = pc.fill_null(slices.column("category"), "")
    is_stage = pc.is_in(pc.fill_null(slices.column("name"), ""), value_set=_strings(stage_names))
    for prefix in STAGE_CATEGORIES:  # every prefix the JSON loader keeps (rl_trace.*: request spans)
        is_stage = pc.or_(is_stage, pc.starts_with(cat, prefix))
    kept.add_part(slices.filter(is_stage), base)
    top = slices.sort_by([("dur_ns", "descending"), ("job", "ascending"), ("ordinal", "ascending")])
    for row in top.slice(0, LONGEST_KEPT).drop_columns(["args"]).to_pylist():
        _push(longest, (max(row["dur_ns"] or 0, 0), -row["job"], -row["ordinal"], _span(row, base)))
    if gpu:
        _gpu(slices, base, data)
    for row in table.filter(pc.equal(ph, "C")).to_pylist():
        counters.append((row["job"], row["ordinal"], _counters(row, base)))
    begins_ends.extend(table.filter(pc.is_in(ph, value_set=_strings(["B", "E"]))).to_pylist())


_STREAM = r'"stream"\s*:\s*(?P<v>-?\d+)\s*[,}]'
_CORRELATION = r'"correlation"\s*:\s*(?P<v>-?\d+)\s*[,}]'


def _arg_ints(table: Any, pattern: str) -> list[Any]:
    """An integer ``args`` key of every row, read with Arrow (None where absent or not an int)."""
    import pyarrow as pa

    pc = compute()
    found = pc.extract_regex(pc.fill_null(table.column("args"), ""), pattern)
    return pc.cast(pc.struct_field(found, "v"), pa.int64()).to_pylist()  # type: ignore[no-any-return]


def _gpu(slices: Any, base: int, data: TraceData) -> None:
    """Kineto kernels and launches of one part into the report's kernel store (as the JSON loader:
    the same ``args.stream`` / ``args.correlation``, read by regular expression in Arrow)."""
    pc = compute()
    cats = slices.column("category")
    kernels = slices.filter(pc.fill_null(pc.is_in(cats, value_set=_strings(sorted(GPU_CATEGORIES))), False))
    launches = slices.filter(
        pc.fill_null(pc.is_in(cats, value_set=_strings(sorted(LAUNCH_CATEGORIES))), False)
    )
    from ..gpu.loops import native

    loops = native()
    if hasattr(loops, "arg_ints"):  # the compiled twin: columns straight from Arrow's buffers
        try:
            fast = (
                _fast_kernels(loops, kernels, base, data.gpu),
                _fast_launches(loops, launches, base, data.gpu),
            )
        except _NotFast:
            pass
        else:
            for apply in fast:
                apply()
            return
    if kernels.num_rows:
        pid, tid, ts, dur, name, cat = (
            c.to_pylist()
            for c in (kernels.column("trace_pid"), kernels.column("trace_tid"),
                      pc.subtract(kernels.column("ts_ns"), base), pc.fill_null(kernels.column("dur_ns"), 0),
                      pc.fill_null(kernels.column("name"), ""), kernels.column("category"))
        )  # fmt: skip
        streams, corrs = _arg_ints(kernels, _STREAM), _arg_ints(kernels, _CORRELATION)
        data.gpu.extend_kernel_ids(pid, tid, ts, dur, name, cat, streams, corrs)
    if launches.num_rows:
        corrs = _arg_ints(launches, _CORRELATION)
        data.gpu.extend_launch_ids(
            launches.column("trace_pid").to_pylist(), launches.column("trace_tid").to_pylist(),
            pc.subtract(launches.column("ts_ns"), base).to_pylist(),
            pc.fill_null(launches.column("dur_ns"), 0).to_pylist(), corrs,
        )  # fmt: skip


def _int_columns(table: Any, base: int) -> list[array]:  # type: ignore[type-arg]
    pc = compute()
    ts, dur = pc.subtract(table.column("ts_ns"), base), pc.fill_null(table.column("dur_ns"), 0)
    return [_q(table.column("trace_pid")), _q(table.column("trace_tid")), _q(ts), _q(dur)]


class _NotFast(Exception):
    """A part the fast path does not take as it is (nulls, wide offsets, a huge integer): the
    reference path reads it."""


def _q(column: Any) -> array:  # type: ignore[type-arg]
    """An int64 column without nulls as ``array('q')``, from Arrow's buffers (no Python ints)."""
    import pyarrow as pa

    out = array("q")
    for chunk in getattr(column, "chunks", [column]):
        if chunk.type != pa.int64() or chunk.null_count:
            raise _NotFast
        if len(chunk):
            out.frombytes(memoryview(chunk.buffers()[1])[chunk.offset * 8 : (chunk.offset + len(chunk)) * 8])
    return out


def _fast_args(loops: Any, table: Any, key: bytes) -> array:  # type: ignore[type-arg]
    """:func:`_arg_ints` of ``key`` in C over the args strings (-1: none or negative)."""
    import pyarrow as pa

    out = array("q")
    for chunk in compute().fill_null(table.column("args"), "").chunks:
        if chunk.type != pa.string():
            raise _NotFast
        _, offsets, body = chunk.buffers()
        offs = memoryview(offsets).cast("i")[chunk.offset : chunk.offset + len(chunk) + 1]
        try:
            out.extend(loops.arg_ints(offs, memoryview(body).cast("B") if body is not None else b"", key))
        except OverflowError:
            raise _NotFast from None
    return out


def _fast_kernels(loops: Any, kernels: Any, base: int, store: Any) -> Any:
    """The kernels of one part as columns, checked before anything is stored; returns the store call."""
    pc = compute()
    if not kernels.num_rows:
        return lambda: None
    streams = _fast_args(loops, kernels, b'"stream"')
    corrs = _fast_args(loops, kernels, b'"correlation"')
    cols = _int_columns(kernels, base)
    names = pc.fill_null(kernels.column("name"), "").combine_chunks().dictionary_encode()
    codes = _q(pc.cast(names.indices, "int64"))
    keep = loops.nonneg_positions(streams)
    untracked = len(streams) - len(keep)
    if untracked:
        cols, codes, streams, corrs = (
            [loops.take(c, keep) for c in cols], loops.take(codes, keep), loops.take(streams, keep),
            loops.take(corrs, keep),
        )  # fmt: skip
    dictionary = names.dictionary.to_pylist()
    first = loops.first_positions(codes, len(dictionary))
    used = [j for j in range(len(dictionary)) if first[j] >= 0]
    category = kernels.column("category")
    rows = [keep[first[j]] if untracked else first[j] for j in used]

    def apply() -> None:
        store.untracked += untracked
        ids = array("q", [0]) * len(dictionary)
        for j, got in zip(
            used,
            store.intern([dictionary[j] for j in used], [category[r].as_py() for r in rows]),
            strict=True,
        ):
            ids[j] = got
        store.extend_kernel_arrays(*cols, loops.take(ids, codes), streams, corrs)

    return apply


def _fast_launches(loops: Any, launches: Any, base: int, store: Any) -> Any:
    if not launches.num_rows:
        return lambda: None
    corrs = _fast_args(loops, launches, b'"correlation"')
    cols = _int_columns(launches, base)
    keep = loops.nonneg_positions(corrs)
    if len(keep) < len(corrs):
        cols, corrs = [loops.take(c, keep) for c in cols], loops.take(corrs, keep)
    return lambda: store.extend_launch_arrays(*cols, corrs)


def _strings(values: list[str]) -> Any:
    import pyarrow as pa

    return pa.array(values, pa.string())


class _Kept:
    """The stage spans in trace order (job, ordinal), as a :class:`.span_table.SpanTable`. The
    merge writes parts in that order, so spans are appended as they come, their keys kept as
    machine ints, and sorted only when a part (or a B/E pair met at its end) breaks the order: no
    key tuple per span, no sort of a million."""

    def __init__(self) -> None:
        self.spans = SpanTable([])
        self.jobs: array[int] = array("q")
        self.ordinals: array[int] = array("q")
        self.ordered = True
        self._shape_ids: dict[tuple[Any, ...], int] = {}  # (name, category, pid, tid, args text)
        self._args: dict[Any, dict[str, Any]] = {}  # args text -> its one decoded dict

    def add_part(self, stage: Any, base: int) -> None:
        """The stage rows of one part, column by column (a dict per row cost more than the spans
        themselves at 1M rows): a shape id per row — names, categories and args decoded once per
        distinct value, equal args text giving one shared dict (the report never changes a span's
        args) — and the two times as int64 columns."""
        pc = compute()
        stage = stage.filter(pc.is_valid(stage.column("ts_ns")))  # the merge writes none without a time
        if not stage.num_rows:
            return
        import numpy as np

        jobs, ordinals = _ints(stage.column("job")), _ints(stage.column("ordinal"))
        self._note_order(jobs[0], ordinals[0])
        if self.ordered and not _ascending(stage):
            self.ordered = False
        columns = [
            _dictionary(stage.column(c)) for c in ("name", "category", "trace_pid", "trace_tid", "args")
        ]
        key = np.zeros(stage.num_rows, dtype=np.int64)  # the five indices as one number (mixed radix)
        room = 1
        for values, indices in columns:
            key, room = key * len(values) + indices, room * len(values)
        if room >= _KEY_ROOM:  # too many distinct values to number so: their rows as keys
            key = np.stack([indices for _, indices in columns], axis=1)
        distinct, inverse = np.unique(key, axis=0 if key.ndim > 1 else None, return_inverse=True)
        ids = np.array(
            [self._shape_id(columns, _digits(row, columns)) for row in distinct.tolist()], dtype=np.int32
        )
        starts = pc.subtract(stage.column("ts_ns"), base)
        durs = pc.max_element_wise(pc.fill_null(stage.column("dur_ns"), 0), 0)
        self.spans.extend_columns(
            as_array("i", ids[inverse.reshape(-1)]),
            as_array("q", np.asarray(starts.to_numpy(), dtype=np.int64)),
            as_array("q", np.asarray(durs.to_numpy(), dtype=np.int64)),
        )
        self.jobs.extend(jobs)
        self.ordinals.extend(ordinals)

    def _shape_id(self, columns: list[tuple[list[Any], Any]], row: list[int]) -> int:
        (names, _), (cats, _), (pids, _), (tids, _), (texts, _) = columns
        name, cat, pid, tid, text = (
            names[row[0]], cats[row[1]], pids[row[2]], tids[row[3]], texts[row[4]],
        )  # fmt: skip
        key = (name, cat, pid, tid, text)
        got = self._shape_ids.get(key)
        if got is None:
            args = self._args.get(text)
            if args is None:
                args = self._args[text] = _args(text)
            name, cat = intern(name or ""), intern(cat or "")
            got = self._shape_ids[key] = self.spans.add_shape((name, cat, pid, tid, args))
        return got

    def add(self, job: int, ordinal: int, span: Span) -> None:
        self._note_order(job, ordinal)
        self.spans.append(span)
        self.jobs.append(job)
        self.ordinals.append(ordinal)

    def _note_order(self, job: int, ordinal: int) -> None:
        if self.jobs and (job, ordinal) < (self.jobs[-1], self.ordinals[-1]):
            self.ordered = False

    def in_trace_order(self) -> SpanTable:
        if self.ordered:
            return self.spans
        import numpy as np

        order = np.lexsort(
            (np.frombuffer(self.ordinals, np.int64), np.frombuffer(self.jobs, np.int64))
        )  # stable
        return self.spans.take(order)


def _digits(key: Any, columns: list[tuple[list[Any], Any]]) -> list[int]:
    """The five indices back from a mixed-radix key (a row of them as it is)."""
    if isinstance(key, list):
        return key
    out = []
    for values, _ in reversed(columns):
        key, digit = divmod(key, len(values))
        out.append(digit)
    return out[::-1]


def _dictionary(column: Any) -> tuple[list[Any], Any]:
    """A column's distinct values (null last, where there is one) and each row's index into them."""
    import numpy as np

    encoded = column.combine_chunks().dictionary_encode()
    values = encoded.dictionary.to_pylist()
    if encoded.null_count:
        values.append(None)
        indices = compute().fill_null(encoded.indices, len(values) - 1)
    else:
        indices = encoded.indices
    return values, np.asarray(indices.to_numpy(zero_copy_only=False), dtype=np.int64)


def _ints(column: Any) -> array[int]:
    try:
        return _q(column)
    except _NotFast:  # another integer type or a null (not what the merge writes): Python ints
        return array("q", column.to_pylist())


def _ascending(stage: Any) -> bool:
    """Whether one part's rows are in (job, ordinal) order, judged in Arrow."""
    if stage.num_rows < 2:
        return True
    pc = compute()
    n = stage.num_rows
    job, ordinal = stage.column("job"), stage.column("ordinal")
    j0, j1, o0, o1 = job.slice(0, n - 1), job.slice(1), ordinal.slice(0, n - 1), ordinal.slice(1)
    step_ok = pc.or_(pc.greater(j1, j0), pc.and_(pc.equal(j1, j0), pc.greater_equal(o1, o0)))
    return bool(pc.all(step_ok).as_py())


def _span(row: dict[str, Any], base: int, with_args: bool = False, dur_ns: int | None = None) -> Span:
    dur = row["dur_ns"] if dur_ns is None else dur_ns
    span = Span(  # a name or category per row, the same few values: interned, one string each
        intern(row["name"] or ""),
        intern(row["category"] or ""),
        row["trace_pid"],
        row["trace_tid"],
        row["ts_ns"] - base,
        max(dur or 0, 0),
    )
    if with_args:
        span.args = _args(row.get("args"))
    return span


def _counters(row: dict[str, Any], base: int) -> list[Counter]:
    name, labels = split_labels(row["name"] or "")
    out = []
    for key, value in _args(row.get("args")).items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            label = name if key == "value" else f"{name} {key}"
            out.append(
                Counter(
                    label,
                    row["trace_pid"],
                    row["ts_ns"] - base,
                    float(value),
                    labels,
                    row.get("category") or "",
                )
            )
    return out


def _pair(
    rows: list[dict[str, Any]],
    base: int,
    known: dict[str, bool],
    kept: _Kept,
    longest: list[tuple[int, int, int, Span]],
    data: TraceData,
) -> None:
    """B/E rows paired per thread in trace order, as the Chrome JSON loader pairs them."""
    open_: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda r: (r["job"], r["ordinal"])):
        key = (row["trace_pid"], row["trace_tid"])
        if row["ph"] == "B":
            open_.setdefault(key, []).append(row)
            continue
        stack = open_.get(key)
        if not stack:
            data.unmatched_ends += 1
            continue
        begin = stack.pop()
        data.spans_seen += 1
        dur = row["ts_ns"] - begin["ts_ns"]
        stage = _stage(begin["name"] or "", begin["category"] or "", known)
        span = _span(begin, base, with_args=stage, dur_ns=dur)
        if stage:  # the JSON loader meets a B/E span at its end: that is its place
            kept.add(row["job"], row["ordinal"], span)
        _push(longest, (span.dur_ns, -row["job"], -row["ordinal"], span))
    data.unmatched_ends += sum(len(s) for s in open_.values())
