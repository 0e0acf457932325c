"""The ``gpu`` section as plain tables (terminal and HTML show the same cells), the banner of a
trace without RL-Insight spans, and the HTML chart of GPU busy time per stage."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from . import svg
from .rollout_tables import PlainTable
from .style import COLORS, LABELS, fmt_ns, fmt_pct, step_label

MAX_ROWS = 64
STAGE_COLORS = {**COLORS, "none": "#B0B0B0"}


def banner(summary: dict[str, Any]) -> str | None:
    """One honest line when the stages are not RL-Insight's: what steps and stages were read as."""
    src = summary["source"]
    guessed = src.get("guessed")
    if src.get("stage_source") == "rl_insight" or guessed is None:
        return None
    steps = src.get("steps_from")
    step_text = f"steps are the profiler's {steps} ranges" if steps else "no step markers: one window"
    names = {n: c for n, c in guessed["names"].items() if c != "step"}
    if names:
        shown = ", ".join(f"{n} → {c}" for n, c in list(names.items())[:6])
        head = f"No RL-Insight spans: stages GUESSED from span names ({shown}); {step_text}."
    else:
        head = f"No RL-Insight spans and no span name is an RL stage; {step_text}."
    refused = guessed.get("refused") or []
    if refused:
        listed = ", ".join(repr(n) for n in refused[:4]) + (" …" if guessed["refused_total"] > 4 else "")
        head += f" Not read as stages (not one identifier): {listed}."
    return head


def _share(part: int, whole: int) -> str:
    return fmt_pct(part, whole) if part else "—"


def _device(r: dict[str, Any]) -> str:
    dev = str(r["device"]).replace("GPU ", "GPU")
    return dev if r["rank"] is None else f"{r['rank']}·{dev}"


def short_name(name: str) -> str:
    """``void at::native::vectorized_elementwise_kernel<4, …>(…)`` → its last name part, never cut
    (a narrow terminal folds a long one; the JSON and ``kernels`` table keep the full name)."""
    base = name.removeprefix("void ")
    for stop in ("<", "("):
        base = base.split(stop, 1)[0]
    return base.rsplit("::", 1)[-1].strip() or name


_WORDS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+")


def distinct_short_names(names: list[str]) -> list[str]:
    """:func:`short_name` of each, told apart where several shorten to the same text: each gets the
    first word of its full name that not all of them share (``vectorized_elementwise_kernel
    [AddFunctor]``, ``… [FillFunctor]``), and a number where even that is the same."""
    shorts = [short_name(n) for n in names]
    same: dict[str, list[int]] = defaultdict(list)
    for i, short in enumerate(shorts):
        same[short].append(i)
    for short, rows in same.items():
        if len(rows) < 2:
            continue
        words = [_WORDS.findall(names[i]) for i in rows]
        shared = set.intersection(*(set(w) for w in words))
        for i, mine in zip(rows, words, strict=True):
            own = next((w for w in mine if w not in shared), None)
            shorts[i] = f"{short} [{own}]" if own else short
    used: set[str] = set()
    out = []
    for short in shorts:
        label, k = short, 1
        while label in used:
            k += 1
            label = f"{short} #{k}"
        used.add(label)
        out.append(label)
    return out


def _steps_table(gpu: dict[str, Any]) -> PlainTable:
    rows = []
    chosen = [r for r in gpu["rows"] if r["scope"] == "step"] or [
        r for r in gpu["rows"] if r["scope"] == "run"
    ]
    for r in chosen[:MAX_ROWS]:
        wall = r["wall_ns"]
        rows.append(
            [step_label(r["step"]) if r["scope"] == "step" else "run", _device(r), fmt_ns(wall),
             fmt_pct(r["busy_ns"], wall),
             *(_share(r[k], wall) for k in ("compute_ns", "comm_ns", "memory_ns", "host_wait_ns",
                                             "kernel_wait_ns", "other_wait_ns"))]
        )  # fmt: skip
    more = (
        f"; {len(chosen) - MAX_ROWS} more rows in the JSON and `rl-trace sql … gpu_time`"
        if len(chosen) > MAX_ROWS
        else ""
    )
    return PlainTable(
        "GPU per step and device (% of the step's wall time on that GPU)",
        ["step", "rank·GPU", "wall", "busy", "comp", "comm", "mem", "host", "kern", "other"],
        rows,
        (1,),
        "busy = comp + comm (not under compute) + mem; idle = host wait (nothing launched yet) + kernel "
        "wait (< 30 µs between kernels) + other; a step's kernels are those its CPU work launched" + more,
    )


def stage_means(gpu: dict[str, Any]) -> list[dict[str, Any]]:
    """Per step, role and stage: the mean over the role's devices (for the table and the chart)."""
    groups: dict[tuple[Any, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in gpu["rows"]:
        if r["scope"] == "stage":
            groups[(r["step"], r["role"], r["stage"])].append(r)
    out = []
    for (step, role, stage), rows in groups.items():
        n = len(rows)
        mean = {
            k: sum(r[k] for r in rows) / n
            for k in ("wall_ns", "busy_ns", "comm_ns", "idle_ns", "host_wait_ns")
        }
        out.append({"step": step, "role": role, "stage": stage, "devices": n, **mean})
    return out


def _stages_table(gpu: dict[str, Any]) -> PlainTable | None:
    means = [m for m in stage_means(gpu) if m["stage"] != "none"]
    if not means:
        return None
    rows = [
        [step_label(m["step"]), m["role"], LABELS.get(m["stage"], m["stage"]), str(m["devices"]),
         fmt_ns(m["wall_ns"]), f"{fmt_ns(m['busy_ns'])} {fmt_pct(m['busy_ns'], m['wall_ns'])}",
         _share(round(m["comm_ns"]), round(m["wall_ns"])),
         _share(round(m["host_wait_ns"]), round(m["wall_ns"]))]
        for m in means[:MAX_ROWS]
    ]  # fmt: skip
    return PlainTable(
        "GPU per stage (mean per device; wall = the stage's CPU time joined with its kernels' time)",
        ["step", "role", "stage", "GPUs", "wall", "busy", "comm", "host wait"],
        rows,
        (1, 2),
    )


def _launch_table(gpu: dict[str, Any]) -> PlainTable | None:
    rows = [
        [_device(r), str(r["kernels"]), *(fmt_ns(r[f"launch_delay_{q}_ns"]) for q in ("p50", "p95", "max"))]
        for r in gpu["rows"]
        if r["scope"] == "run" and r["launch_delay_max_ns"] is not None
    ]
    if not rows:
        return None
    return PlainTable(
        "Kernel launch delay (end of the launch call → kernel start), whole run",
        ["rank·GPU", "kernels", "p50", "p95", "max"],
        rows[:MAX_ROWS],
        (0,),
    )


WHILE_LABELS = {"waiting_for_rollout": "CPU waited for rollout",
                "waiting_for_trainer": "CPU waited for trainer", "waiting_for_peers": "CPU waited for peers",
                "weight_sync": "weight sync", "driver": "driver/boundary",
                "unexplained": "CPU idle, unexplained", "unaccounted": "no lane of the process"}  # fmt: skip


def _while_table(gpu: dict[str, Any]) -> PlainTable | None:
    per: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in gpu.get("idle_while") or []:
        if set(r["while_ns"]) <= {"unaccounted"}:
            continue  # no CPU lane of the process says anything (a trace without RL-Insight spans)
        per[r["role"]]["*"] += r["gpu_idle_ns"]
        for label, ns in r["while_ns"].items():
            per[r["role"]][label] += ns
    rows = []
    for role, split in sorted(per.items()):
        total = split.pop("*")
        top = sorted(split.items(), key=lambda kv: -kv[1])[:3]
        rows.append([role, fmt_ns(total)] + [
            f"{WHILE_LABELS.get(k, 'CPU in ' + LABELS.get(k, k))} {fmt_pct(v, total)}" for k, v in top
        ] + [""] * (3 - len(top)))  # fmt: skip
    if not rows:
        return None
    return PlainTable(
        "GPU idle, by what its process's CPU lane did meanwhile (all steps and GPUs of the role)",
        ["role", "GPU idle", "most", "then", "then"],
        rows,
        (0, 2, 3, 4),
        "CPU in <stage>: the host ran that stage but launched nothing (host-bound); CPU waited for <what>: "
        "the idle causes of the answers",
    )


def _top_table(gpu: dict[str, Any]) -> PlainTable | None:
    top = gpu.get("top_kernels") or []
    if not top:
        return None
    rows = []
    shown = top[:10]
    for k, name in zip(shown, distinct_short_names([k["name"] for k in shown]), strict=True):
        rows.append([name, k["kind"], str(k["count"]), fmt_ns(k["total_ns"]), fmt_ns(k["max_ns"])])
    return PlainTable(
        "Top kernels (summed time, every GPU)", ["kernel", "kind", "count", "total", "max"], rows, (0, 1)
    )


def tables(summary: dict[str, Any]) -> list[PlainTable]:
    gpu = summary.get("gpu")
    if not gpu:
        return []
    rules = gpu["rules"]
    note = (
        f"{gpu['kernels']:,} GPU events: {rules['launch']:,} placed by their launch (correlation id), "
        f"{rules['window']:,} by where they ran (no launch in the trace); "
        f"{gpu['no_stage']:,} in no stage span"
    )
    steps = _steps_table(gpu)
    steps.note = note + ". " + steps.note
    out = (steps, _stages_table(gpu), _while_table(gpu), _launch_table(gpu), _top_table(gpu))
    return [t for t in out if t is not None]


def chart(summary: dict[str, Any]) -> str:
    """Stacked bars per (step, role): mean GPU busy per device in each stage, then idle."""
    gpu = summary.get("gpu")
    if not gpu:
        return ""
    by: dict[tuple[Any, str], dict[str, float]] = defaultdict(dict)
    walls: dict[tuple[Any, str], float] = {}
    for m in stage_means(gpu):
        by[(m["step"], m["role"])][m["stage"]] = m["busy_ns"]
    for r in gpu["rows"]:
        if r["scope"] == "step":
            key = (r["step"], r["role"])
            walls[key] = max(walls.get(key, 0), r["wall_ns"])
    bars = sorted(by, key=lambda k: (k[0] is None, k[0] or 0, k[1]))[: svg.MAX_BARS]
    if not bars:
        return ""
    plot_w = svg.WIDTH - svg.LABEL_W - 20
    longest = max(walls.get(k, 0) for k in bars) or 1
    stages = [s for s in ("generation", "log_prob", "update", "weight_sync", "other", "none")
              if any(s in by[k] for k in bars)]  # fmt: skip
    body = svg._legend(
        [(LABELS.get(s, "no stage"), STAGE_COLORS[s]) for s in stages] + [("GPU idle", COLORS["idle"])], 16
    )
    y = 30
    for key in bars:
        label = f"step {step_label(key[0])} · {key[1]}"
        body.append(
            f'<text class="label" x="{svg.LABEL_W - 6}" y="{y + 13}" '
            f'text-anchor="end">{svg.esc(label)}</text>'
        )
        x = float(svg.LABEL_W)
        busy = 0.0
        for s in stages:
            ns = by[key].get(s, 0.0)
            w = plot_w * ns / longest
            body.append(
                svg._bar(x, y, w, STAGE_COLORS[s], f"{label}: {LABELS.get(s, s)} GPU busy {fmt_ns(ns)}")
            )
            x, busy = x + w, busy + ns
        idle = max(walls.get(key, 0) - busy, 0)
        body.append(
            svg._bar(x, y, plot_w * idle / longest, COLORS["idle"], f"{label}: GPU idle {fmt_ns(idle)}")
        )
        y += svg.BAR_H + svg.GAP
    body += svg._axis(y + 2, longest, plot_w)
    return svg._svg("GPU busy per stage (mean per device of each role)", y + 26, body, "gpu")
