"""The capture writer under output-disk faults, on a real loop-mounted ext4 (needs root), with the
real ``rl_insight`` API and our backend at ``--rate`` spans/s: the table of issue 24, measured.

Scenarios (:mod:`rl_trace_observer.testing.fault_runs`): a 3 s ``fsfreeze`` (one call's p50 /
p99.9 / max against the unfaulted window of the same run, calls made during the freeze, and each
other kind of observer call made during it on a second thread), ``--repeat`` times, each next to
a control run — the same windows and commands with the disk NOT frozen, the order alternating —
whose ratio is the noise floor of that comparison on this machine; then all runs' calls pooled
(p99.9 of 5 × 15,000 calls instead of the 15th-slowest of one window). The drain SIGSTOPped for
3 s (the one case where the pump holds a backlog: its CPU per window), exit while frozen, SIGKILL while
frozen, a disk filled and freed 5 times, the output directory removed / replaced, a read-only
one, and ``RL_TRACE_BUFFER_MB=1`` reached during a freeze. ``--before SRC`` runs every scenario
also against another checkout's ``src`` (the design before), in the same run. Then the cost per
process: the drain's memory (RSS and PSS) and threads, with ``--procs`` traced processes at once.

Usage: ``sudo python benchmarks/capture_faults.py [--rate 5000] [--repeat 5] [--no-control]
[--freeze-only] [--before SRC] [--procs 16]``
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from rl_trace_observer.testing import capture_load, fault_runs, loopfs

KINDS = ("new_lane", "step_snapshot", "artifact", "identity", "metric", "request", "weight_sync")


def _ms(x: Any) -> str:
    return "—" if x is None else f"{x:,.1f} ms" if x >= 1 else f"{x * 1000:,.0f} µs"


def _n(x: Any) -> str:
    return "?" if x is None else f"{x:,}"


def _s(x: float | None, alive: str = "still alive") -> str:
    return alive if x is None else f"{x:.2f} s"


def _call(w: dict[str, Any], name: str) -> str:
    c = w.get(name)
    if c is None:
        return "—"
    if "pending_ms" in c:
        return f"≥ {c['pending_ms']:,.0f} ms (not returned at exit)"
    return _ms(c["max_ms"])


def _ratio(a: float | None, b: float | None) -> float:
    return a / b if a is not None and b else float("nan")


def _sched(w: dict[str, Any], who: str, key: str) -> str:
    v = w.get("sched", {}).get(who, {}).get(key)
    return "?" if v is None else f"{v:,.0f}"


def freeze_rows(r: dict[str, Any], control: dict[str, Any] | None = None) -> list[str]:
    w = r["windows"]
    f, u = w["frozen"], w["unfaulted"]
    d = r["disk"]
    ratio = _ratio(f["p999_ms"], u["p999_ms"])
    p99_ratio = _ratio(f.get("p99_ms"), u.get("p99_ms"))
    specials = ", ".join(f"{k} {_call(w, 'frozen/' + k)}" for k in KINDS)
    rows = [
        f"one span call: p50 {_ms(f['p50_ms'])}, p99.9 {_ms(f['p999_ms'])} ({ratio:.2f}× unfaulted "
        f"{_ms(u['p999_ms'])}), max {_ms(f['max_ms'])} (unfaulted max {_ms(u['max_ms'])}); "
        f"load {r['load']:.1f}",
        f"  p99 {_ms(f.get('p99_ms'))} ({p99_ratio:.2f}× unfaulted), calls over "
        f"1 ms {f.get('over_1ms', '?')} (unfaulted {u.get('over_1ms', '?')})",
    ]
    if control is not None:
        cw = control["windows"]
        cf, cu = cw["frozen"], cw["unfaulted"]
        rows.append(
            f"  its control run (same windows, disk NOT frozen; load {control['load']:.1f}): p99.9 "
            f"{_ratio(cf['p999_ms'], cu['p999_ms']):.2f}×, p99 "
            f"{_ratio(cf.get('p99_ms'), cu.get('p99_ms')):.2f}×, "
            f"max {_ms(cf['max_ms'])}, calls over 1 ms {cf.get('over_1ms', '?')} ({cu.get('over_1ms', '?')})"
        )
    pu, pf = u.get("pump", {}), f.get("pump", {})
    rows += [
        f"  frozen window (unfaulted): main thread waited for a CPU {_sched(f, 'main', 'wait_ms')} ms "
        f"({_sched(u, 'main', 'wait_ms')}); pump CPU {pf.get('cpu_ms', '?')} ms ({pu.get('cpu_ms', '?')}) "
        f"in {pf.get('cycles', '?')} cycles ({pu.get('cycles', '?')}), largest outbox "
        f"{pf.get('max_outbox_kib', '?')} KiB ({pu.get('max_outbox_kib', '?')}); drain CPU "
        f"{_sched(f, 'drain', 'cpu_ms')} ms ({_sched(u, 'drain', 'cpu_ms')})",
        f"calls during the freeze: {_n(f['n'])} in {f['seconds']:.1f} "
        f"s (expected ~{_n(r['expected_frozen_calls'])})",
        f"other calls made during it: {specials}",
        f"after the thaw: {_n(d['lines'])} lines on disk of "
        f"{_n(r['lines_handed'])} handed over, {d['bad_lines']} bad, "
        f"in order {d['seq_in_order']}, none missing {d['seq_contiguous']}; record {d['record_events']}; "
        f"exit {_s(r['exit_s'])}",
    ]
    return rows


def summary_rows(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Every run's ratio, frozen next to control, and the p99.9 of all their calls pooled."""
    rows = []
    for label, rs in runs.items():
        if not rs:
            continue
        ratios = [_ratio(r["windows"]["frozen"]["p999_ms"], r["windows"]["unfaulted"]["p999_ms"]) for r in rs]
        pf = capture_load.pooled_q([r["windows"]["frozen"] for r in rs], 0.999)
        pu = capture_load.pooled_q([r["windows"]["unfaulted"] for r in rs], 0.999)
        loads = ", ".join(f"{r['load']:.1f}" for r in rs)
        worst = max(r["windows"]["frozen"]["max_ms"] for r in rs)
        rows.append(
            f"{label}: p99.9 ratios {', '.join(f'{x:.2f}' for x in ratios)} "
            f"({sum(x > 1.5 for x in ratios)} of {len(ratios)} over 1.5×); pooled p99.9 {_ms(pf)} vs "
            f"unfaulted {_ms(pu)} = {_ratio(pf, pu):.2f}×; max {_ms(worst)}; "
            f"load {loads}"
        )
    return rows


def freeze_runs(rate: float, src: str | None, repeat: int, control: bool) -> dict[str, list[str]]:
    """The 3 s freeze ``repeat`` times, each next to a control run (order alternating: frozen
    first, then control first, ...), so every frozen ratio has its noise floor beside it."""
    out: dict[str, list[str]] = {}
    runs: dict[str, list[dict[str, Any]]] = {"frozen": [], "control": []}
    for i in range(repeat):
        order = ((False, True) if i % 2 == 0 else (True, False)) if control else (False,)
        got: dict[bool, dict[str, Any]] = {}
        for c in order:
            load = os.getloadavg()[0]
            with loopfs.loop_ext4(64) as fs:
                got[c] = fault_runs.freeze(fs, rate, 3.0, src, control=c)
            got[c]["load"] = load
            runs["control" if c else "frozen"].append(got[c])
        out[f"filesystem frozen for 3 s (run {i + 1})"] = freeze_rows(got[False], got.get(True))
    if repeat > 1:
        out["filesystem frozen for 3 s: all runs"] = summary_rows(runs)
    return out


def cap_rows(r: dict[str, Any]) -> list[str]:
    w, d = r["windows"], r["disk"]
    before = w["start"]["n"] + w["unfaulted"]["n"]
    return [
        f"freeze max call {_ms(w['frozen']['max_ms'])}; drain "
        f"RSS while frozen {r['drain_rss_mib_frozen']} MiB",
        f"record {d['record_events']} = {_n(d['lines'])} lines on "
        f"disk + dropped, of {_n(r['lines_handed'])} handed over; "
        f"the {_n(before)} spans from before the freeze all on "
        f"disk, in order: {d['contiguous_prefix'] >= before}",
        f"warnings: {len(r['warnings'])} ({'; '.join(x.split(': ', 1)[-1][:70] for x in r['warnings'])})",
    ]


def stopped_rows(r: dict[str, Any]) -> list[str]:
    w = r["windows"]
    u, st, af = w["unfaulted"], w["stopped"], w["after"]
    pu, ps = u.get("pump", {}), st.get("pump", {})
    d = r["disk"]
    stop_ratio = _ratio(st["p999_ms"], u["p999_ms"])
    return [
        f"pump CPU in its cycles {ps.get('cpu_ms', '?')} ms while stopped vs {pu.get('cpu_ms', '?')} ms "
        f"unfaulted ({_ratio(ps.get('cpu_ms'), pu.get('cpu_ms')):.2f}×), {ps.get('cycles', '?')} cycles, "
        f"longest {ps.get('max_cycle_ms', '?')} ms, largest outbox {ps.get('max_outbox_kib', '?')} KiB",
        f"one span call while stopped: p99.9 {_ms(st['p999_ms'])} ({stop_ratio:.2f}× unfaulted), "
        f"max {_ms(st['max_ms'])}; after SIGCONT: p99.9 {_ms(af.get('p999_ms'))}, "
        f"max {_ms(af.get('max_ms'))}",
        f"{_n(d['lines'])} lines on disk of {_n(r['lines_handed'])} handed over, none missing "
        f"{d['seq_contiguous']}, record {d['record_events']}",
    ]


def exit_rows(r: dict[str, Any]) -> list[str]:
    d = r["disk"]
    return [
        f"exit asked while frozen: gone after {_s(r['exit_s'], 'still alive after 10 s')}"
        + (f", {r['exit_after_thaw_s']:.2f} s after the thaw" if r["exit_after_thaw_s"] is not None else ""),
        f"after the thaw: {_n(d['lines'])} of {_n(r['lines_handed'])} "
        f"lines on disk, none missing {d['seq_contiguous']}, "
        f"record {d['record_events']}",
    ]


def kill_rows(r: dict[str, Any]) -> list[str]:
    d = r["disk"]
    rep = r["seq_reported_before_kill"]
    if rep is None:
        lost = ""
    elif rep > d["spans"]:
        lost = f" ({rep - d['spans']} fewer: not yet handed to the drain)"
    else:  # the loop kept going between its report and the kill
        lost = f" (all of them on disk, and {d['spans'] - rep} emitted between the report and the kill)"
    return [
        f"SIGKILL while frozen: after the thaw {_n(d['spans'])} "
        f"spans on disk (the loop had reported {rep} just "
        f"before the kill){lost}, none missing {d['seq_contiguous']}, "
        f"{d['bad_lines']} bad lines, record {d['record_events']}"
    ]


def full_rows(r: dict[str, Any]) -> list[str]:
    d, ev = r["disk"], r["disk"]["record_events"] or {}
    honest = ev.get("written") == d["lines"]
    return [
        f"{d['bad_lines']} lines that do not parse; record written "
        f"{ev.get('written')} vs {_n(d['lines'])} lines on disk "
        f"({'equal' if honest else 'NOT equal'}), dropped "
        f"{ev.get('dropped')}; handed over {_n(r['lines_handed'])}",
        f"warnings: {len(r['warnings'])}",
    ]


def removed_rows(r: dict[str, Any]) -> list[str]:
    d, ev = r["disk"], r["disk"]["record_events"] or {}
    return [
        f"new file in the output dir after "
        f"{_s(r['new_file_after_s'], 'never (10 s)')}; it starts with the lane "
        f"name {d['first_is_lane_name']}; {_n(d['lines'])} lines in it, record {ev}",
        f"warnings: {len(r['warnings'])} ({'; '.join(x.split(': ', 1)[-1][:60] for x in r['warnings'])})",
    ]


def ro_rows(r: dict[str, Any]) -> list[str]:
    return [
        f"exit code {r['returncode']}, {r['files']} files, "
        f"counts {r['counts']}, warnings {len(r['warnings'])}"
    ]


def run_all(
    rate: float, src: str | None, repeat: int = 1, control: bool = True, freeze_only: bool = False
) -> dict[str, list[str]]:
    out = freeze_runs(rate, src, 1 if src else repeat, control and not src)
    with loopfs.loop_ext4(64) as fs:
        out["drain process stopped (SIGSTOP) for 3 s"] = stopped_rows(
            fault_runs.drain_stopped(fs, rate, 3.0, src)
        )
    if freeze_only:
        return out
    with loopfs.loop_ext4(64) as fs:
        out["process asked to exit while frozen"] = exit_rows(fault_runs.exit_while_frozen(fs, rate, src))
    with loopfs.loop_ext4(64) as fs:
        out["SIGKILL while frozen"] = kill_rows(fault_runs.kill_while_frozen(fs, rate, src))
    with loopfs.loop_ext4(16) as fs:
        out["disk full, then space freed (5 times)"] = full_rows(fault_runs.full_disk(fs, rate, 5, src))
    with loopfs.loop_ext4(64) as fs:
        out["output directory removed mid-run"] = removed_rows(fault_runs.removed(fs.mount, rate, src=src))
    with loopfs.loop_ext4(64) as fs:
        out["output directory replaced mid-run"] = removed_rows(
            fault_runs.removed(fs.mount, rate, replace=True, src=src)
        )
    with loopfs.loop_ext4(64) as fs:
        out["read-only directory"] = ro_rows(fault_runs.read_only(fs, rate, src))
    if src is None:
        with loopfs.loop_ext4(64) as fs:
            out["RL_TRACE_BUFFER_MB=1, frozen 3 s"] = cap_rows(
                fault_runs.freeze(fs, rate, 3.0, None, RL_TRACE_BUFFER_MB="1")
            )
    return out


def node_cost(procs: int, rate: float) -> dict[str, Any]:
    """``procs`` traced loops at once: the drains' memory and threads, the loops' threads."""
    loops = []
    with loopfs.loop_ext4(256) as fs:
        try:
            for i in range(procs):
                loops.append(fault_runs.Traced(fs.mount / f"out{i}", rate))
            time.sleep(3.0)
            reports = [lp.ask("report") for lp in loops]
            drains = [r["drain"] for r in reports]
            rss = [fault_runs.rss_mib(d) or 0.0 for d in drains]
            pss = [_pss_mib(d) for d in drains]
            return {
                "procs": procs,
                "drains": sum(d is not None for d in drains),
                "drain_threads": [fault_runs.threads(d) for d in drains],
                "loop_threads": [fault_runs.threads(lp.proc.pid) for lp in loops],
                "drain_rss_mib": (min(rss), max(rss)),
                "drain_pss_mib": (min(pss), max(pss)),
                "loop_rss_mib": (
                    min(fault_runs.rss_mib(lp.proc.pid) or 0 for lp in loops),
                    max(fault_runs.rss_mib(lp.proc.pid) or 0 for lp in loops),
                ),
            }
        finally:
            for lp in loops:
                lp.exit(10)
                fault_runs.wait_gone(lp.last.get("drain"), 30)
                lp.close()


def _pss_mib(pid: int | None) -> float:
    if pid is None:
        return 0.0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=5000.0)
    ap.add_argument("--before", metavar="SRC", help="also run against another checkout's src/")
    ap.add_argument("--procs", type=int, default=16, help="traced processes at once for the cost figures")
    ap.add_argument("--procs-rate", type=float, default=500.0, help="their spans/s each (2 cores here)")
    ap.add_argument(
        "--repeat", type=int, default=3, help="freeze runs of the new design (percentiles are noisy)"
    )
    ap.add_argument(
        "--no-control", action="store_true", help="skip the control runs (same windows, no freeze)"
    )
    ap.add_argument(
        "--freeze-only", action="store_true", help="only the freeze (and its control) and the stopped drain"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    reason = loopfs.unavailable_reason()
    if reason:
        raise SystemExit(f"capture_faults: {reason}")
    print(f"rate {args.rate:g} spans/s; load average {os.getloadavg()[0]:.1f}")
    results = {"after": run_all(args.rate, None, args.repeat, not args.no_control, args.freeze_only)}
    if args.before:
        results["before"] = run_all(args.rate, args.before, freeze_only=args.freeze_only)
    for fault in results["after"]:
        print(f"\n## {fault}")
        for label in ("before", "after"):
            for row in results.get(label, {}).get(fault, []):
                print(f"  {label:<6} {row}")
    if args.freeze_only:
        return
    cost = node_cost(args.procs, args.procs_rate)
    print(f"\n## cost with {cost['procs']} traced processes ({args.procs_rate:g} spans/s each)")
    print(
        f"  {cost['drains']} drain processes; threads per drain {sorted(set(cost['drain_threads']))}; "
        f"threads per traced process {sorted(set(cost['loop_threads']))}; drain RSS "
        f"{cost['drain_rss_mib'][0]:.1f}–{cost['drain_rss_mib'][1]:.1f} MiB, PSS "
        f"{cost['drain_pss_mib'][0]:.1f}–{cost['drain_pss_mib'][1]:.1f} MiB (traced process RSS "
        f"{cost['loop_rss_mib'][0]:.0f}–{cost['loop_rss_mib'][1]:.0f} MiB)"
    )
    if args.json:
        print(json.dumps({"results": results, "cost": cost}))


if __name__ == "__main__":
    main()
