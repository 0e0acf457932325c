"""The report as terminal tables (rich). Trace-derived strings go in as ``Text``, never as markup, and
with their control characters escaped (:func:`~rl_trace_observer.common.visible.visible_tree`)."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ...common.visible import visible_tree
from . import gpu_tables as gpu_render
from .answer_tables import tables as answer_tables
from .rollout_tables import tables as rollout_tables
from .stages import CATEGORIES
from .style import (
    LABELS,
    OVERLAP_KEYS,
    SLOWEST_NOTE,
    SLOWEST_TITLE,
    STEP_TABLE_NOTE,
    fmt_ns,
    fmt_pct,
    fmt_value,
    problem_groups,
    problem_line,
    span_step_label,
    step_label,
)
from .telemetry_tables import tables as telemetry_tables

MAX_STEP_ROWS = 50
MAX_RANK_TABLES = 4
MAX_METRIC_STEPS = 8
COMPACT_BELOW = 130  # terminal columns under which tables show shares, not durations


def _t(value: Any) -> Text:
    return Text("" if value is None else str(value))


SHORT = {
    "generation": "gen",
    "log_prob": "logp",
    "update": "upd",
    "weight_sync": "sync",
    "other": "other",
    "idle": "idle",
}


def _table(title: str, compact: bool) -> Table:
    """Narrow terminals get borderless tables and short headers rather than wrapped cells."""
    if compact:
        return Table(
            title=title,
            title_justify="left",
            box=box.SIMPLE_HEAD,
            pad_edge=False,
            padding=(0, 1),
            show_edge=False,
            collapse_padding=True,
        )
    return Table(title=title, title_justify="left")


def _label(category: str, compact: bool) -> str:
    return SHORT[category] if compact else LABELS[category]


def _cell(part: float, whole: float, compact: bool) -> str:
    """``289.6 ms 23%``, or only the share on a narrow terminal (the JSON has every number)."""
    return fmt_pct(part, whole) if compact else f"{fmt_ns(part)} {fmt_pct(part, whole)}"


def _steps_table(summary: dict[str, Any], compact: bool) -> Table:
    title = "Where each step's time went (mean per lane, by role" + (", % of the step)" if compact else ")")
    table = _table(title, compact)
    for col in ("step", "wall", "role", "lanes", *(_label(c, compact) for c in CATEGORIES)):
        table.add_column(col, justify="left" if col == "role" else "right")
    for st in summary["steps"][:MAX_STEP_ROWS]:
        for i, role in enumerate(st["roles"]):
            mean = role["mean_ns"]
            table.add_row(
                step_label(st["step"]) + (" *" if st["profiled"] and i == 0 else "") if i == 0 else "",
                fmt_ns(st["dur_ns"]) if i == 0 else "",
                _t(role["role"]),
                str(role["ranks"]),
                *(_cell(mean[c], st["dur_ns"], compact) for c in CATEGORIES),
            )
        table.add_section()
    return table


def _rank_table(st: dict[str, Any], compact: bool) -> Table:
    title = f"Step {step_label(st['step'])} ({fmt_ns(st['dur_ns'])}): per role and lane"
    table = _table(title + (", % of the step" if compact else ""), compact)
    for col in ("role", "lane", *(_label(c, compact) for c in CATEGORIES)):
        table.add_column(col, justify="left" if col in ("role", "lane") else "right", no_wrap=True)
    for r in st["ranks"]:
        t = r["time_ns"]
        cells = (fmt_pct(t[c], st["dur_ns"]) if compact else fmt_ns(t[c]) for c in CATEGORIES)
        table.add_row(_t(r["role"]), _t(r["lane"]), *cells)
    return table


def _overlap_table(summary: dict[str, Any], compact: bool) -> Table:
    table = _table("Rollout / training overlap (wall time of each step)", compact)
    table.add_column("step", justify="right")
    table.add_column("wall", justify="right")
    for _, label, _ in OVERLAP_KEYS:
        table.add_column(label, justify="right")
    rows = [(step_label(s["step"]), s["dur_ns"], s["overlap"]) for s in summary["steps"][:MAX_STEP_ROWS]]
    if summary.get("overlap") and len(summary["steps"]) > 1:
        run = summary["overlap"]
        rows.append(("run", sum(run.values()), run))
    for label, dur, ov in rows:
        table.add_row(label, fmt_ns(dur), *(_cell(ov[k], dur, compact) for k, _, _ in OVERLAP_KEYS))
    return table


def _stragglers_table(summary: dict[str, Any], limit: int, compact: bool) -> Table:
    table = _table(SLOWEST_TITLE, compact)
    cols = (
        ("step", "role", "stage", "slowest", "lag")
        if compact
        else ("step", "role", "stage", "lanes", "slowest", "time", "median", "lag")
    )
    for col in cols:
        table.add_column(col, justify="left" if col in ("role", "stage", "slowest") else "right")
    for s in summary["stragglers"][:limit]:
        lag = fmt_ns(s["lag_ns"]) + (f" (+{s['lag_pct']:.0f}%)" if s["lag_pct"] is not None else "")
        head = (step_label(s["step"]), _t(s["role"]), _t(s["stage"]))
        if compact:
            table.add_row(*head, _t(s["slowest_lane"]), lag)
        else:
            times = (fmt_ns(s["slowest_ns"]), fmt_ns(s["median_ns"]), lag)
            table.add_row(*head, str(s["lanes"]), _t(s["slowest_lane"]), *times)
    return table


def _longest_table(summary: dict[str, Any], compact: bool) -> Table:
    table = _table("Longest spans (any source)", compact)
    cols = ("duration", "name", "step", "process") + (() if compact else ("thread",))
    for col in cols:  # a long name (a kernel's) folds onto the next line rather than be cut
        number = col in ("duration", "step")
        table.add_column(col, justify="right" if number else "left", overflow="fold", no_wrap=number)
    for s in summary["longest_spans"]:
        row: list[str | Text] = [
            fmt_ns(s["dur_ns"]),
            _t(s["name"]),
            span_step_label(s["step"]),
            _t(s["process"]),
            _t(s["thread"]),
        ]
        table.add_row(*row[: len(cols)])
    return table


def _metrics_table(summary: dict[str, Any], limit: int, compact: bool) -> Table | None:
    metrics = summary["metrics"][:limit]
    if not metrics:
        return None
    steps = sorted({r["step"] for m in metrics for r in m["steps"]}, key=lambda s: (s is None, s or 0))
    shown = steps[-(4 if compact else MAX_METRIC_STEPS) :]
    title = "Scalar metrics per step (mean over processes)"
    if len(steps) > len(shown):
        title += f" — last {len(shown)} of {len(steps)} steps"
    table = _table(title, compact)
    table.add_column("metric")
    for s in shown:
        table.add_column(f"step {step_label(s)}", justify="right")
    for m in metrics:
        by_step = {r["step"]: r["mean"] for r in m["steps"]}
        table.add_row(_t(m["name"]), *(fmt_value(by_step.get(s)) for s in shown))
    return table


def _provenance(console: Console, summary: dict[str, Any]) -> None:
    clock, arts = summary.get("clock") or {}, summary.get("artifacts")
    line = Text("Clock alignment: ")
    line.append(str(clock.get("quality", "unknown")), style="bold")
    line.append(f" — {clock.get('why', '')}; mode {clock.get('mode')}")
    if clock.get("worst_uncertainty_ns") is not None:
        line.append(f", worst bound ±{fmt_ns(clock['worst_uncertainty_ns'])}")
    console.print(line)
    if arts is None:
        console.print("Artifacts: unknown (no merge manifest next to the trace)")
        return
    kinds = ", ".join(
        f"{k} {v['complete']}/{v['files']}" + (f" ({v['incomplete']} incomplete)" if v["incomplete"] else "")
        for k, v in arts["by_kind"].items()
    )
    console.print(Text(f"Artifacts ({arts['status']}): {kinds}; {arts['problem_count']} problem(s)"))
    for kind, items in problem_groups(arts["problems"])[:10]:
        console.print(Text(f"  {problem_line(kind, items)}"), style="yellow")


def render(summary: dict[str, Any], console: Console, *, top: int = 10) -> None:
    summary = visible_tree(summary)  # names from the trace: no ESC, NUL, CR or bidi mark reaches the tty
    src = summary["source"]
    head = Text("RL Trace Observer report", style="bold")
    head.append(f" — {src['path']}", style="")
    console.print(head)
    console.print(
        f"{src['events']} events, {src['stage_spans']} stage spans ({src['stage_source']}), "
        f"{len(summary['steps'])} step(s); * = profiled step"
    )
    compact = console.width < COMPACT_BELOW
    if src.get("missing_note"):
        console.print(Text(f"incomplete: {src['missing_note']}", style="yellow"))
    note = gpu_render.banner(summary)
    if note:
        console.print(Text(note, style="yellow"))
    if not any(st["roles"] for st in summary["steps"]):
        if not summary.get("gpu"):
            console.print("No stage spans found: is this a merged trace of an RL-Insight-instrumented run?")
    else:
        console.print(_steps_table(summary, compact))
        console.print(_t(STEP_TABLE_NOTE))
        focus = [s for s in summary["steps"] if s["profiled"]] or summary["steps"]
        for st in focus[:MAX_RANK_TABLES]:
            console.print(_rank_table(st, compact))
        console.print(_overlap_table(summary, compact))
    _plain(console, gpu_render.tables(summary), compact)  # the same width rules as every table
    _plain(console, answer_tables(summary, top=top), compact)
    if summary["stragglers"]:
        console.print(_stragglers_table(summary, top, compact))
        console.print(_t(SLOWEST_NOTE))
    if summary["longest_spans"]:
        console.print(_longest_table(summary, compact))
    metrics = _metrics_table(summary, 3 * top, compact)
    if metrics is not None:
        console.print(metrics)
    _rollout(console, summary, top, compact)
    _plain(console, telemetry_tables(summary.get("telemetry")), compact)
    _provenance(console, summary)


def _rollout(console: Console, summary: dict[str, Any], top: int, compact: bool) -> None:
    """The rollout section (:mod:`.rollout_tables`): requests, tail, replicas, weight sync, staleness."""
    _plain(console, rollout_tables(summary.get("rollout"), slowest=top), compact)


def _plain(console: Console, tables: list[Any], compact: bool) -> None:
    for plain in tables:
        console.print(plain_table(plain, compact, console.width))
        if plain.note:
            console.print(_t(plain.note))


MAX_KEY_WIDTH = 40  # a longer key wraps rather than crowding every other column out
TEXT_MIN_WIDTH = 12


def _min_widths(plain: Any, headers: list[str]) -> list[int]:
    """The narrowest each column may get without cutting anything: a number or the key never wraps,
    a header wraps by word, other text by word (down to TEXT_MIN_WIDTH)."""
    out = []
    for i, header in enumerate(headers):
        cells = [str(row[i]) for row in plain.rows]
        word = max((len(w) for w in header.split()), default=1)
        if i == 0:
            width = min(max((len(c) for c in cells), default=1), MAX_KEY_WIDTH)
        elif i in plain.left:
            longest = max((len(w) for c in cells for w in c.split()), default=1)
            width = min(max(longest, 1), TEXT_MIN_WIDTH)
        else:
            width = max((len(c) for c in cells), default=1)
        out.append(max(width, word))
    return out


def plain_table(plain: Any, compact: bool, width: int) -> Table:
    """A :class:`PlainTable` for this terminal: on a narrow one, short headers, and columns of
    ``plain.drop`` left out (in that order) until the rest fits; the key column is never cut."""
    headers = [plain.short.get(i, h) if compact else h for i, h in enumerate(plain.headers)]
    mins = _min_widths(plain, headers)
    shown = list(range(len(headers)))
    left_out: list[str] = []
    pending = list(plain.drop) if compact else []
    while True:
        title = plain.title + (f" (narrow terminal: without {', '.join(left_out)})" if left_out else "")
        table = _table(title, compact)
        for i in shown:
            text = i in plain.left or i == 0
            table.add_column(
                headers[i], justify="left" if text else "right", min_width=mins[i], overflow="fold"
            )
        for n, row in enumerate(plain.rows):
            style = plain.styles[n] if n < len(plain.styles) else None
            table.add_row(*(_t(row[i]) for i in shown), style=style or None)
        if fits(table, width) or not compact:
            return table
        if not pending:  # still too wide: the key wraps between words too, rather than be cropped
            for column in table.columns:
                column.min_width = None
            return table
        drop = pending.pop(0)
        shown.remove(drop)
        left_out.append(headers[drop])


def fits(table: Table, width: int) -> bool:
    """Rendered at ``width``, no line is wider (rich crops a table whose minimums do not fit)."""
    import io

    from rich.cells import cell_len

    console = Console(file=io.StringIO(), width=width)
    console.print(table, crop=False)
    return all(cell_len(line) <= width for line in console.file.getvalue().splitlines())
