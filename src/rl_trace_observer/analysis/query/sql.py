"""``rl-trace sql``: DuckDB over the span table (``rl-trace-spans/1`` Parquet), offline.

    with open_run("run/trace.pftrace") as db:        # shards dir, a trace with shards, a run dir, a .json.gz
        db.sql("SELECT role, stage, sum(dur_ns) FROM stage_spans GROUP BY ALL").fetchall()

Tables (docs/FORMATS.md §11):

- ``spans``: every row of the span shards, the columns of docs/FORMATS.md §6, as written;
- ``samples``: the metric sampler's counter tracks (docs/metrics.md), one row per point —
  ``host``, ``pid``/``role`` (the process the track is under: the replica's server, the process using
  a GPU, the sampler for ``Host``/``TransferQueue``), ``device`` (``GPU 0``, ``Host``, …), ``step``
  (the report's step window the point falls in: naming ``samples`` builds ``steps`` too),
  ``track`` (the Perfetto track name), ``metric`` (its family), ``kind`` (gauge, rate, mean, p50,
  p99), ``labels`` (the ``k=v,…`` the track name carries), ``ts_ns``, ``value``;
- ``trace``: one row, ``base_ns`` (the merged trace's time origin: ``ts_ns - base_ns`` is the time
  the trace file shows), ``source`` and ``missing_parts`` (span shard parts left out as damaged, in
  one line naming them; NULL when every part is whole);
- the report's own rows (:mod:`.report_tables`, built only when a query names them): ``steps``
  (its step windows), ``stage_spans`` (its stage spans with ``stage``, ``lane`` and ``step``),
  ``kernels`` (one row per Kineto GPU event with its step, stage and launch) and ``gpu_time``
  (its ``gpu.rows``: busy, compute, comm, memory, overlap, idle and its split);
- macro ``stage(name)``: the stage table (analysis/report/stages.py) as SQL.

Where the rows come from: span shards as they are (a directory, or the ``--shards`` directory a merge
manifest names); a run directory is merged into temporary shards first; a merged ``.json``/
``.json.gz`` without shards is converted to one temporary Parquet file (:mod:`.trace_table`).
DuckDB is an extra (``pip install 'rl-trace-observer[sql]'``), imported here only.

Read-only by default (issue 33, item 14): once the tables exist, :func:`lock_down` gives DuckDB the
span files as its only ``allowed_paths``, turns ``enable_external_access`` off and locks the
configuration, so a query cannot read other files (``read_csv('/etc/passwd')``, ``glob``), write any
(``COPY … TO``, ``EXPORT``), ``ATTACH`` a database, load an extension or undo the settings. DuckDB's
allowed paths may still be written (``COPY … TO`` a span file with ``USE_TMP_FILE false``), so
:func:`check_statements` also runs only statement kinds that write no file (SELECT, EXPLAIN, CREATE
of in-memory objects, …: :data:`READ_ONLY_KINDS`). ``file_access=True`` (``rl-trace sql
--allow-file-access``) leaves DuckDB as it is.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from ...merge.shards.dataset import Shards
from ...merge.shards.layout import ShardsError, is_shards_dir
from ..report.inputs import InputError, paired_manifest, resolve, shards_mismatch
from ..report.load import TraceData, load_trace
from ..report.shards import load_shards
from ..report.stages import STAGE_TABLE
from . import report_tables

__all__ = [
    "EXAMPLES",
    "FILE_ACCESS_HINT",
    "SqlError",
    "check_statements",
    "lock_down",
    "open_run",
    "stage_macro",
]

# Report figures re-derived with one query each; docs/report.md shows them verbatim and a test runs them
# on the demo run against the report's own numbers.
EXAMPLES = {
    # steps[].roles[].mean_ns: time per step, role and stage, mean per lane of the role
    "stage_time": """SELECT step, role, stage, sum(dur_ns) / any_value(lanes) AS mean_ns
FROM stage_spans
JOIN (SELECT role, count(DISTINCT lane) AS lanes FROM stage_spans GROUP BY role) USING (role)
GROUP BY ALL ORDER BY ALL""",
    # arrivals.events[]: who reached the end of each stage last, and how far behind the next-latest
    "arrivals": """WITH arrival AS (
  SELECT step, role, name, lane, max(end_ns) AS end_ns FROM stage_spans GROUP BY ALL)
SELECT step, role, name, arg_max(lane, end_ns) AS last_lane,
       max(end_ns) - list_sort(list(end_ns), 'DESC')[2] AS lag_ns
FROM arrival GROUP BY ALL HAVING count(*) > 1 ORDER BY ALL""",
    # steps[].dur_ns: the slowest steps first
    "steps": "SELECT step, dur_ns / 1e6 AS wall_ms FROM steps ORDER BY dur_ns DESC",
}

INSTALL_HINT = "rl-trace sql needs DuckDB: pip install 'rl-trace-observer[sql]'"
FILE_ACCESS_HINT = "rl-trace sql reads only the run's tables; --allow-file-access lets a query use files"

# Statement kinds that touch no file once external access is off (PREPARE/EXECUTE are left out: a
# prepared statement is checked by no one when it runs).
READ_ONLY_KINDS = frozenset(
    {"SELECT", "EXPLAIN", "CREATE", "DROP", "INSERT", "UPDATE", "DELETE", "ALTER", "CALL", "PRAGMA"}
    | {"SET", "VARIABLE_SET", "TRANSACTION", "ANALYZE"}
)


class SqlError(ValueError):
    """The input or the query cannot be used; the message says which and what to do."""


def duckdb() -> Any:
    try:
        import duckdb as db
    except ImportError:
        raise SqlError(INSTALL_HINT) from None
    return db


def lock_down(con: Any, files: list[str]) -> None:
    """From now on ``con`` reads ``files`` (the span table's Parquet files) and no other file,
    writes none, and cannot change its settings back."""
    listed = ", ".join("'" + _quote(f) + "'" for f in files)
    con.execute(f"SET allowed_paths = [{listed}]")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def check_statements(sql: str) -> None:
    """Raise :class:`SqlError` unless every statement of ``sql`` is of a kind that writes no file
    (:data:`READ_ONLY_KINDS`); a query DuckDB cannot parse is left to DuckDB's own message."""
    db = duckdb()
    try:
        statements = db.extract_statements(sql)
    except db.Error:
        return
    for statement in statements:
        kind = statement.type.name
        if kind not in READ_ONLY_KINDS:
            word = {"VARIABLE_SET": "SET", "COPY_DATABASE": "COPY FROM DATABASE", "EXTENSION": "INSTALL"}
            raise SqlError(
                f"{word.get(kind, kind)} statements are not run: rl-trace sql is read-only "
                "(save results with --csv/--json -o FILE; --allow-file-access lifts this)"
            )


def _quote(text: str) -> str:
    return text.replace("'", "''")


def stage_macro() -> str:
    """``stage(name)`` in SQL: the stage table's rows in order, first match wins (as :func:`classify`)."""
    cases = " ".join(
        f"WHEN regexp_matches(name, '{_quote(rule.pattern)}', 'i') THEN '{rule.category}'"
        for rule in STAGE_TABLE
    )
    return f"CREATE MACRO stage(name) AS CASE {cases} ELSE 'other' END"


@contextlib.contextmanager
def open_run(
    path: str | Path, tables: Iterable[str] | None = None, *, file_access: bool = False
) -> Iterator[Any]:
    """A DuckDB connection with the tables above, for ``path`` (see the module docstring);
    ``tables``: which of the report's tables to build (default: all); ``file_access``: leave
    DuckDB free to read and write files (default: :func:`lock_down`)."""
    db = duckdb()
    wanted = set(report_tables.TABLES if tables is None else tables)
    with _parquet_files(Path(path)) as (files, base_ns, source, load):
        con = db.connect()
        try:
            files = [os.path.abspath(f) for f in files]  # the view and allowed_paths name them alike
            _tables(con, files, base_ns, source)
            report_tables.create(con, load, base_ns, _run_of(source), wanted)
            _samples_view(con, "steps" in wanted)
            if not file_access:
                lock_down(con, files)
        except ShardsError as exc:  # a part that looked whole and is not: one line naming it
            con.close()
            raise SqlError(str(exc)) from None
        try:
            yield con
        finally:
            con.close()


@contextlib.contextmanager
def _parquet_files(p: Path) -> Iterator[tuple[list[str], int, str, Callable[[], TraceData]]]:
    if p.is_dir() and is_shards_dir(p):
        yield _of_shards(p)
        return
    if p.is_file() and not p.name.endswith((".json", ".json.gz", ".pftrace", ".pftrace.gz", ".gz")):
        raise SqlError(f"{p}: not a trace, a run directory or a span shard directory")
    if p.is_file() and p.name.endswith((".json", ".json.gz")):
        shards = _manifest_shards(p, Path(f"{p}.manifest.json"))
        if shards is not None:
            yield _of_shards(shards)
            return
        from .trace_table import convert

        tmp = Path(tempfile.mkdtemp(prefix="rl-trace-sql-"))
        try:
            base_ns = convert(p, tmp / "spans.parquet")
            yield [str(tmp / "spans.parquet")], base_ns, f"{p} (converted)", lambda: load_trace(p)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    shards_root = Path(tempfile.mkdtemp(prefix="rl-trace-sql-")) if p.is_dir() else None
    try:
        try:
            with resolve(p) as src:
                if src.shards is None and shards_root is not None:  # a run directory: merge with shards
                    from ..report.inputs import merge

                    merge([p], shards_root / "merged.json.gz", shards=shards_root / "shards")
                    yield _of_shards(shards_root / "shards")
                    return
                if src.shards is None:
                    raise SqlError(f"{p}: no span shards; re-run the merge with --shards DIR")
                yield _of_shards(src.shards)
        except InputError as exc:
            raise SqlError(str(exc)) from None
    finally:
        if shards_root is not None:
            shutil.rmtree(shards_root, ignore_errors=True)


def _manifest_shards(trace: Path, manifest: Path) -> Path | None:
    """The shards the trace's own manifest names (one that describes another merge names none)."""
    doc, _ = paired_manifest(trace, manifest)
    folder = ((doc or {}).get("shards") or {}).get("dir")
    if not (isinstance(folder, str) and is_shards_dir(folder)) or shards_mismatch(doc, Path(folder)):
        return None  # another merge's shards: the trace itself is converted instead
    return Path(folder)


def _of_shards(root: Path) -> tuple[list[str], int, str, Callable[[], TraceData]]:
    try:
        shards = Shards.open(root).whole()  # damaged parts left out, named in trace.missing_parts
    except ValueError as exc:
        raise SqlError(str(exc)) from None
    return [str(p) for p in shards.paths()], shards.base_ns, str(root), lambda: load_shards(root)


def _missing_of(source: str) -> str | None:
    """The span shard parts left out of ``source`` as damaged, in one line (None: none, or no shards)."""
    try:
        return Shards.open(source).whole().missing_line() if is_shards_dir(source) else None
    except (ValueError, OSError):
        return None


def _run_of(source: str) -> str | None:
    """The run id when the shards hold exactly one run (the report's rows do not keep it per row)."""
    try:
        runs = Shards.open(source).doc.get("runs") or []
    except (ValueError, OSError):
        return None
    return str(runs[0]) if len(runs) == 1 else None


def _tables(con: Any, files: list[str], base_ns: int, source: str) -> None:
    from ...merge.shards.schema import COLUMNS

    if files:
        listed = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
        con.execute(f"CREATE VIEW spans AS SELECT * FROM read_parquet([{listed}], hive_partitioning = false)")
    else:
        types = {"string": "VARCHAR", "int64": "BIGINT", "int32": "INTEGER"}
        cols = ", ".join(f'"{c.name}" {types[c.type]}' for c in COLUMNS)
        con.execute(f"CREATE TABLE spans ({cols})")
    con.execute(stage_macro())
    # literals, not bound parameters: binding Python values makes DuckDB import pandas (~1 s a query)
    missing = _missing_of(source)
    said = "NULL::VARCHAR" if missing is None else f"'{_quote(missing)}'"
    con.execute(
        f"CREATE TABLE trace AS SELECT {int(base_ns)}::BIGINT AS base_ns, '{_quote(source)}' AS source, "
        f"{said} AS missing_parts"
    )


def _samples_view(con: Any, steps: bool) -> None:
    """The metric sampler's points; ``step`` from the report's ``steps`` when they were built."""
    step, join = "NULL::BIGINT", ""
    if steps:
        step, join = "w.step", "LEFT JOIN steps w ON s.ts_ns >= w.start_ns AND s.ts_ns < w.end_ns"
    con.execute(
        f"""CREATE VIEW samples AS
        SELECT s.run, s.host, s.pid, s.role, s.device, {step} AS step, s.name AS track,
               regexp_extract(s.name, '^([^ {{]+)', 1) AS metric,
               substr(s.category, length('metrics.') + 1) AS kind,
               nullif(regexp_extract(s.name, '\\{{([^{{}}]*)\\}}$', 1), '') AS labels,
               s.ts_ns, CAST(json_extract(s.args, '$.value') AS DOUBLE) AS value, s.artifact
        FROM spans s {join}
        WHERE s.ph = 'C' AND s.category LIKE 'metrics.%'"""
    )
