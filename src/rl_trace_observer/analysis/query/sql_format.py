"""``rl-trace sql`` results as CSV, JSON (an array of objects) or a terminal table."""

from __future__ import annotations

import csv
import io
from typing import Any

import orjson

from .report_tables import named_in
from .sql import SqlError, open_run

__all__ = ["Result", "query", "to_csv", "to_json", "to_rich"]

TERMINAL_ROWS = 200


class Result:
    def __init__(
        self, columns: list[str], rows: list[tuple[Any, ...]], notes: list[str] | None = None
    ) -> None:
        self.columns, self.rows, self.notes = columns, rows, notes or []


def query(path: str, sql: str) -> Result:
    """Run ``sql`` on ``path``'s span table; a bad query raises ``SqlError`` with DuckDB's message."""
    with open_run(path, tables=named_in(sql)) as con:
        import duckdb

        notes = []
        (source,) = con.execute("SELECT source FROM trace").fetchone()
        if str(source).endswith(" (converted)"):
            notes.append(
                f"{path} has no span shards, so it was converted for this query (again on every query; "
                "flow ids, run and artifact are null): merge once with --shards DIR and query DIR"
            )
        try:
            rel = con.execute(sql)
            columns = [d[0] for d in rel.description or []]
            rows = rel.fetchall() if rel.description else []
        except duckdb.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SqlError(f"query failed: {first}") from None
    return Result(columns, rows, notes)


def _plain(value: Any) -> Any:
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    return str(value)


def to_csv(result: Result) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(result.columns)
    writer.writerows([[_plain(v) for v in row] for row in result.rows])
    return buf.getvalue()


def to_json(result: Result) -> bytes:
    records = [dict(zip(result.columns, (_plain(v) for v in row), strict=True)) for row in result.rows]
    return orjson.dumps(records, option=orjson.OPT_APPEND_NEWLINE)


def to_rich(result: Result, limit: int = TERMINAL_ROWS, width: int = 200) -> Any:
    """A terminal table; narrower than 130 columns it loses its borders, and the first column (what
    a row is about) keeps its whole width (up to 40) where the others can still wrap to fit."""
    from rich.console import Group
    from rich.text import Text

    from ..report.terminal import fits

    cells = [["" if v is None else str(v) for v in row] for row in result.rows[:limit]]
    key = min(max((len(r[0]) for r in cells if r), default=1), 40)
    table = _table(result, cells, limit, width, key)
    if not fits(table, width):
        table = _table(result, cells, limit, width, None)
    return Group(table, Text(_caption(result, limit), style="dim"))  # a caption would wrap to the table


def _table(result: Result, cells: list[list[str]], limit: int, width: int, key: int | None) -> Any:
    from rich import box
    from rich.table import Table

    narrow = width < 130
    table = Table(
        show_lines=False,
        box=box.SIMPLE_HEAD if narrow else box.HEAVY_HEAD,
        show_edge=not narrow,
        pad_edge=not narrow,
    )
    for i, column in enumerate(result.columns):
        table.add_column(column, overflow="fold", min_width=key if i == 0 else None)
    for row in cells:
        table.add_row(*row)
    return table


def _caption(result: Result, limit: int) -> str:
    n = len(result.rows)
    if n > limit:
        return f"{limit} of {n} rows shown; --csv or --json prints them all"
    return f"{n} row{'s' if n != 1 else ''}"
