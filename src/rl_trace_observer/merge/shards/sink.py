"""Inside a merge job: the events it keeps → span rows → Parquet parts, one per (step, host).

Called once per file the job writes, with the events exactly as the trace writers receive them (after
every pass, in output order), so the rows and the merged trace never disagree. Work is done a chunk
at a time (``CHUNK`` events → one Arrow table): Python builds one list per attribute (the cheap part)
and Arrow does the arithmetic, so the cost is ~1 µs per event and memory stays a few chunks, whatever
the file size. Parts are written under a hidden name and renamed by :meth:`ShardSink.close`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from msgspec import UNSET

from ..output import owned
from ..timeline.model import Event, us_to_ns
from .arrow import compute, parquet, pyarrow
from .layout import part_name, partition_dir
from .schema import NAMES, arrow_schema
from .spec import ProcMeta, ShardSpec

if TYPE_CHECKING:
    from ..files.sources import Source
    from ..timeline.model import ProcessKey
    from ..transform.passes import IdentityMapper


class Task(Protocol):
    """What a row needs of the file it came from (a merge job's task: :class:`..job.spec.Task`)."""

    index: int
    host: str
    owner_key: ProcessKey
    source: Source


CHUNK = 65_536
ROW_GROUP = 262_144
# Dictionary pages where values repeat (names, hosts, lanes); deltas for ns and ids that mostly grow:
# a third of the size of the defaults and a third faster to write (zstd 3 costs no more than 1 here).
WRITE_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 3,
    "use_dictionary": [
        "run", "host", "role", "source", "lane", "device", "name", "category", "ph", "extra", "artifact",
    ],
    "column_encoding": {
        c: "DELTA_BINARY_PACKED" for c in ("ts_ns", "dur_ns", "flow_out_id", "flow_in_id", "ordinal")
    },
    "write_statistics": ["step", "ts_ns", "dur_ns", "job", "ordinal"],
    # files say only Parquet's types: dictionary-built columns read back as the plain strings the
    # span schema declares, in pyarrow and elsewhere
    "store_schema": False,
}  # fmt: skip
_DICTIONARY = ("run", "host", "role", "source", "lane", "device", "artifact")


def _dictionary_schema(schema: Any) -> Any:
    """The span schema with the repeated string columns dictionary-typed, as the sink builds them."""
    pa = pyarrow()
    fields = [f.with_type(pa.dictionary(pa.int32(), f.type)) if f.name in _DICTIONARY else f for f in schema]
    return pa.schema(fields, metadata=schema.metadata)


_OUT_PHASES = ["s", "t"]
_IN_PHASES = ["f", "t"]
_ASYNC_PHASES = ["b", "e", "n"]
_ID_PHASES = ["s", "t", "f", "b", "e", "n"]
_RARE_FIELDS = ("bp", "s", "scope", "cname", "id2")
_NONE_RARE = (UNSET,) * len(_RARE_FIELDS)
_BP_JSON: dict[Any, str] = {}


@dataclass
class _Part:
    rel: str
    tmp: Path
    writer: Any
    step: int | None
    host: str
    rows: int = 0
    pending: list[Any] = field(default_factory=list)
    pending_rows: int = 0


class ShardSink:
    """One job's parts. ``add`` per file, ``close`` once (``abort`` on failure)."""

    def __init__(self, spec: ShardSpec, job: int) -> None:
        self.spec, self.job = spec, job
        self.schema = arrow_schema()
        self.write_schema = _dictionary_schema(self.schema)
        self.ordinal = 0
        self._parts: dict[tuple[int | None, str], _Part] = {}
        self._tracks: dict[tuple[Any, Any], tuple[Any, ...]] = {}

    # ------------------------------------------------------------------------------------ rows
    def add(
        self,
        events: list[Event],
        task: Task,
        mapper: IdentityMapper,
        relative_to_ns: int | None,
        unit_ns: int = 1000,
        far: dict[int, int] | None = None,
    ) -> None:
        """``events`` as the writers get them: absolute ns, or (``relative_to_ns``) output units from it:
        µs (``unit_ns`` 1000, Chrome JSON) or ns (1, the protobuf writer's). ``far``: the exact ns (from
        the base) of the µs values that do not give them back (``fastpath.to_output``)."""
        self._tracks.clear()  # per file: its mapper names its tracks
        for start in range(0, len(events), CHUNK):
            chunk = events[start : start + CHUNK]
            table = self._table(chunk, task, mapper, relative_to_ns, unit_ns, far)
            self._route(table, task.host)

    def _track(self, key: tuple[int, int], task: Task, mapper: IdentityMapper) -> tuple[Any, ...]:
        pid, tid = key
        decl = mapper.processes.get(pid)
        owner = decl.key if decl is not None and decl.key is not None else task.owner_key
        meta = self.spec.processes.get(owner, ProcMeta())
        thread = mapper.threads.get((pid, tid))
        source, lane = mapper.reader.label, None
        if thread is not None:
            source, _, lane = thread.name.partition(" · ")
        device = decl.sub if decl is not None else None
        os_pid = owner.pid if owner.pid >= 0 else None
        return (meta.run, owner.host, os_pid, meta.role, meta.rank, source, lane, device)

    def _table(
        self,
        events: list[Event],
        task: Task,
        mapper: IdentityMapper,
        rel: int | None,
        unit_ns: int = 1000,
        far: dict[int, int] | None = None,
    ) -> Any:
        """One chunk → one Arrow table: a plain list per attribute, the rest in Arrow (see module doc)."""
        pa, pc = pyarrow(), compute()
        n, unset, schema = len(events), UNSET, self.schema
        cols: dict[str, Any] = {}
        pids = pa.array([e.pid for e in events], pa.int64())
        tids = pa.array([e.tid for e in events], pa.int64())
        cols["trace_pid"], cols["trace_tid"] = pids, tids
        key = pc.add(pc.multiply(pc.cast(pids, pa.uint64()), 1 << 32), pc.cast(tids, pa.uint64()))
        keys = pc.unique(key)
        idx = pc.index_in(key, keys)
        tracks = self._tracks
        rows = []
        for k in keys.to_pylist():
            t = tracks.get(k)
            if t is None:
                t = tracks[k] = self._track((k >> 32, k & 0xFFFFFFFF), task, mapper)
            rows.append(t)
        for i, name in enumerate(("run", "host", "pid", "role", "rank", "source", "lane", "device")):
            cols[name] = pa.array([r[i] for r in rows], schema.field(name).type).take(idx)
        phs = [e.ph for e in events]
        cols["ph"] = pa.array(phs, pa.string())
        cols["name"] = _strings(pa, [e.name for e in events])
        cols["category"] = _strings(pa, [e.cat for e in events])
        durs: list[Any] = [e.dur for e in events]
        if durs.count(unset):
            durs = [None if d is unset else d for d in durs]
        if rel is None:
            cols["ts_ns"] = pa.array([e.ts for e in events], pa.int64())
            cols["dur_ns"] = pa.array(durs, pa.int64())
        elif unit_ns == 1:  # ns from the base: ints (any size) or integral floats (below 2**47), exact
            cols["ts_ns"] = pc.add(pa.array([e.ts for e in events], pa.int64()), rel)
            cols["dur_ns"] = pa.array(durs, pa.int64())
        else:  # output µs from the base, each y/1000 for an integer y: round(µs * 1000) is exact
            ts = [e.ts for e in events]  # ... below FLOAT_US_EXACT_NS; farther, the fast path's ``far``
            if far:
                ts = [far.get(id(e), t) for e, t in zip(events, ts, strict=True)]
            cols["ts_ns"] = pc.add(_ns(pa, pc, ts, far), rel)
            cols["dur_ns"] = _ns(pa, pc, durs)
        cols["step"] = self._steps(pa, pc, cols["ts_ns"], task, n)
        cols.update(_flow_columns(pa, pc, events, phs, cols["ph"]))
        cols["args"] = _args(pa, [e.args for e in events])
        cols["artifact"] = pa.DictionaryArray.from_arrays(
            pa.repeat(pa.scalar(0, pa.int32()), n), pa.array([task.source.rel], pa.string())
        )
        cols["job"] = pa.repeat(pa.scalar(self.job, pa.int32()), n)
        cols["ordinal"] = pc.add(pc.cumulative_sum(pa.repeat(pa.scalar(1, pa.int64()), n)), self.ordinal - 1)
        self.ordinal += n
        return pa.Table.from_arrays([cols[c] for c in NAMES], schema=self.write_schema)

    def _steps(self, pa: Any, pc: Any, ts: Any, task: Task, n: int) -> Any:
        own = self.spec.task_steps.get(task.index)
        if own is not None or not self.spec.windows:
            return pa.array([own] * n, pa.int64())
        step = pa.nulls(n, pa.int64())
        for lo, hi, number in reversed(self.spec.windows):  # the earliest window wins an overlap
            inside = pc.and_(pc.greater_equal(ts, lo), pc.less(ts, hi))  # [start, end), as the report
            step = pc.if_else(inside, pa.scalar(number, pa.int64()), step)
        return step

    # ----------------------------------------------------------------------------------- parts
    def _route(self, table: Any, host: str) -> None:
        pc = compute()
        steps = table.column("step")
        distinct = steps.unique().to_pylist()
        if len(distinct) == 1:
            self._write(distinct[0], host, table)
            return
        for value in distinct:
            mask = pc.is_null(steps) if value is None else pc.equal(steps, value)
            self._write(value, host, table.filter(pc.fill_null(mask, False)))

    def _write(self, step: int | None, host: str, table: Any) -> None:
        part = self._parts.get((step, host))
        if part is None:
            rel = f"{partition_dir(step, host)}/{part_name(self.job, self.spec.tag)}"
            final = Path(self.spec.root) / rel
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = owned.temp_path(final)  # the merge's name: a killed merge's is swept by the next
            writer = parquet().ParquetWriter(str(tmp), self.write_schema, **WRITE_OPTIONS)
            part = self._parts[(step, host)] = _Part(rel, tmp, writer, step, host)
        part.pending.append(table)
        part.pending_rows += table.num_rows
        if part.pending_rows >= ROW_GROUP:
            self._flush(part)

    def _flush(self, part: _Part) -> None:
        if part.pending:
            table = pyarrow().concat_tables(part.pending) if len(part.pending) > 1 else part.pending[0]
            part.writer.write_table(table, row_group_size=ROW_GROUP)
            part.rows += table.num_rows
            part.pending, part.pending_rows = [], 0

    def close(self) -> list[dict[str, Any]]:
        """Finish every part (renamed into place); their descriptions for the shard document."""
        out = []
        for part in self._parts.values():
            self._flush(part)
            part.writer.close()
            final = Path(self.spec.root) / part.rel
            os.replace(part.tmp, final)
            out.append(
                {
                    "path": part.rel,
                    "rows": part.rows,
                    "bytes": final.stat().st_size,
                    "step": part.step,
                    "host": part.host,
                    "job": self.job,
                }
            )
        self._parts.clear()
        return sorted(out, key=lambda p: p["path"])

    def abort(self) -> None:
        for part in self._parts.values():
            try:
                part.writer.close()
            finally:
                part.tmp.unlink(missing_ok=True)
        self._parts.clear()


def _ns(pa: Any, pc: Any, values: list[Any], far: dict[int, int] | None = None) -> Any:
    """Output µs → exact int ns, as :func:`..timeline.model.us_to_ns` (whole µs and the fraction apart:
    ``round(µs * 1000)`` misses ~1 % of values from ~26 days on), in Arrow; ``far``: the values past
    ``FLOAT_US_EXACT_NS`` are already int ns, put there by ``add``."""
    if far:
        return pa.array([v if v is None or type(v) is int else us_to_ns(v) for v in values], pa.int64())
    arr = pa.array(values, pa.float64())
    whole = pc.trunc(arr)
    frac = pc.round(pc.multiply(pc.subtract(arr, whole), 1000.0), round_mode="half_to_even")
    return pc.add(pc.multiply(pc.cast(whole, pa.int64()), 1000), pc.cast(frac, pa.int64()))


def _strings(pa: Any, values: list[Any]) -> Any:
    if values.count(UNSET):
        values = [None if v is UNSET else v for v in values]
    return pa.array(values, pa.string())


def _args(pa: Any, raws: list[Any]) -> Any:
    """Raw JSON slices → one string array without a bytes object per event: joined, then offsets."""
    missing = raws.count(UNSET)
    if missing:
        raws = [b"" if a is UNSET else a for a in raws]
    lengths = list(map(len, raws))
    offsets = pa.array([0, *accumulate(lengths)], pa.int32())
    validity = pa.array([size > 0 for size in lengths]).buffers()[1] if missing else None
    data = pa.py_buffer(b"".join(raws))
    arr = pa.StringArray.from_buffers(len(raws), offsets.buffers()[1], data, validity)
    try:
        arr.validate(full=True)  # UTF-8
    except pa.ArrowInvalid:  # a reader let invalid UTF-8 through: replace, as the JSON writer would
        return pa.array([bytes(a).decode("utf-8", "replace") if len(a) else None for a in raws], pa.string())
    return arr


def _flow_columns(pa: Any, pc: Any, events: list[Event], phs: Sequence[str], ph: Any) -> dict[str, Any]:
    """Flow and async ids (ints, as namespacing made them) in Arrow, and the rare trace fields as JSON.

    The common case costs two list passes and a few vector operations; events whose ids are not
    ints, or that carry rare fields, take a Python path of their own (they are few).
    """
    n, unset, i64 = len(events), UNSET, pa.int64()
    none = pa.nulls(n, i64)
    out = {"flow_out_id": none, "flow_in_id": none, "async_id": none}
    odd: dict[int, dict[str, Any]] = {}
    ids = [e.id for e in events]
    if ids.count(unset) != n:
        values = [None if v is unset else v for v in ids]
        try:
            id_arr = pa.array(values, i64)
        except (TypeError, ValueError, OverflowError, pa.ArrowException):  # string ids: rare sources
            id_arr = pa.array([v if type(v) is int else None for v in values], i64)
            for i in [i for i, v in enumerate(values) if v is not None and type(v) is not int]:
                odd.setdefault(i, {})["id"] = values[i]
        out["flow_out_id"] = pc.if_else(pc.is_in(ph, value_set=pa.array(_OUT_PHASES)), id_arr, none)
        out["flow_in_id"] = pc.if_else(pc.is_in(ph, value_set=pa.array(_IN_PHASES)), id_arr, none)
        out["async_id"] = pc.if_else(pc.is_in(ph, value_set=pa.array(_ASYNC_PHASES)), id_arr, none)
        elsewhere = pc.and_(pc.is_valid(id_arr), pc.invert(pc.is_in(ph, value_set=pa.array(_ID_PHASES))))
        for i in pc.indices_nonzero(elsewhere).to_pylist():  # an id the columns do not hold: kept
            odd.setdefault(i, {})["id"] = values[i]
    binds = [e.bind_id for e in events]
    if binds.count(unset) != n:
        f_out, f_in = out["flow_out_id"].to_pylist(), out["flow_in_id"].to_pylist()
        for i in [i for i, b in enumerate(binds) if b is not unset]:
            e, bid = events[i], binds[i]
            if type(bid) is not int:
                odd.setdefault(i, {})["bind_id"] = bid
                continue
            if e.flow_out is True:
                f_out[i] = bid
            if e.flow_in is True:
                f_in[i] = bid
        out["flow_out_id"], out["flow_in_id"] = pa.array(f_out, i64), pa.array(f_in, i64)
    extra: list[Any] = [None] * n
    # bp, s, scope and id2 belong to flows, instants and async events; cname (a colour) to anything
    subset = [i for i, p in enumerate(phs) if p != "X" and p != "C"]
    cnames = [e.cname for e in events]
    if cnames.count(unset) != n:
        subset = sorted(set(subset) | {i for i, c in enumerate(cnames) if c is not unset})
    for i in subset:
        e = events[i]
        rare = (e.bp, e.s, e.scope, e.cname, e.id2)
        if rare == _NONE_RARE:
            continue
        if rare[1:] == _NONE_RARE[1:] and i not in odd:  # the common case: a flow's binding point
            extra[i] = _BP_JSON.get(rare[0]) or _BP_JSON.setdefault(
                rare[0], orjson.dumps({"bp": rare[0]}).decode()
            )
            continue
        fields = odd.setdefault(i, {})
        for name, value in zip(_RARE_FIELDS, rare, strict=True):
            if value is not unset:
                fields[name] = orjson.loads(bytes(value)) if name == "id2" else value  # type: ignore[arg-type]
    for i, fields in odd.items():
        extra[i] = orjson.dumps(fields).decode()
    out["extra"] = pa.array(extra, pa.string())
    return out
