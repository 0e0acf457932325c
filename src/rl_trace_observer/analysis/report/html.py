"""The report as one self-contained HTML file: inline CSS and SVG, no script, no network.

Traces are untrusted input, so every trace-derived string is escaped (:func:`.svg.esc`), and a
Content-Security-Policy that allows no script at all backs that up: even a missed escape could not
run code. The page works offline and from ``file://``.
"""

from __future__ import annotations

from typing import Any

from . import gpu_tables as gpu_render
from . import svg
from .answer_tables import tables as answer_tables
from .rollout_tables import tables as rollout_tables
from .stages import CATEGORIES
from .style import (
    COLORS,
    LABELS,
    OVERLAP_KEYS,
    SLOWEST_NOTE,
    SLOWEST_TITLE,
    STEP_TABLE_NOTE,
    fmt_ns,
    fmt_pct,
    fmt_value,
    problem_groups,
    span_step_label,
    step_label,
    worst_arrival,
)
from .telemetry_tables import tables as telemetry_tables

esc = svg.esc
# No script source at all: a missed escape still could not run code. Inline styles only.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
MAX_ROWS = 200
MAX_STRAGGLERS = 25
MAX_METRIC_STEPS = 12

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d1d1f;
  background:#fafafa}
main{max-width:1040px;margin:0 auto;padding:24px}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:17px;margin:32px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.sub{color:#555;margin:0 0 16px;word-break:break-all}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin:16px 0}
.card{background:#fff;border:1px solid #e2e2e2;border-radius:8px;padding:10px 14px;min-width:150px}
.card b{display:block;font-size:20px}.card span{color:#555;font-size:12px}
table{border-collapse:collapse;background:#fff;margin:8px 0;font-size:13px;width:100%}
th,td{border:1px solid #e2e2e2;padding:4px 8px;text-align:right;vertical-align:top}
th{background:#f0f0f0}td.l,th.l{text-align:left;word-break:break-all}
.chart{width:100%;height:auto;background:#fff;border:1px solid #e2e2e2;border-radius:8px;margin:8px 0}
.chart text{font:11px system-ui,sans-serif;fill:#333}.chart .axis,.chart .tick{stroke:#888}
.chart .lane{fill:#f3f3f3}.sw{display:inline-block;width:10px;height:10px;margin-right:4px}
.warn{color:#a15c00}.muted{color:#777}code{font-size:12px}
"""


def _table(headers: list[str], rows: list[list[str]], left: tuple[int, ...] = ()) -> str:
    """``rows`` hold already-escaped cell HTML; columns in ``left`` are text (left-aligned)."""

    def cls(i: int) -> str:
        return ' class="l"' if i in left else ""

    head = "".join(f"<th{cls(i)}>{esc(h)}</th>" for i, h in enumerate(headers))
    body = "".join(
        "<tr>" + "".join(f"<td{cls(i)}>{c}</td>" for i, c in enumerate(r)) + "</tr>" for r in rows[:MAX_ROWS]
    )
    more = ""
    if len(rows) > MAX_ROWS:
        more = f'<p class="muted">… {len(rows) - MAX_ROWS} more rows in the JSON summary</p>'
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}"


def _cards(summary: dict[str, Any]) -> str:
    steps = summary["steps"]
    cards: list[tuple[str, str]] = [("steps", str(len(steps)))]
    if steps:
        total = sum(s["dur_ns"] for s in steps)
        cards.append(("mean step", fmt_ns(total / len(steps))))
        idle = sum(r["time_ns"]["idle"] for s in steps for r in s["ranks"])
        lane_time = sum(s["dur_ns"] * len(s["ranks"]) for s in steps)
        cards.append(("idle: share of every lane's step time", fmt_pct(idle, lane_time)))
        ov = summary.get("overlap") or {}
        cards.append(("rollout ∥ training", fmt_pct(ov.get("both_ns", 0), sum(ov.values()) if ov else 0)))
    worst = worst_arrival(summary)
    if worst is not None:  # by arrival, as the arrivals table (durations hide stragglers)
        where = worst["point"] if worst["role"] == "*" else f"{worst['point']} ({worst['role']})"
        cards.append(
            (
                f"worst straggler by arrival: {worst['lane']} at {where}, median lag behind the next",
                f"+{fmt_ns(worst['median_lag_ns'])}",
            )
        )
    clock = summary.get("clock") or {}
    cards.append(("clock alignment", str(clock.get("quality", "unknown"))))
    return (
        '<div class="cards">'
        + "".join(f"<div class=card><b>{esc(v)}</b><span>{esc(k)}</span></div>" for k, v in cards)
        + "</div>"
    )


def _steps_section(summary: dict[str, Any]) -> str:
    rows = []
    for st in summary["steps"]:
        for role in st["roles"]:
            mean = role["mean_ns"]
            rows.append(
                [
                    esc(step_label(st["step"]) + (" *" if st["profiled"] else "")),
                    esc(fmt_ns(st["dur_ns"])),
                    esc(role["role"]),
                    str(role["ranks"]),
                ]
                + [esc(f"{fmt_ns(mean[c])} · {fmt_pct(mean[c], st['dur_ns'])}") for c in CATEGORIES]
            )
    headers = ["step", "wall", "role", "lanes", *(LABELS[c] for c in CATEGORIES)]
    return (
        "<h2>Where each step's time went</h2>"
        + svg.step_breakdown(summary)
        + _table(headers, rows, (2,))
        + f'<p class="muted">{esc(STEP_TABLE_NOTE)}. * = profiled step.</p>'
    )


def _ranks_section(summary: dict[str, Any]) -> str:
    g = summary.get("gantt")
    st = next((s for s in summary["steps"] if g and s["step"] == g["step"]), None)
    if st is None:
        return ""
    rows = [
        [esc(r["role"]), esc(r["lane"])] + [esc(fmt_ns(r["time_ns"][c])) for c in CATEGORIES]
        for r in st["ranks"]
    ]
    return (
        f"<h2>Step {esc(step_label(st['step']))}: every lane</h2>"
        + svg.gantt_chart(summary)
        + _table(["role", "lane", *(LABELS[c] for c in CATEGORIES)], rows, (0, 1))
    )


def _overlap_section(summary: dict[str, Any]) -> str:
    rows = [
        [esc(step_label(s["step"])), esc(fmt_ns(s["dur_ns"]))]
        + [
            esc(f"{fmt_ns(s['overlap'][k])} · {fmt_pct(s['overlap'][k], s['dur_ns'])}")
            for k, _, _ in OVERLAP_KEYS
        ]
        for s in summary["steps"]
    ]
    return (
        "<h2>Rollout / training overlap</h2>"
        + svg.overlap_chart(summary)
        + _table(["step", "wall", *(label for _, label, _ in OVERLAP_KEYS)], rows)
        + '<p class="muted">Wall time during which some lane generates and/or some lane computes '
        "log-probs or updates. Synchronous PPO shows no overlap; one-step-off-policy and fully async "
        "trainers do.</p>"
    )


def _stragglers_section(summary: dict[str, Any]) -> str:
    rows = [
        [
            esc(step_label(s["step"])),
            esc(s["role"]),
            esc(s["stage"]),
            str(s["lanes"]),
            esc(s["slowest_lane"]),
            esc(fmt_ns(s["slowest_ns"])),
            esc(fmt_ns(s["median_ns"])),
            esc(fmt_ns(s["lag_ns"]) + (f" (+{s['lag_pct']:.0f}%)" if s["lag_pct"] is not None else "")),
        ]
        for s in summary["stragglers"]
    ]
    title = f"<h2>{esc(SLOWEST_TITLE)}</h2>"
    if not rows:
        return title + "<p class=muted>No stage ran on two or more lanes of one role.</p>"
    headers = ["step", "role", "stage", "lanes", "slowest lane", "its time", "median", "lag"]
    return (
        title
        + _table(headers, rows[:MAX_STRAGGLERS], (1, 2, 4))
        + f'<p class="muted">{esc(SLOWEST_NOTE)}</p>'
    )


def _longest_section(summary: dict[str, Any]) -> str:
    rows = [
        [
            esc(fmt_ns(s["dur_ns"])),
            esc(s["name"]),
            esc(span_step_label(s["step"])),
            esc(s["process"]),
            esc(s["thread"]),
        ]
        for s in summary["longest_spans"]
    ]
    return "<h2>Longest spans</h2>" + _table(
        ["duration", "name", "step", "process", "thread"], rows, (1, 3, 4)
    )


def _metrics_section(summary: dict[str, Any]) -> str:
    metrics = summary["metrics"]
    if not metrics:
        return ""
    steps = sorted({r["step"] for m in metrics for r in m["steps"]}, key=lambda s: (s is None, s or 0))
    shown = steps[-MAX_METRIC_STEPS:]
    rows = []
    for m in metrics:
        by = {r["step"]: r["mean"] for r in m["steps"]}
        rows.append([esc(m["name"])] + [esc(fmt_value(by.get(s))) for s in shown])
    return "<h2>Scalar metrics per step</h2>" + _table(
        ["metric", *(f"step {step_label(s)}" for s in shown)], rows, (0,)
    )


def _provenance_section(summary: dict[str, Any]) -> str:
    clock = summary.get("clock") or {}
    out = [
        "<h2>Clock alignment and artifacts</h2>",
        f"<p>Clock alignment: <b>{esc(clock.get('quality', 'unknown'))}</b> — {esc(clock.get('why', ''))} "
        f"(mode {esc(clock.get('mode'))}).</p>",
    ]
    hosts = clock.get("hosts") or []
    if hosts:
        rows = [
            [
                esc(h["host"]),
                esc(h["method"]),
                "yes" if h["applied"] is True else ("no" if h["applied"] is False else esc(h["applied"])),
                esc(fmt_ns(h["offset_ns"])),
                esc(fmt_ns(h["uncertainty_ns"])),
                esc(fmt_value(h["drift_ppm"])),
            ]
            for h in hosts
        ]
        out.append(_table(["host", "method", "applied", "offset", "± bound", "drift ppm"], rows, (0, 1)))
    arts = summary.get("artifacts")
    if arts is None:
        out.append('<p class="muted">Artifacts: unknown (no merge manifest next to the trace).</p>')
        return "".join(out)
    rows = [
        [esc(k), str(v["files"]), str(v["complete"]), str(v["incomplete"]), str(v["skipped"])]
        for k, v in arts["by_kind"].items()
    ]
    out.append(f"<p>Merge status: <b>{esc(arts['status'])}</b>, {arts['problem_count']} problem(s).</p>")
    out.append(_table(["kind", "files", "complete", "incomplete", "skipped"], rows, (0,)))
    if arts["problems"]:
        items = "".join(_problem_item(kind, group) for kind, group in problem_groups(arts["problems"]))
        out.append(f"<ul>{items}</ul>")
    return "".join(out)


def _problem_item(kind: str, group: list[dict[str, Any]]) -> str:
    """One line per kind of problem; the other files of that kind behind a <details> (no script)."""
    first = group[0]
    head = f"{esc(kind)}: <code>{esc(first['path'])}</code>: {esc(first['detail'])}"
    if len(group) == 1:
        return f"<li class=warn>{head}</li>"
    rest = "".join(f"<li><code>{esc(p['path'])}</code>: {esc(p['detail'])}</li>" for p in group[1:])
    return (
        f"<li class=warn>{head}<details><summary>{len(group) - 1} more like it</summary>"
        f"<ul>{rest}</ul></details></li>"
    )


def _stage_table(summary: dict[str, Any]) -> str:
    rows = []
    for r in summary["stage_table"]:
        swatch = f'<span class="sw" style="background:{COLORS.get(r["category"], "#999")}"></span>'
        rows.append(
            [swatch + esc(LABELS.get(r["category"], r["category"])), f"<code>{esc(r['pattern'])}</code>"]
        )
    return (
        "<details><summary>How span names become categories</summary>"
        + _table(["category", "pattern (first match wins; no match: other)"], rows, (0, 1))
        + "</details>"
    )


def _rollout_section(summary: dict[str, Any]) -> str:
    """Requests, tail, replicas, weight sync, staleness (:mod:`.rollout_tables`); empty without them."""
    return _plain_section(
        "Rollout: requests, long tail, weight sync, staleness",
        rollout_tables(summary.get("rollout")),
    )


def _telemetry_section(summary: dict[str, Any]) -> str:
    """Engines, GPUs and hosts from the metric sampler (:mod:`.telemetry_tables`); empty without them."""
    return _plain_section("Telemetry: engines, GPUs, hosts", telemetry_tables(summary.get("telemetry")))


def _answers_section(summary: dict[str, Any]) -> str:
    """Goodput, idle causes, stragglers by arrival, critical path (:mod:`.answer_tables`)."""
    return _plain_section("Answers: goodput, idle causes, stragglers, critical path", answer_tables(summary))


def _gpu_section(summary: dict[str, Any]) -> str:
    """What the GPUs did per step, device and stage (:mod:`.gpu_tables`); empty without kernels."""
    plain = gpu_render.tables(summary)
    if not plain:
        return ""
    return _plain_section("GPU: busy, idle and why, per step and stage", plain).replace(
        "</h2>", "</h2>" + gpu_render.chart(summary), 1
    )


def _plain_section(title: str, plain: list[Any]) -> str:
    if not plain:
        return ""
    parts = [f"<h2>{esc(title)}</h2>"]
    for t in plain:
        rows = [[esc(c) for c in row] for row in t.rows]
        parts.append(f"<h3>{esc(t.title)}</h3>" + _table(t.headers, rows, t.left))
        if t.note:
            parts.append(f'<p class="muted">{esc(t.note)}</p>')
    return "".join(parts)


def render(summary: dict[str, Any]) -> str:
    src = summary["source"]
    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        "<title>RL Trace Observer report</title>",
        f"<style>{CSS}</style></head><body><main>",
        "<h1>RL Trace Observer report</h1>",
        f'<p class="sub">{esc(src["path"])} · {src["events"]} events · {src["stage_spans"]} stage spans '
        f"({esc(src['stage_source'])})</p>",
        _cards(summary),
    ]
    if src.get("missing_note"):  # damaged span shard parts left out: the figures cover the others
        parts.append(f"<p class=warn>incomplete: {esc(src['missing_note'])}</p>")
    note = gpu_render.banner(summary)
    if note:
        parts.append(f"<p class=warn>{esc(note)}</p>")
    if any(st["roles"] for st in summary["steps"]):
        parts += [_steps_section(summary), _ranks_section(summary), _overlap_section(summary)]
    elif not summary.get("gpu"):
        parts.append(
            "<p class=warn>No stage spans found: is this a merged trace of an RL-Insight-instrumented "
            "run?</p>"
        )
    parts.append(_gpu_section(summary))
    parts.append(_answers_section(summary))
    parts += [_stragglers_section(summary), _longest_section(summary), _metrics_section(summary)]
    parts.append(_rollout_section(summary))
    parts.append(_telemetry_section(summary))
    parts += [_provenance_section(summary), _stage_table(summary)]
    parts.append(
        f'<p class="muted">Summary schema {esc(summary["schema"])} · generated by rl-trace-observer</p>'
    )
    parts.append("</main></body></html>")
    return "\n".join(parts)
