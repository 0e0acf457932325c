"""Load time of a merged trace in the bundled Perfetto engine, per output format, and what it pays for.

    python benchmarks/load_bench.py [--run DIR | --events 1_200_000] [--repeat 3]
                                    [--formats pftrace,pftrace.gz,json.gz] [--anatomy]
                                    [--keep DIR [--reuse]]

Merges one run (``benchmarks/gen_run.py`` unless ``--run`` names one) into each format with
``rl-trace merge``'s pipeline, then opens each file ``--repeat`` times in one engine
(:class:`rl_trace_observer.testing.perfetto.engine.Engine`: the Perfetto UI v52 with its wasm trace
processor, in headless Chromium), in rounds (each file once per round), and prints the median time
from "open" to "loaded" (fetch, import, the UI's first queries) and the median CPU seconds the browser
used for it, next to ``.json.gz`` measured in the same run, and the slice/flow counts so equal content
can be checked at a glance. ``--reuse``: load the files already in ``--keep`` instead of merging.

``--anatomy``: what the protobuf importer pays for, found by changing one thing at a time in the
merged ``.pftrace`` (packets rewritten here, every other byte kept) and loading the variants: no debug
annotations (the events' args, embedded as legacy JSON), no flow ids, neither; the args' JSON text as
ONE string arg per slice (same bytes, no flattening); the args as typed, nested debug annotations
(``typed_args.py``: keys interned; and with string values interned too). It also prints the file's
packet mix (track events, track descriptors, interned data: count and bytes). The machine is shared:
compare ratios within one run, not across runs; the CPU column moves less than wall time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from rl_trace_observer.merge.output._pbwire import read_varint, varint

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


def _args_rewritten(fields: list[tuple[int, int, bytes]], rewrite: Any) -> list[bytes]:
    """A packet's fields with each TrackEvent's legacy-JSON ``args`` annotation (name_iid, then
    legacy_json_value) replaced by ``rewrite(annotation, its legacy_json_value field)``."""
    parts = []
    for num, _, enc in fields:
        if num == 11:
            te = []
            for f, _, e in _fields(_payload(enc)):
                if f == 4:
                    ann = _fields(_payload(e))
                    if [x[0] for x in ann] == [1, 9]:
                        e = rewrite(e, ann[1][2])
                te.append(e)
            body = b"".join(te)
            enc = b"\x5a" + varint(len(body)) + body
        parts.append(enc)
    return parts


def json_as_string(data: bytes) -> bytes:
    """The trace with each ``args`` annotation's JSON text kept as a plain ``string_value``: the same
    bytes, but ONE arg row per slice instead of one per member (what flattening the JSON costs)."""

    def as_string(ann: bytes, js: bytes) -> bytes:
        return ann[: len(ann) - len(js)] + b"\x32" + js[1:]  # legacy_json_value (9) -> string_value (6)

    out = bytearray()
    for p in packets(data):
        pkt = b"".join(_args_rewritten(_fields(p), as_string))
        out += b"\x0a" + varint(len(pkt)) + pkt
    return bytes(out)


def typed_variant(data: bytes, intern_strings: bool = False) -> tuple[bytes, int]:
    """The trace with each legacy-JSON ``args`` annotation re-encoded as typed ``dict_entries``
    (:mod:`typed_args`: keys interned per sequence; with ``intern_strings`` string values too), every
    other byte kept. Returns (trace, annotations that still hold some JSON)."""
    from rl_trace_observer.merge.output._pbwire import ld
    from typed_args import TypedArgs

    typed = TypedArgs(intern_strings)
    out = bytearray()
    with_json = 0

    def retype(_: bytes, js: bytes) -> bytes:
        nonlocal with_json
        ann = typed.encode(bytes(_payload(js)))
        with_json += b"\x4a" in ann  # a legacy_json_value tag (or a value byte)
        return ann

    for p in packets(data):
        fields = _fields(p)
        for num, _, enc in fields:
            if num == 13 and read_varint(enc, 1)[0] & 1:  # SEQ_INCREMENTAL_STATE_CLEARED
                typed.reset()
            if num == 12:
                for f, _, e in _fields(_payload(enc)):
                    if f == 3 and bytes(_payload(e)) != b"\x08\x01\x12\x04args":
                        raise SystemExit("typed variant: the writer interns other arg names")
        parts = _args_rewritten(fields, retype)
        if typed.new:
            old = [enc for num, _, enc in fields if num == 12]
            merged = (bytes(_payload(old[0])) if old else b"") + b"".join(typed.new)
            typed.new.clear()
            parts = [e for e in parts if e[:1] != b"\x62"] + [ld(12, merged)]
        pkt = b"".join(parts)
        out += b"\x0a" + varint(len(pkt)) + pkt
    return bytes(out), with_json


def merge(run: Path, out: Path) -> None:
    cmd = [sys.executable, "-m", "rl_trace_observer.cli.main", "merge", str(run), "-o", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"merge into {out.name} failed:\n{done.stderr}")


def browser_cpu_s(engine: Any) -> float:
    """CPU seconds used so far by the engine's browser (its process group: the wasm trace processor
    runs in a renderer), so loads can be compared on a machine other jobs share."""
    browser = getattr(engine, "_browser", None)
    proc = getattr(browser, "_proc", None)
    if proc is None:
        return float("nan")
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == proc.pid:  # pgrp
            total += sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
    return total / ticks


def load_round_robin(engine: Any, paths: dict[str, Path], repeat: int) -> dict[str, tuple[float, float, Any]]:
    """label -> (median wall s, median browser CPU s, last result) of ``repeat`` loads each, taken in
    rounds (every file once per round) so a burst of other work on the machine hits all alike."""
    times: dict[str, list[float]] = {k: [] for k in paths}
    cpus: dict[str, list[float]] = {k: [] for k in paths}
    last: dict[str, Any] = {}
    for _ in range(repeat):
        for label, path in paths.items():
            cpu0 = browser_cpu_s(engine)
            res = engine.load(path, timeout_s=600)
            if not res.loaded:
                raise SystemExit(f"{path}: not loaded: {res.error}")
            times[label].append(res.load_time_s)
            cpus[label].append(browser_cpu_s(engine) - cpu0)
            last[label] = res
    return {k: (statistics.median(times[k]), statistics.median(cpus[k]), last[k]) for k in paths}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path)
    ap.add_argument("--events", type=lambda s: int(s.replace("_", "")), default=1_200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--formats", default="pftrace,pftrace.gz,json.gz")
    ap.add_argument("--anatomy", action="store_true")
    ap.add_argument("--keep", type=Path, help="write the merged files here (default: a temporary folder)")
    ap.add_argument("--reuse", action="store_true", help="load merged files already in --keep as they are")
    args = ap.parse_args()
    from rl_trace_observer.testing.perfetto.engine import Engine

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
            if not (args.reuse and files[fmt].exists()):
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
            path = tmp / "trace.args_as_one_string.pftrace"
            path.write_bytes(json_as_string(data))
            variants["pftrace (args as one string)"] = path
            for label, interned in (("typed args", False), ("typed args, strings interned", True)):
                typed, refused = typed_variant(data, interned)
                path = tmp / f"trace.{label.replace(', ', '_').replace(' ', '_')}.pftrace"
                path.write_bytes(typed)
                variants[f"pftrace ({label})"] = path
                print(f"{label}: {refused:,d} annotations hold some JSON (or a 0x4a byte)")
        rows = []
        with Engine() as engine:
            engine.load(files["json.gz"], timeout_s=600)  # warm the page and the wasm module
            paths = {**files, **variants}
            for label, (med, cpu, res) in load_round_robin(engine, paths, args.repeat).items():
                size = paths[label].stat().st_size
                rows.append((label, size, med, cpu, res.slices, res.flows, len(res.error_stats)))
        base = next(r[2] for r in rows if r[0] == "json.gz")
        base_cpu = next(r[3] for r in rows if r[0] == "json.gz")
        head = ("format", "MB", "load s", "vs json.gz", "CPU s", "vs json.gz", "slices", "flows")
        print("\n{:36s} {:>7s} {:>7s} {:>10s} {:>7s} {:>10s} {:>9s} {:>8s} errs".format(*head))
        for label, size, med, cpu, slices, flows, errs in rows:
            print(
                f"{label:36s} {size / 1e6:7.1f} {med:7.2f} {base / med:9.2f}x"
                f" {cpu:7.2f} {base_cpu / cpu:9.2f}x {slices:>9,d} {flows:>8,d} {errs}"
            )
        counts = Counter((r[4], r[5]) for r in rows if r[0] in files)
        if len(counts) > 1:
            print("WARNING: the formats' slice/flow counts differ:", dict(counts))


if __name__ == "__main__":
    main()
