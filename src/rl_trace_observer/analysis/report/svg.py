"""Inline SVG charts for the HTML report, generated here (no plotting library, no script, no CDN).

Every string that comes from a trace passes through :func:`esc` before it reaches the markup;
numbers are formatted by us. Each chart is one ``<svg>`` with ``role="img"``, a ``<title>`` and
``<title>`` tooltips on its marks, sized by ``viewBox`` so it scales with the page.
"""

from __future__ import annotations

import html
from typing import Any

from .stages import CATEGORIES
from .style import COLORS, LABELS, OVERLAP_KEYS, fmt_ns, step_label

WIDTH = 960
LABEL_W = 190
BAR_H = 18
GAP = 6
MAX_BARS = 60
LABEL_CHARS = 28  # what fits left of the plot at 11 px (~6.5 px a character): longer ones are cut


def _label(y: int, text: str) -> str:
    """A row label that fits left of the plot: a long one keeps its head and tail (role … lane) with
    the whole text as its tooltip."""
    shown = (
        text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS // 2 - 1] + "…" + text[-(LABEL_CHARS // 2) :]
    )
    return (
        f'<text class="label" x="{LABEL_W - 6}" y="{y + 13}" text-anchor="end">'
        f"<title>{esc(text)}</title>{esc(shown)}</text>"
    )


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _ticks(span_ns: float, n: int = 5) -> list[float]:
    """Round tick positions (1/2/5 × 10^k ns) covering ``[0, span_ns]``."""
    if span_ns <= 0:
        return [0.0]
    raw = span_ns / n
    mag = 10 ** (len(str(int(raw))) - 1) if raw >= 1 else 1
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    return [i * step for i in range(int(span_ns // step) + 1)]


def _axis(y: int, span_ns: float, plot_w: int) -> list[str]:
    out = [f'<line class="axis" x1="{LABEL_W}" y1="{y}" x2="{LABEL_W + plot_w}" y2="{y}"/>']
    for t in _ticks(span_ns):
        x = LABEL_W + plot_w * t / span_ns if span_ns else LABEL_W
        out.append(f'<line class="tick" x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}"/>')
        out.append(
            f'<text class="tick" x="{x:.1f}" y="{y + 16}" text-anchor="middle">{esc(fmt_ns(t))}</text>'
        )
    return out


def _legend(items: list[tuple[str, str]], y: int) -> list[str]:
    out, x = [], LABEL_W
    for label, color in items:
        out.append(f'<rect x="{x}" y="{y - 10}" width="12" height="12" fill="{color}"/>')
        out.append(f'<text class="legend" x="{x + 16}" y="{y}">{esc(label)}</text>')
        x += 24 + 7 * len(label)
    return out


def _svg(title: str, height: int, body: list[str], css_class: str) -> str:
    return (
        f'<svg class="chart {css_class}" role="img" viewBox="0 0 {WIDTH} {height}" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{esc(title)}</title>' + "".join(body) + "</svg>"
    )


def _bar(x: float, y: int, w: float, color: str, tip: str) -> str:
    return (
        f'<rect x="{x:.2f}" y="{y}" width="{max(w, 0):.2f}" height="{BAR_H}" fill="{color}">'
        f"<title>{esc(tip)}</title></rect>"
    )


def step_breakdown(summary: dict[str, Any]) -> str:
    """Stacked bars: one per (step, role), the role's mean per-rank time in each category + idle."""
    rows = [(st, role) for st in summary["steps"] for role in st["roles"]][:MAX_BARS]
    plot_w = WIDTH - LABEL_W - 20
    longest = max((st["dur_ns"] for st, _ in rows), default=0) or 1
    body = _legend([(LABELS[c], COLORS[c]) for c in CATEGORIES], 16)
    y = 30
    for st, role in rows:
        label = f"step {step_label(st['step'])} · {role['role']}"
        body.append(_label(y, label))
        x = float(LABEL_W)
        for cat in CATEGORIES:
            w = plot_w * role["mean_ns"][cat] / longest
            tip = f"{label}: {LABELS[cat]} {fmt_ns(role['mean_ns'][cat])} (mean of {role['ranks']} lanes)"
            body.append(_bar(x, y, w, COLORS[cat], tip))
            x += w
        y += BAR_H + GAP
    body += _axis(y + 2, longest, plot_w)
    return _svg("Per-step breakdown by role (mean per lane)", y + 26, body, "breakdown")


def overlap_chart(summary: dict[str, Any]) -> str:
    """Stacked bars per step: generation only, both at once, training only, neither."""
    steps = summary["steps"][:MAX_BARS]
    plot_w = WIDTH - LABEL_W - 20
    longest = max((st["dur_ns"] for st in steps), default=0) or 1
    body = _legend([(label, color) for _, label, color in OVERLAP_KEYS], 16)
    y = 30
    for st in steps:
        label = f"step {step_label(st['step'])}"
        body.append(_label(y, label))
        x = float(LABEL_W)
        for key, name, color in OVERLAP_KEYS:
            w = plot_w * st["overlap"][key] / longest
            body.append(_bar(x, y, w, color, f"{label}: {name} {fmt_ns(st['overlap'][key])}"))
            x += w
        y += BAR_H + GAP
    body += _axis(y + 2, longest, plot_w)
    return _svg("Rollout / training overlap per step", y + 26, body, "overlap")


def gantt_chart(summary: dict[str, Any]) -> str:
    """One row per (role, lane) with its spans in one step, coloured by category."""
    g = summary.get("gantt")
    if not g or not g["lanes"]:
        return ""
    span_ns = g["end_ns"] - g["start_ns"] or 1
    plot_w = WIDTH - LABEL_W - 20
    body = _legend([(LABELS[c], COLORS[c]) for c in CATEGORIES if c != "idle"], 16)
    y = 30
    for lane in g["lanes"]:
        label = f"{lane['role']} · {lane['lane']}"
        body.append(_label(y, label))
        body.append(f'<rect class="lane" x="{LABEL_W}" y="{y}" width="{plot_w}" height="{BAR_H}"/>')
        for offset, dur, name, cat in lane["spans"]:
            x = LABEL_W + plot_w * offset / span_ns
            w = max(plot_w * dur / span_ns, 0.75)
            tip = f"{name} ({LABELS.get(cat, cat)}): {fmt_ns(dur)} at +{fmt_ns(offset)}"
            body.append(_bar(x, y, w, COLORS.get(cat, COLORS["other"]), tip))
        y += BAR_H + GAP
    body += _axis(y + 2, span_ns, plot_w)
    return _svg(f"Per-lane timeline of step {step_label(g['step'])}", y + 26, body, "gantt")
