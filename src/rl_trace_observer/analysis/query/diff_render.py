"""``rl-trace diff`` output: a terminal table, a self-contained HTML page, the JSON document."""

from __future__ import annotations

from typing import Any

import orjson

from ..report.html import CSP, CSS, esc
from ..report.style import fmt_ns

MAX_TERMINAL_ROWS = 40


def _cells(row: dict[str, Any]) -> list[str]:
    pct = f"{row['delta_pct']:+.1f}%" if row["delta_pct"] is not None else "new"
    sign = "+" if row["delta_ns"] > 0 else ""
    return [
        row["key"],
        fmt_ns(row["a_ns"]),
        fmt_ns(row["b_ns"]),
        f"{sign}{fmt_ns(row['delta_ns'])}",
        pct,
        f"±{fmt_ns(row['noise_ns'])}",
        "noise" if row["within_noise"] else "CHANGED",
    ]


HEADERS = ["series (per step)", "A", "B", "B − A", "%", "noise band", "verdict"]


def terminal(result: dict[str, Any], limit: int = MAX_TERMINAL_ROWS) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(
        title=f"rl-trace diff: A = {result['a']}  B = {result['b']}",
        title_justify="left",
        caption="ranked by how far each change lies outside its noise band (2 standard errors)",
    )
    widest = max((len(r["key"]) for r in result["rows"][:limit]), default=10)
    for i, h in enumerate(HEADERS):
        # the series name is what a user greps for: never cut it
        width = min(widest, 48) if i == 0 else None
        table.add_column(h, justify="left" if i in (0, 6) else "right", overflow="fold", min_width=width)
    for row in result["rows"][:limit]:
        cells = _cells(row)
        style = "" if row["within_noise"] else ("red" if row["delta_ns"] > 0 else "green")
        table.add_row(*(Text(c) for c in cells), style=style)
    return table


def html(result: dict[str, Any]) -> str:
    body = "".join(
        "<tr>"
        + "".join(f"<td{' class=l' if i in (0, 6) else ''}>{esc(c)}</td>" for i, c in enumerate(_cells(r)))
        + "</tr>"
        for r in result["rows"]
    )
    head = "".join(f"<th{' class=l' if i in (0, 6) else ''}>{esc(h)}</th>" for i, h in enumerate(HEADERS))
    return (
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f"<title>rl-trace diff</title><style>{CSS}</style></head><body><main>"
        "<h1>rl-trace diff</h1>"
        f'<p class="sub">A = {esc(str(result["a"]))}<br>B = {esc(str(result["b"]))}</p>'
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        '<p class="muted">Mean time per step (roles: per lane); noise band = 2·√(s²A/nA + s²B/nB) '
        f"over the steps; schema {esc(result['schema'])}.</p></main></body></html>"
    )


def json_bytes(result: dict[str, Any]) -> bytes:
    return orjson.dumps(result, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)
