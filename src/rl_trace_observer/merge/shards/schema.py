"""The span table's columns (``rl-trace-spans/1``) and the shard directory's document.

Flat on purpose: every column is a plain scalar, so DuckDB, pandas or pyarrow read the table without
knowing our types, and ``args`` stays JSON text (``json_extract`` in SQL). The table is versioned: adding a
nullable column keeps the version; renaming, removing or changing a column's meaning bumps it.
docs/FORMATS.md §6 is generated from :data:`COLUMNS` (a test keeps them in sync).
"""

from __future__ import annotations

from typing import Any, NamedTuple

SPAN_SCHEMA = "rl-trace-spans/1"
DOC_SCHEMA = "rl-trace-shards/1"
DOC_NAME = "rl-trace-shards.json"
MANIFEST_NAME = "manifest.json"  # a copy of the merge manifest the shards came from


class Column(NamedTuple):
    name: str
    type: str  # arrow type name: string, int64, int32
    doc: str


COLUMNS: tuple[Column, ...] = (
    Column("run", "string", "run id of the owning process (null: no process record said)"),
    Column("host", "string", "host name of the process that wrote the event (also a partition)"),
    Column("pid", "int64", "OS pid of that process (null: not known from any record or file)"),
    Column("role", "string", "its role: trainer, actor, rollout, ... (null: unknown)"),
    Column("rank", "int32", "its rank (null: none)"),
    Column(
        "step",
        "int64",
        "training step: the artifact's own step, else the step window `[start, end)` the event starts in"
        " — the report's windows (step markers; docs/merge.md)",
    ),
    Column("source", "string", "RL-Insight, Torch, VizTracer, Proton or Trace (the track's source)"),
    Column(
        "lane", "string", "the source's thread or lane (`rank_0`, `thread 12`, `stream 7`); null on global"
    ),
    Column(
        "device", "string", "sub-process under the OS process: `GPU 0`, `Proton`, `Spans`; null: the process"
    ),
    Column("name", "string", "event name"),
    Column("category", "string", "Chrome `cat` (`rl_insight`, `kernel`, `cpu_op`, ...)"),
    Column("ph", "string", "Chrome phase: X slice, B/E, i/I instant, C counter, s/t/f flow, b/e/n async"),
    Column("ts_ns", "int64", "start, absolute wall-clock ns on the merged (clock-corrected) timeline"),
    Column("dur_ns", "int64", "duration in ns of a complete slice (X); null otherwise"),
    Column("flow_out_id", "int64", "flow leaving here: `s`/`t` id, or an X's `bind_id` with `flow_out`"),
    Column("flow_in_id", "int64", "flow arriving here: `f`/`t` id, or an X's `bind_id` with `flow_in`"),
    Column("async_id", "int64", "id of an async event (b/e/n), namespaced like flow ids"),
    Column("args", "string", "arguments as JSON text (counters: their values); null: none"),
    Column("extra", "string", "JSON of rarely used trace fields (bp, s, scope, cname, id2); null: none"),
    Column("trace_pid", "int64", "the process id in the merged trace file"),
    Column("trace_tid", "int64", "the thread id in the merged trace file"),
    Column("artifact", "string", "input file the event came from (path below its input or node directory)"),
    Column("job", "int32", "merge job that wrote the row (the trace's order: job, then ordinal)"),
    Column("ordinal", "int64", "position of the event in its job's output"),
)
NAMES: tuple[str, ...] = tuple(c.name for c in COLUMNS)
PARTITIONS = ("step", "host")
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"  # Hive's (and pyarrow's, DuckDB's) name for null


def arrow_schema() -> Any:
    """The pyarrow schema (pyarrow imported here, not at module import)."""
    from .arrow import pyarrow

    pa = pyarrow()
    types = {"string": pa.string(), "int64": pa.int64(), "int32": pa.int32()}
    meta = {b"rl_trace_schema": SPAN_SCHEMA.encode()}
    return pa.schema([pa.field(c.name, types[c.type]) for c in COLUMNS], metadata=meta)


def markdown_table() -> str:
    lines = ["| column | type | meaning |", "| --- | --- | --- |"]
    lines += [f"| `{c.name}` | {c.type} | {c.doc} |" for c in COLUMNS]
    return "\n".join(lines)
