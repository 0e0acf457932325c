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
    def __init__(self, columns: list[str], rows: list[tuple[Any, ...]]) -> None:
        self.columns, self.rows = columns, rows


def query(path: str, sql: str) -> Result:
    """Run ``sql`` on ``path``'s span table; a bad query raises ``SqlError`` with DuckDB's message."""
    with open_run(path, tables=named_in(sql)) as con:
        import duckdb

        try:
            rel = con.execute(sql)
            columns = [d[0] for d in rel.description or []]
            rows = rel.fetchall() if rel.description else []
        except duckdb.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SqlError(f"query failed: {first}") from None
    return Result(columns, rows)


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


def to_rich(result: Result, limit: int = TERMINAL_ROWS) -> Any:
    from rich.table import Table

    table = Table(show_lines=False, caption=_caption(result, limit))
    for column in result.columns:
        table.add_column(column, overflow="fold")
    for row in result.rows[:limit]:
        table.add_row(*["" if v is None else str(v) for v in row])
    return table


def _caption(result: Result, limit: int) -> str:
    n = len(result.rows)
    if n > limit:
        return f"{limit} of {n} rows shown; --csv or --json prints them all"
    return f"{n} row{'s' if n != 1 else ''}"
