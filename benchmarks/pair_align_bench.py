"""Flows kept / flows in the inputs, before and after per-artifact clock alignment (issue 8).

    python benchmarks/pair_align_bench.py [--run DIR] [--ranks 8] [--events-per-rank 40000]
                                          [--offsets-us 40,-40] [--drift-ppm 0] [--perfetto]

Generates a TokenSpeed run (synthetic VizTracer + Proton per scheduler rank, Proton clock off by
``--offsets-us`` cycled over ranks, optional drift) unless ``--run`` names a directory to search (e.g.
one written by ``benchmarks/gen_run.py``). For every Proton file it pairs the VizTracer flow starts
with the Proton scopes (``scope_id``), aligns the Proton file (``merge.clock.pairs``) and counts the
``viztracer->proton`` flows a viewer keeps: those whose end (the Proton scope) is later than their
start. A tie counts as lost: Perfetto then keeps the flow only if the start comes first in the file.

Prints, per injected error and in total: flows in the inputs, kept before and after correction, the
offset and residual found, and the cost of alignment next to the cost of parsing the two files (the
baseline measured in the same run). ``--perfetto`` also writes both merges as Chrome JSON (the test's
simple writer) and counts flows in the real Perfetto engine (``flow`` table, ``flow_*`` stats).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]

from rl_trace_observer.merge.clock.pair_events import scan_viztracer_scope_starts, tokenspeed_pairs  # noqa: E402
from rl_trace_observer.merge.clock.pairs import align_pairs  # noqa: E402
from rl_trace_observer.testing.tokenspeed import TokenSpeedSpec, write_profile  # noqa: E402

_STEM = re.compile(r"^(?P<stem>.+?)\.(?P<what>proton|viztracer)(?:\.part_\d+)?\.(?:chrome_trace|json)$")


def find_groups(run: Path) -> list[tuple[Path, list[Path]]]:
    """(VizTracer report, its Proton files) per TokenSpeed scheduler rank under ``run``."""
    groups: dict[tuple[Path, str], dict[str, list[Path]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(run.rglob("*")):
        m = _STEM.match(path.name)
        if m and path.is_file():
            groups[(path.parent, m["stem"])][m["what"]].append(path)
    return [(g["viztracer"][0], g["proton"]) for g in groups.values() if g["viztracer"] and g["proton"]]


def measure(viz_path: Path, proton_path: Path) -> dict[str, Any]:
    raw_viz, raw_proton = viz_path.read_bytes(), proton_path.read_bytes()
    t0 = time.perf_counter()
    viz, proton = orjson.loads(raw_viz), orjson.loads(raw_proton)
    t1 = time.perf_counter()
    pairs = tokenspeed_pairs(viz, proton)
    t2 = time.perf_counter()
    res = align_pairs(pairs, artifact=proton_path.name, partner=viz_path.name, pairing="scope_id")
    t3 = time.perf_counter()
    scan = scan_viztracer_scope_starts(raw_viz)  # what a merger reading Proton first would do
    t4 = time.perf_counter()
    assert sum(map(len, scan.relative.values())) >= len(pairs)
    corr = res.correction
    after = sum(corr(p.b_ns) > p.a_ns for p in pairs) if corr is not None else 0
    return {
        "flows": len(pairs),
        "before": sum(p.b_ns > p.a_ns for p in pairs),
        "after": after,
        "record": res.record,
        "problems": res.problems,
        "parse_s": t1 - t0,
        "extract_s": t2 - t1,
        "align_s": t3 - t2,
        "scan_s": t4 - t3,
    }


def _pct(kept: int, total: int) -> str:
    return f"{kept}/{total} ({100 * kept / total:.1f} %)" if total else "0/0"


def report(rows: list[tuple[str, dict[str, Any]]]) -> dict[str, int]:
    by_error: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for label, m in rows:
        by_error[label].append(m)
    print(
        f"{'injected':>12} {'files':>5} {'flows kept before':>24} {'flows kept after':>24}  offset / residual"
    )
    for label, ms in by_error.items():
        total = sum(m["flows"] for m in ms)
        offs = sorted(m["record"]["offset_ns"] for m in ms if m["record"]["offset_ns"] is not None)
        res = max((m["record"]["residual_ns"] or 0) for m in ms)
        off = f"{offs[0] / 1000:+.2f}..{offs[-1] / 1000:+.2f} µs" if offs else "-"
        drifts = sorted(m["record"]["drift_ppm"] for m in ms if m["record"].get("drift_applied"))
        if drifts:
            off += f" (offset at the record's at_ns; drift {drifts[0]:+.1f}..{drifts[-1]:+.1f} ppm)"
        print(
            f"{label:>12} {len(ms):>5} {_pct(sum(m['before'] for m in ms), total):>24} "
            f"{_pct(sum(m['after'] for m in ms), total):>24}  {off} / ≤{res / 1000:.2f} µs"
        )
    ms = [m for _, m in rows]
    tot = {k: sum(m[k] for m in ms) for k in ("flows", "before", "after")}
    before, after = _pct(tot["before"], tot["flows"]), _pct(tot["after"], tot["flows"])
    print(f"{'TOTAL':>12} {len(ms):>5} {before:>24} {after:>24}")
    parse, extract, align, scan = (
        sum(m[k] for m in ms) for k in ("parse_s", "extract_s", "align_s", "scan_s")
    )
    print(
        f"cost: parse both files (orjson) {parse:.3f} s = baseline; pairs from parsed events {extract:.3f} s "
        f"({extract / parse:.2f}x); align {align:.3f} s ({align / parse:.2f}x, "
        f"{tot['flows'] / max(align, 1e-9) / 1e6:.2f}M pairs/s); VizTracer flow starts from bytes "
        f"{scan:.3f} s ({scan / parse:.2f}x)"
    )
    problems = [p for m in ms for p in m["problems"]]
    print(
        f"clock problems raised: {len(problems)}"
        + "".join(f"\n  {p['path']}: {p['detail']}" for p in problems)
    )
    return tot


def perfetto_check(ranks: list[Any], work: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from tests.clock.test_pair_align_perfetto import FLOW_STATS, SCOPE_FLOWS, align_rank, write_merged

    from rl_trace_observer.testing.perfetto import engine as pe

    reason = pe.unavailable_reason()
    if reason:
        print(f"perfetto: skipped ({reason})")
        return
    with pe.Engine() as engine:
        for name, apply in (("uncorrected", False), ("aligned", True)):
            out = work / f"{name}.json"
            total = write_merged(ranks, [align_rank(r, apply=apply) for r in ranks], out)
            res = engine.load(out, [SCOPE_FLOWS, FLOW_STATS])
            links = sum(r.scope_links for r in ranks)
            print(
                f"perfetto {name}: flows {_pct(res.flows, total)} (scope links "
                f"{_pct(int(res.query(SCOPE_FLOWS).scalar()), links)}); flow stats "
                f"{dict(res.query(FLOW_STATS).rows) or 'none'}; import errors {len(res.error_stats)}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, help="search this directory instead of generating a run")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--events-per-rank", type=int, default=40_000)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--offsets-us", default="40,-40", help="Proton clock error per rank, cycled")
    ap.add_argument("--drift-ppm", type=float, default=0.0)
    ap.add_argument("--perfetto", action="store_true", help="also count flows in the real Perfetto engine")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ranks: list[Any] = []
        if args.run:
            groups = find_groups(args.run)
            labels = ["(unknown)"] * len(groups)
        else:
            offsets = tuple(float(x) for x in args.offsets_us.split(","))
            spec = TokenSpeedSpec(
                ranks=args.ranks,
                steps=args.steps,
                events_per_rank=args.events_per_rank,
                proton_offsets_us=offsets,
                proton_drift_ppm=args.drift_ppm,
            )
            t0 = time.perf_counter()
            ranks = write_profile(work / "run", spec)
            took = time.perf_counter() - t0
            print(f"generated {len(ranks)} ranks, {sum(r.events for r in ranks)} events in {took:.1f} s")
            groups = [(r.viztracer, list(r.proton)) for r in ranks]
            drift = f", {args.drift_ppm:+g} ppm" if args.drift_ppm else ""
            labels = [f"{r.proton_offset_ns / 1000:+g} µs{drift}" for r in ranks]
        rows = [
            (label, measure(viz, p))
            for (viz, parts), label in zip(groups, labels, strict=True)
            for p in parts
        ]
        if not rows:
            sys.exit(f"{args.run}: no TokenSpeed VizTracer + Proton pairs found")
        report(rows)
        if args.perfetto and ranks:
            perfetto_check(ranks, work)


if __name__ == "__main__":
    main()
