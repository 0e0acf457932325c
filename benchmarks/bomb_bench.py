"""Peak memory of a merge beside a decompression bomb or a file too large for the process.

    python benchmarks/bomb_bench.py [--whitespace-mib 2300] [--events-mib 200] [--data-mib 1024]
                                    [--before SRC]

Builds, with a streaming writer (nothing inflated is ever held here), three inputs beside one good
Kineto trace of 187 events: a ``.gz`` of ``--whitespace-mib`` MiB of whitespace inside a trace's event
array (2.3 GB in a 2.3 MB file by default), and a ``.gz`` of ``--events-mib`` MiB of short events.
Merges each directory in a fresh process (``rl-trace merge``, default workers) and prints exit code,
the good file's events kept, the peak RSS of the merge and its workers, and that peak over the good
file merged alone (the baseline, same run). The events file is merged twice: with no limit, and under
``prlimit --data`` (``--data-mib``: what a container or ``ulimit`` would allow). ``--before SRC``: the
same merges with another checkout's ``src`` first on ``PYTHONPATH`` (issue 33's figures: the commit
before the fix).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

T0 = 1_764_000_000_000_000_000
PEAK = """
import resource, subprocess, sys
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(proc.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
"""


def _good(path: Path) -> None:
    op = {"ph": "X", "cat": "cpu_op", "pid": 200, "tid": 200, "dur": 5.0}
    events = [{**op, "name": f"op{i}", "ts": 1000.0 + 10 * i} for i in range(187)]
    path.write_text(json.dumps({"schemaVersion": 1, "baseTimeNanoseconds": T0, "traceEvents": events}))


def _stream(path: Path, head: bytes, block: bytes, mib: int, tail: bytes) -> None:
    times = (mib << 20) // len(block)
    with gzip.open(path, "wb", compresslevel=6) as f:
        f.write(head)
        for _ in range(times):
            f.write(block)
        f.write(tail)


def _merge(folder: Path, src: str | None, prefix: list[str]) -> tuple[int, int, int]:
    out = folder.parent / f"{folder.name}.json.gz"
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src
    cli = [*prefix, sys.executable, "-m", "rl_trace_observer.cli.main", "merge", str(folder), "-o", str(out)]
    proc = subprocess.run([sys.executable, "-c", PEAK, *cli], capture_output=True, text=True, env=env)
    code, peak = (int(x) for x in proc.stdout.split())
    kept = 0
    manifest = Path(f"{out}.manifest.json")
    if manifest.exists():
        for art in json.loads(manifest.read_text()).get("artifacts") or []:
            if art["path"].endswith("good_pid200.json"):
                kept = art["events"]["kept"]
    return code, kept, peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--whitespace-mib", type=int, default=2300)
    ap.add_argument("--events-mib", type=int, default=200)
    ap.add_argument("--data-mib", type=int, default=1024)
    ap.add_argument("--before", help="another checkout's src directory, merged the same way")
    args = ap.parse_args()
    prlimit = shutil.which("prlimit")
    root = Path(tempfile.mkdtemp(prefix="bomb-bench-"))
    try:
        head = f'{{"schemaVersion":1,"baseTimeNanoseconds":{T0},"traceEvents":['.encode()
        event = (
            b'{"ph":"X","cat":"cpu_op","name":"op","pid":1,"tid":1,"ts":1000.5,"dur":5.0,"args":{"k":"v"}},'
        )
        cases = {"alone": None, "whitespace": (b" " * (1 << 20), args.whitespace_mib, b"]}"),
                 "events": (event * 1000, args.events_mib, b"{}]}")}  # fmt: skip
        for name, spec in cases.items():
            folder = root / name
            folder.mkdir()
            _good(folder / "good_pid200.json")
            if spec is not None:
                _stream(folder / f"{name}_pid300.json.gz", head, *spec)
        runs = [("alone", []), ("whitespace", []), ("events", [])]
        if prlimit:
            runs.append(("events", [prlimit, f"--data={args.data_mib << 20}", "--"]))
        for label, src in [("this checkout", None), ("before", args.before)]:
            if label == "before" and not src:
                continue
            base = 0
            print(f"{label}:")
            for name, prefix in runs:
                code, kept, peak = _merge(root / name, src, prefix)
                base = base or peak
                limit = f" under --data={args.data_mib} MiB" if prefix else ""
                stored = sum(p.stat().st_size for p in (root / name).iterdir())
                print(
                    f"  {name:10s}{limit:24s} stored {stored >> 10:>8,} KiB  exit {code}  good kept {kept:3d}"
                    f"  peak {peak >> 20:>6,} MiB  x{peak / base:5.1f} the good file alone"
                )
        print(f"(this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10} MiB)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
