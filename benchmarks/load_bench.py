"""Load time of a merged trace in the bundled Perfetto engine, per output format, and what it pays for.

    python benchmarks/load_bench.py [--run DIR | --events 1_200_000] [--repeat 3]
                                    [--formats pftrace,pftrace.gz,json.gz] [--anatomy] [--keep DIR]

Merges one run (``benchmarks/gen_run.py`` unless ``--run`` names one) into each format with
``rl-trace merge``'s pipeline, then opens each file ``--repeat`` times in one engine
(:class:`rl_trace_observer.analysis.perfetto.engine.Engine`: the Perfetto UI v52 with its wasm trace
processor, in headless Chromium) and prints the median time from "open" to "loaded" (fetch, import,
the UI's first queries), next to ``.json.gz`` measured in the same run, and the slice/flow counts so
equal content can be checked at a glance.

``--anatomy``: what the protobuf importer pays for, found by removing one thing at a time from the
merged ``.pftrace`` (packets rewritten here, every other byte kept) and loading the variants:
debug annotations (the events' args, embedded as legacy JSON), flow ids, and both. It also prints the
file's packet mix (track events, track descriptors, interned data: count and bytes). Figures are wall
seconds of one engine on a shared machine: compare ratios within one run, not across runs.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from rl_trace_observer.merge.writers._pbwire import read_varint, varint

HERE = Path(__file__).resolve().parent
_PACKET_KINDS = {11: "track_event", 12: "interned_data", 60: "track_descriptor", 33: "trace_config"}


def _fields(data: memoryview) -> list[tuple[int, int, bytes]]:
    """(field number, wire type, the field's whole encoding) of one message, in order."""
    out, i, n = [], 0, len(data)
    while i < n:
        start = i
        key, i = read_varint(data, i)
        wt = key & 7
        if wt == 0:
            _, i = read_varint(data, i)
        elif wt == 1:
            i += 8
        elif wt == 5:
            i += 4
        elif wt == 2:
            ln, i = read_varint(data, i)
            i += ln
        else:
            raise ValueError(f"wire type {wt} at {start}")
        out.append((key >> 3, wt, bytes(data[start:i])))
    return out


def _payload(field: bytes) -> memoryview:
    """The bytes of a length-delimited field's value."""
    mv = memoryview(field)
    _, i = read_varint(mv, 0)
    _, i = read_varint(mv, i)
    return mv[i:]


def packets(data: bytes) -> list[memoryview]:
    mv, i, out = memoryview(data), 0, []
    while i < len(mv):
        key, i = read_varint(mv, i)
        ln, i = read_varint(mv, i)
        if key != 0x0A:
            raise ValueError("not a Trace of TracePackets")
        out.append(mv[i : i + ln])
        i += ln
    return out


def packet_mix(data: bytes) -> dict[str, list[int]]:
    """Packet kind -> [count, bytes]."""
    mix: dict[str, list[int]] = {}
    for p in packets(data):
        kinds = [_PACKET_KINDS.get(f) for f, _, _ in _fields(p)]
        kind = "+".join(k for k in kinds if k) or "other"
        row = mix.setdefault(kind, [0, 0])
        row[0] += 1
        row[1] += len(p) + 1 + len(varint(len(p)))
    return mix


def without(data: bytes, track_event_fields: set[int]) -> bytes:
    """The trace with the given TrackEvent fields removed from every track event (4: debug
    annotations, 47: flow ids, 48: terminating flow ids); other packets untouched."""
    out = bytearray()
    for p in packets(data):
        parts = []
        for num, _, enc in _fields(p):
            if num == 11:
                body = b"".join(e for f, _, e in _fields(_payload(enc)) if f not in track_event_fields)
                enc = b"\x5a" + varint(len(body)) + body
            parts.append(enc)
        pkt = b"".join(parts)
        out += b"\x0a" + varint(len(pkt)) + pkt
    return bytes(out)


def merge(run: Path, out: Path) -> None:
    cmd = [sys.executable, "-m", "rl_trace_observer.cli.main", "merge", str(run), "-o", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"merge into {out.name} failed:\n{done.stderr}")


def load_times(engine: Any, path: Path, repeat: int) -> tuple[float, Any]:
    times, res = [], None
    for _ in range(repeat):
        res = engine.load(path, timeout_s=600)
        if not res.loaded:
            raise SystemExit(f"{path}: not loaded: {res.error}")
        times.append(res.load_time_s)
    return statistics.median(times), res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path)
    ap.add_argument("--events", type=lambda s: int(s.replace("_", "")), default=1_200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--formats", default="pftrace,pftrace.gz,json.gz")
    ap.add_argument("--anatomy", action="store_true")
    ap.add_argument("--keep", type=Path, help="write the merged files here (default: a temporary folder)")
    args = ap.parse_args()
    from rl_trace_observer.analysis.perfetto.engine import Engine

    with tempfile.TemporaryDirectory(prefix="load_bench_") as tmp_s:
        tmp = args.keep or Path(tmp_s)
        tmp.mkdir(parents=True, exist_ok=True)
        run = args.run
        if run is None:
            run = tmp / "run"
            subprocess.run(
                [sys.executable, str(HERE / "gen_run.py"), str(run), "--events", str(args.events)],
                check=True,
                stdout=subprocess.DEVNULL,
            )
        formats = args.formats.split(",")
        if "json.gz" not in formats:
            formats.append("json.gz")
        if args.anatomy and "pftrace" not in formats:
            formats.append("pftrace")
        files = {}
        for fmt in formats:
            files[fmt] = tmp / f"trace.{fmt}"
            merge(run, files[fmt])
        variants: dict[str, Path] = {}
        if args.anatomy:
            data = files["pftrace"].read_bytes()
            mix = packet_mix(data)
            print("packet mix of trace.pftrace (kind: count, MB, bytes/packet):")
            for kind, (n, size) in sorted(mix.items(), key=lambda kv: -kv[1][1]):
                print(f"  {kind:32s} {n:>10,d} {size / 1e6:8.1f} {size / n:8.1f}")
            for label, drop in (("no args", {4}), ("no flows", {47, 48}), ("no args, no flows", {4, 47, 48})):
                path = tmp / f"trace.{label.replace(', ', '_').replace(' ', '_')}.pftrace"
                path.write_bytes(without(data, drop))
                variants[f"pftrace ({label})"] = path
        rows = []
        with Engine() as engine:
            engine.load(files["json.gz"], timeout_s=600)  # warm the page and the wasm module
            for label, path in [*files.items(), *variants.items()]:
                med, res = load_times(engine, path, args.repeat)
                rows.append((label, path.stat().st_size, med, res.slices, res.flows, len(res.error_stats)))
        base = next(r[2] for r in rows if r[0] == "json.gz")
        head = ("format", "MB", "load s", "vs json.gz", "slices", "flows")
        print("\n{:28s} {:>8s} {:>8s} {:>10s} {:>10s} {:>9s} errs".format(*head))
        for label, size, med, slices, flows, errs in rows:
            print(
                f"{label:28s} {size / 1e6:8.1f} {med:8.2f} {base / med:9.2f}x"
                f" {slices:>10,d} {flows:>9,d} {errs}"
            )
        counts = Counter((r[3], r[4]) for r in rows if r[0] in files)
        if len(counts) > 1:
            print("WARNING: the formats' slice/flow counts differ:", dict(counts))


if __name__ == "__main__":
    main()
