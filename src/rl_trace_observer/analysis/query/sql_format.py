"""``rl-trace sql`` results as CSV, JSON (an array of objects) or a terminal table."""

from __future__ import annotations

import csv
import io
from typing import Any

import orjson

from ...common.visible import visible, visible_json
from .report_tables import named_in
from .sql import FILE_ACCESS_HINT, SqlError, check_statements, open_run

__all__ = ["Result", "query", "to_csv", "to_json", "to_rich"]

TERMINAL_ROWS = 200


class Result:
    def __init__(
        self, columns: list[str], rows: list[tuple[Any, ...]], notes: list[str] | None = None
    ) -> None:
        self.columns, self.rows, self.notes = columns, rows, notes or []


def query(path: str, sql: str, *, file_access: bool = False) -> Result:
    """Run ``sql`` on ``path``'s span table; a bad query raises ``SqlError`` with DuckDB's message.
    Read-only unless ``file_access`` (:mod:`.sql`: what a query may not do, and why)."""
    if not file_access:
        check_statements(sql)  # before the tables are built: a refused query costs nothing
    with open_run(path, tables=named_in(sql), file_access=file_access) as con:
        import duckdb

        notes = []
        (source, missing) = con.execute("SELECT source, missing_parts FROM trace").fetchone()
        if missing:
            notes.append(str(missing))
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
            if isinstance(exc, duckdb.PermissionException) or "has been locked" in first:
                first += f" ({FILE_ACCESS_HINT})"
            raise SqlError(f"query failed: {first}") from None
    return Result(columns, rows, notes)


def _plain(value: Any) -> Any:
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    return str(value)


def to_csv(result: Result, *, escape: bool = False) -> str:
    """Every row as CSV; ``escape`` (stdout is a terminal): control characters written visibly."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(result.columns)
    writer.writerows([[_plain(v) for v in row] for row in result.rows])
    return visible(buf.getvalue()) if escape else buf.getvalue()


def to_json(result: Result) -> bytes:
    """Every row as a JSON array of objects; DEL, C1 and bidi marks as ``\\uXXXX`` (the same value)."""
    records = [dict(zip(result.columns, (_plain(v) for v in row), strict=True)) for row in result.rows]
    return visible_json(orjson.dumps(records, option=orjson.OPT_APPEND_NEWLINE))


READABLE = 12  # a column narrower than this shows a value as a tower of letters: print records instead
MAX_KEY = 40


def to_rich(result: Result, limit: int = TERMINAL_ROWS, width: int = 200) -> Any:
    """A terminal table; narrower than 130 columns it loses its borders, and the first column (what
    a row is about) keeps its whole width (up to 40) where the others can still wrap to fit. When even
    that leaves a column under 12 cells (a wide result on an 80-column terminal), each row is printed
    as a record, one ``column  value`` line per column, as ``psql``'s expanded display does. Values are
    shown with their control characters escaped (:func:`~rl_trace_observer.common.visible.visible`)."""
    from rich.cells import cell_len
    from rich.console import Group
    from rich.text import Text

    from ..report.terminal import fits

    columns = [visible(c) for c in result.columns]
    cells = [[visible("" if v is None else str(v)) for v in row] for row in result.rows[:limit]]
    natural = [max([cell_len(c), *(cell_len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    floors = [min(n, READABLE) for n in natural]
    for first in (min(natural[0], MAX_KEY) if natural else 0, floors[0] if floors else 0):
        table = _table(columns, cells, width, [first, *floors[1:]][: len(columns)])
        if fits(table, width):
            return Group(table, Text(_caption(result, limit), style="dim"))  # a caption would wrap
    caption = _caption(result, limit) + f", one record each (too wide for {width} columns)"
    return Group(*_records(columns, cells, width), Text(caption, style="dim"))


def _table(columns: list[str], cells: list[list[str]], width: int, mins: list[int]) -> Any:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    narrow = width < 130
    table = Table(
        show_lines=False,
        box=box.SIMPLE_HEAD if narrow else box.HEAVY_HEAD,
        show_edge=not narrow,
        pad_edge=not narrow,
    )
    for column, least in zip(columns, mins, strict=True):
        table.add_column(Text(column), overflow="fold", min_width=least or None)
    for row in cells:
        table.add_row(*(Text(c) for c in row))
    return table


def _records(columns: list[str], cells: list[list[str]], width: int) -> list[Any]:
    """``-[ row N ]----`` then one ``column  value`` line per column (long values fold)."""
    from rich.table import Table
    from rich.text import Text

    out: list[Any] = []
    key = min(max((len(c) for c in columns), default=1), MAX_KEY)
    for n, row in enumerate(cells, 1):
        head = f"-[ row {n} ]"
        out.append(Text(head + "-" * max(0, min(width, 60) - len(head))))
        grid = Table.grid(padding=(0, 2))
        grid.add_column(min_width=key, max_width=MAX_KEY, overflow="fold")
        grid.add_column(overflow="fold")
        for column, value in zip(columns, row, strict=True):
            grid.add_row(Text(column, style="bold"), Text(value))
        out.append(grid)
    return out


def _caption(result: Result, limit: int) -> str:
    n = len(result.rows)
    if n > limit:
        return f"{limit} of {n} rows shown; --csv or --json prints them all"
    return f"{n} row{'s' if n != 1 else ''}"
