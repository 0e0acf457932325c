"""``rl-trace diff`` output: a terminal table, a self-contained HTML page, the JSON document."""

from __future__ import annotations

from typing import Any

import orjson

from ..report.html import CSP, CSS, esc
from ..report.style import fmt_ns

MAX_TERMINAL_ROWS = 40


def _cells(row: dict[str, Any]) -> list[str]:
    pct = f"{row['delta_pct']:+.1f}%" if row["delta_pct"] is not None else "new"
    if row.get("unit", "ns") != "ns":  # a metric sampler series, in its own unit
        unit = f" {row['unit']}"
        return [
            row["key"],
            f"{row['a']:.4g}{unit}",
            f"{row['b']:.4g}{unit}",
            f"{row['delta']:+.4g}",
            pct,
            f"±{row['noise']:.3g}",
            verdict(row),
        ]
    sign = "+" if row["delta_ns"] > 0 else ""
    return [
        row["key"],
        fmt_ns(row["a_ns"]),
        fmt_ns(row["b_ns"]),
        f"{sign}{fmt_ns(row['delta_ns'])}",
        pct,
        f"±{fmt_ns(row['noise_ns'])}",
        verdict(row),
    ]


def verdict(row: dict[str, Any]) -> str:
    """``noise`` inside the band, ``CHANGED`` outside it; with one step on a side there is no band
    (no spread to estimate it from), so only an exact tie is ``same``."""
    if row["delta"] == 0:
        return "same"
    if not row.get("noise_known", True):
        return "no band"
    return "noise" if row["within_noise"] else "CHANGED"


HEADERS = ["series (per step)", "A", "B", "B − A", "%", "noise band", "verdict"]


CAPTION = "ranked by how far each change lies outside its noise band (2 standard errors)"


def terminal(result: dict[str, Any], limit: int = MAX_TERMINAL_ROWS, width: int = 200) -> Any:
    """The table for a terminal ``width`` columns wide: the series (what a user greps for) and the
    verdict are never cut; a narrow one leaves out B − A first (``%`` and the band remain)."""
    from rich.console import Group
    from rich.text import Text

    from ...common.visible import visible_tree
    from ..report.rollout_tables import PlainTable
    from ..report.terminal import COMPACT_BELOW, plain_table

    result = visible_tree(result)  # role and stage names come from the traces
    rows = result["rows"][:limit]
    plain = PlainTable(
        f"rl-trace diff: A = {result['a']}  B = {result['b']}",
        HEADERS,
        [_cells(r) for r in rows],
        left=(0, 6),
        short={0: "series", 5: "noise"},
        drop=(3, 1),
        styles=["" if verdict(r) != "CHANGED" else ("red" if r["delta"] > 0 else "green") for r in rows],
    )
    return Group(plain_table(plain, width < COMPACT_BELOW, width), Text(CAPTION, style="dim"))


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
