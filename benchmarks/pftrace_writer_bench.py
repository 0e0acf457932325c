"""Throughput of the streaming ``.pftrace`` writer, next to a JSON baseline measured in the same run.

    python benchmarks/pftrace_writer_bench.py [--events 300_000]

Input: normalised merge events (docs/FORMATS.md §3) taken from generated Kineto, VizTracer and
TokenSpeed files (``benchmarks/gen_run.py``), so names, args and flows have realistic shapes. Both
writers get the same events; the baseline is what a JSON writer at least does per event (derive
``ts``/``dur`` in µs, ``orjson.dumps``, write). CPU seconds are reported next to wall seconds because
the machines this runs on are shared.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import io
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).parent))
import gen_run
from rl_trace_observer.merge.output.pftrace import PftraceWriter
from rl_trace_observer.testing.tokenspeed import TokenSpeedSpec, write_rank


def _normalise(path: Path, base_key: str, pid_offset: int) -> list[dict[str, Any]]:
    """Chrome events of one file as merge events: integer ns on the wall clock, ids namespaced."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        doc = orjson.loads(f.read())
    base = doc.get(base_key) or doc.get("viztracer_metadata", {}).get("baseTimeNanoseconds") or 0
    out = []
    for ev in doc["traceEvents"]:
        pid, tid = ev.get("pid"), ev.get("tid")
        if not isinstance(pid, int) or not isinstance(tid, int):
            continue
        e = {k: v for k, v in ev.items() if k not in ("ts", "dur")}
        e["pid"], e["tid"] = pid + pid_offset, tid % 1_000_000
        if "ts" in ev:
            e["ts_ns"] = base + round(ev["ts"] * 1000)
        if "dur" in ev:
            e["dur_ns"] = round(ev["dur"] * 1000)
        if "id" in e:
            e["id"] = pid_offset << 32 | int(e["id"])
        out.append(e)
    return out


def make_events(n: int, tmp: Path) -> list[dict[str, Any]]:
    kineto = tmp / "k.json.gz"
    gen_run.write_kineto(kineto, 2000, 0, "node-a", gen_run.T0_NS, n // 2, 1, 1)
    viz = tmp / "v.json"
    gen_run.write_viztracer(viz, 2001, gen_run.T0_NS, n // 8, 1)
    ts = write_rank(tmp, TokenSpeedSpec(events_per_rank=n * 3 // 8, start_wall_ns=gen_run.T0_NS), 0)
    events = _normalise(kineto, "baseTimeNanoseconds", 0) + _normalise(viz, "", 1)
    events += _normalise(ts.viztracer, "", 2) + _normalise(ts.proton[0], "baseTimeNanoseconds", 3)
    return events


def json_baseline(events: list[dict[str, Any]], base_ns: int, out: io.BytesIO) -> None:
    write = out.write
    for ev in events:
        e = dict(ev)
        if "ts_ns" in e:
            e["ts"] = (e.pop("ts_ns") - base_ns) / 1000
        if "dur_ns" in e:
            e["dur"] = e.pop("dur_ns") / 1000
        write(orjson.dumps(e))
        write(b",\n")


def pftrace(events: list[dict[str, Any]], base_ns: int, out: io.BytesIO) -> None:
    writer = PftraceWriter(out, base_ns=base_ns)
    write = writer.write
    for ev in events:
        write(ev)
    writer.close()


def measure(
    label: str,
    fn: Callable[[list[dict[str, Any]], int, io.BytesIO], None],
    events: list[dict[str, Any]],
    base: int,
) -> tuple[float, bytes]:
    out = io.BytesIO()
    gc.collect()
    gc.disable()  # a merge disables GC around bulk work too; the event list alone would dominate it
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        fn(events, base, out)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        gc.enable()
    data = out.getvalue()
    packed = len(gzip.compress(data, compresslevel=6))
    print(
        f"{label:<14}{len(events) / cpu / 1e6:>9.3f} M ev/s CPU{len(events) / wall / 1e6:>9.3f} M ev/s wall"
        f"{len(data) / len(events):>9.1f} B/ev{packed / len(events):>9.1f} B/ev gz6"
    )
    return cpu, data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=lambda s: int(s.replace("_", "")), default=300_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        events = make_events(args.events, Path(tmp))
    base = min(e["ts_ns"] for e in events if "ts_ns" in e)
    print(f"{len(events):,} merge events (Kineto, VizTracer, TokenSpeed VizTracer + Proton)")
    json_cpu, _ = measure("json baseline", json_baseline, events, base)
    pf_cpu, _ = measure("pftrace", pftrace, events, base)
    print(f"pftrace / json CPU time: {pf_cpu / json_cpu:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
