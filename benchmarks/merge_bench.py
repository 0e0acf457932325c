"""Merge benchmark: events/s, MB/s and peak RSS per output format, next to a stdlib baseline.

    python benchmarks/merge_bench.py [--run DIR | --events 10_000_000]
                                     [--formats json.gz,json,pftrace,pftrace.gz]
                                     [--workers 2] [--baseline-events 1_000_000] [--keep]
                                     [--against GIT_REF]

Generates a realistic run with ``benchmarks/gen_run.py`` (8 actor ranks; Kineto + VizTracer +
TokenSpeed VizTracer/Proton + RL-Insight) unless ``--run`` names one, then measures, each in a fresh
process so peak RSS is its own:

- every output format through ``rl_trace_observer.merge.pipeline.merge`` (``--workers`` processes);
- the baseline: stdlib ``json.load`` of every file into memory, the same pid/tid/ts rewrite in
  Python, one ``json.dump``, in ONE process. It holds the whole run in memory (~1 KB per event), so by
  default it runs on whole files up to ``--baseline-events`` (``0`` = the whole run). The ``x base``
  column is therefore NOT like with like: events/s of a ``--workers`` merge of the whole run over the
  one-process baseline's events/s on its subset. The like-with-like line under the table merges
  exactly the baseline's files in one process (``workers=0``) to plain ``.json``, as the baseline
  writes, and compares wall and CPU seconds on the same events.

Targets (issue 3, 2 cores): ``.json.gz`` >= 1.0M events/s end to end and >= 10x the baseline; peak RSS
<= 1 GB for the 10M-event run. Figures depend on the machine's load: run it on a quiet machine. So that
runs on a shared machine can still be compared, each row also says how busy the machine was (load
average before and after, and the share of CPU time left idle during the run) and the CPU seconds the
merge used (parent and workers); ``M ev/cpu-s`` is events per CPU second, which load changes far less.
``RSS total`` is the peak of the merge's whole process tree (parent + workers, sampled every 50 ms).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

MERGE_CHILD = """
import json, resource, sys, time
try:
    from rl_trace_observer.common import twins
    native = twins.active()
except ImportError:  # an older tree (--against): its twins were listed in the .pftrace writer
    import importlib.util
    names = ["rl_trace_observer.merge.writers._pftrace_native", "rl_trace_observer.analysis.gpu._gpu_native"]
    native = {n.rsplit(".", 1)[1]: importlib.util.find_spec(n) is not None for n in names}
from rl_trace_observer.merge.pipeline import MergeOptions, merge
run, out, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
inputs = json.loads(run) if run.startswith("[") else [run]  # a run directory, or a JSON list of files
t0 = time.perf_counter(); c0 = time.process_time()
res = merge(inputs, out, MergeOptions(workers=workers))
wall = time.perf_counter() - t0
self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
kids = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall_s": wall, "exit": res.exit_code, "counts": res.manifest["counts"],
                  "size": res.manifest["output"]["size"], "parent_rss_kb": self_kb,
                  "worker_rss_kb": kids.ru_maxrss,
                  "cpu_s": time.process_time() - c0 + kids.ru_utime + kids.ru_stime,
                  "problems": len(res.manifest["problems"]), "native": native,
                  "links": [[a.get("pairs", 0), a.get("raw_acausal_pairs", 0), a.get("acausal_pairs", 0),
                             a.get("pairing")]
                            for a in res.manifest["timeline"]["clock"].get("artifacts", [])]}))
"""

BASELINE_CHILD = """
import gzip, json, os, resource, sys, time
files, out = json.loads(sys.argv[1]), sys.argv[2]
t0 = time.perf_counter()
merged, n, pids = [], 0, {}
for path in files:
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\\x1f\\x8b":
        raw = gzip.decompress(raw)
    if path.endswith(".jsonl"):
        events = [json.loads(line) for line in raw.splitlines() if line.strip()]
        base = 0
    else:
        doc = json.loads(raw)
        events = doc.get("traceEvents", [])
        viz = doc.get("viztracer_metadata") or {}
        base = doc.get("baseTimeNanoseconds") or viz.get("baseTimeNanoseconds") or 0
    for e in events:
        if e.get("ph") == "M":
            continue
        key = (path, e.get("pid"))
        e["pid"] = pids.setdefault(key, len(pids) + 1)
        ts = e.get("ts_ns")
        e["ts"] = (ts / 1000) if ts is not None else (base / 1000 + e.get("ts", 0))
        e.pop("ts_ns", None)
        e.pop("dur_ns", None)
        merged.append(e)
        n += 1
with open(out, "w") as f:
    json.dump({"traceEvents": merged}, f)
print(json.dumps({"wall_s": time.perf_counter() - t0, "events": n, "cpu_s": time.process_time(),
                  "rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def _cpu_idle() -> tuple[int, int]:
    """(idle, total) jiffies of the whole machine, from /proc/stat (zeros elsewhere)."""
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return 0, 0
    return values[3] + values[4], sum(values)


def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants (0 when psutil is missing or it is gone)."""
    try:
        import psutil
    except ImportError:
        return 0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def _child(code: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run a benchmark child; add its process tree's peak RSS and how busy the machine was meanwhile."""
    load0 = os.getloadavg()[0]
    idle0, total0 = _cpu_idle()
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _tree_rss(proc.pid))
        time.sleep(0.05)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child failed:\n{out}\n{err}")
    idle1, total1 = _cpu_idle()
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result.update(
        tree_rss=peak,
        load=(load0, os.getloadavg()[0]),
        idle=(idle1 - idle0) / (total1 - total0) if total1 > total0 else float("nan"),
    )
    return result


def _input_bytes(run: Path) -> tuple[int, int]:
    """(bytes on disk, trace files) of everything the merger reads."""
    files = [p for p in run.rglob("*") if p.is_file() and not p.name.startswith(".")]
    return sum(p.stat().st_size for p in files), len(files)


def _baseline_files(run: Path, limit: int, counts: dict[str, Any]) -> list[str]:
    files = sorted(
        str(p)
        for p in run.rglob("*")
        if p.is_file() and not p.name.startswith(".") and "rl-trace-process" not in p.name
    )
    if limit <= 0:
        return files
    per_byte = counts["events_read"] / max(1, sum(Path(f).stat().st_size for f in files))
    chosen, budget = [], limit
    for f in files[:: max(1, len(files) // 40)] + files:  # a spread of kinds first, then the rest
        if f in chosen:
            continue
        chosen.append(f)
        budget -= int(Path(f).stat().st_size * per_byte)
        if budget <= 0:
            break
    return chosen


def generated_run(run: Path | None, tmp: Path, events: int) -> Path:
    """The run to measure: the one named, else one ``gen_run.py`` writes into ``tmp`` (timed)."""
    if run is not None:
        return run
    run = tmp / "run"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, str(HERE / "gen_run.py"), str(run), "--events", str(events)], check=True)
    print(f"generated {events:,} events in {time.perf_counter() - t0:.1f} s")
    return run


def reference_src(ref: str, tmp: Path) -> Path:
    """``ref``'s ``src/`` (``git archive``) for the before rows, with ``ref``'s own compiled twins
    built by its ``setup.py`` (a throwaway venv with Cython, as ``pip install`` would use), so both
    rows run compiled where their tree has twins. If that build fails, each compiled twin of this tree
    is copied beside its source there when that source is byte-identical (else that side runs Python)."""
    root = HERE.parent
    dest = tmp / "ref"
    archive = subprocess.run(["git", "archive", ref], cwd=root, check=True, capture_output=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    if _build_twins(dest, tmp / "build-venv"):
        return dest / "src"
    for built in (root / "src").rglob("*.so"):
        rel = built.relative_to(root)
        pyx = built.parent / (built.name.split(".", 1)[0] + ".pyx")
        there = dest / rel.parent / pyx.name
        if pyx.exists() and there.exists() and there.read_bytes() == pyx.read_bytes():
            shutil.copy2(built, dest / rel)
    return dest / "src"


def _build_twins(tree: Path, venv: Path) -> bool:
    """``setup.py build_ext --inplace`` in ``tree`` with this interpreter's version (same ABI)."""
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
        py = str(venv / "bin" / "python")
        pins = ["cython>=3.1,<3.3", "setuptools>=77", "wheel"]  # pyproject.toml [build-system]
        subprocess.run([py, "-m", "pip", "install", "-q", *pins], check=True, capture_output=True)
        subprocess.run([py, "setup.py", "build_ext", "--inplace"], cwd=tree, check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"  (the reference's twins were not built: {exc}; copying this tree's where identical)")
        return False
    built = sorted(p.name.split(".", 1)[0] for p in (tree / "src").rglob("*.so"))
    print(f"  reference {tree.name}: built its compiled twins {', '.join(built) or '(none)'}")
    return True


def _ratio(rounds: list[dict[str, dict[str, Any]]], num: str, den: str, key: str) -> str:
    """``num``'s ``key`` over ``den``'s, taken within each round (runs back to back): the median, and
    the range when there are several rounds."""
    values = [r[num][key] / r[den][key] for r in rounds]
    spread = f" ({min(values):.2f}-{max(values):.2f})" if len(values) > 1 else ""
    return f"{statistics.median(values):.2f}x{spread}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, help="an existing run directory (else one is generated)")
    ap.add_argument("--events", type=lambda s: int(s.replace("_", "")), default=10_000_000)
    ap.add_argument("--formats", default="json.gz,json,pftrace,pftrace.gz")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--baseline-events", type=lambda s: int(s.replace("_", "")), default=1_000_000)
    ap.add_argument("--keep", action="store_true", help="keep the generated run and outputs")
    ap.add_argument(
        "--python",
        action="store_true",
        help="also merge each format with RL_TRACE_NATIVE=0 (the pure-Python loops), rows marked 'py'",
    )
    ap.add_argument(
        "--against",
        metavar="GIT_REF",
        help="also merge each format with that commit's src/ (rows marked '@REF'), in the same run",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="merge every (format, tree) this many times, round after round; the table shows each "
        "one's median run, and every ratio is taken within a round (runs back to back) then given as "
        "the median and range over the rounds: a machine whose speed moves (a shared VM) moves both",
    )
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    tmp = Path(tempfile.mkdtemp(prefix="merge-bench-"))
    try:
        run = generated_run(args.run, tmp, args.events)
        disk, nfiles = _input_bytes(run)
        print(
            f"input: {run} ({nfiles} files, {disk / 1e6:.1f} MB on disk); {os.cpu_count()} CPUs; "
            f"load average {os.getloadavg()[0]:.1f}"
        )
        modes = [("", "1", "")] + ([(" py", "0", "")] if args.python else [])
        if args.against:
            modes.append((f" @{args.against}", "1", str(reference_src(args.against, tmp))))
        rounds: list[dict[str, dict[str, Any]]] = []
        for _ in range(args.rounds):
            runs: dict[str, dict[str, Any]] = {}
            for fmt in args.formats.split(","):
                for mark, flag, src in modes:  # a commit's rows right after this tree's: the same load
                    out = tmp / f"merged.{fmt}"
                    env = {"RL_TRACE_NATIVE": flag, **({"PYTHONPATH": src} if src else {})}
                    runs[fmt + mark] = _child(MERGE_CHILD, str(run), str(out), str(args.workers), env=env)
                    out.unlink(missing_ok=True)
            rounds.append(runs)
        rows = []
        for name in rounds[0]:
            runs_of = sorted((r[name] for r in rounds), key=lambda r: r["wall_s"])
            median = runs_of[len(runs_of) // 2]
            rows.append((name, median, median["counts"]["events_read"]))
        ev_total = rows[0][2]
        files = _baseline_files(run, args.baseline_events, rows[0][1]["counts"])
        base = _child(BASELINE_CHILD, json.dumps(files), str(tmp / "baseline.json"))
        base_rate = base["events"] / base["wall_s"]
        same = _child(MERGE_CHILD, json.dumps(files), str(tmp / "same-files.json"), "0")  # like with like
        (tmp / "same-files.json").unlink(missing_ok=True)
        print()
        print(
            f"{'output':13s} {'events':>11s} {'wall s':>7s} {'M ev/s':>7s} {'MB/s in':>7s} {'cpu s':>6s} "
            f"{'M ev/cpu-s':>10s} {'RSS total':>9s} {'parent':>7s} {'worker':>7s} {'out MB':>7s} "
            f"{'x base':>6s}  {'load before/after':>17s} {'idle':>5s}"
        )
        for fmt, r, ev in rows:
            rate = ev / r["wall_s"]
            print(
                f"{fmt:13s} {ev:11,d} {r['wall_s']:7.2f} {rate / 1e6:7.3f} {disk / r['wall_s'] / 1e6:7.1f} "
                f"{r['cpu_s']:6.1f} {ev / r['cpu_s'] / 1e6:10.3f} {r['tree_rss'] / 2**20:7.0f}MB "
                f"{r['parent_rss_kb'] / 1024:5.0f}MB {r['worker_rss_kb'] / 1024:5.0f}MB "
                f"{(r['size'] or 0) / 1e6:7.1f} {rate / base_rate:6.1f}  "
                f"{r['load'][0]:8.1f}/{r['load'][1]:<8.1f} {r['idle'] * 100:4.0f}%"
            )
        print(
            f"{'baseline':13s} {base['events']:11,d} {base['wall_s']:7.2f} {base_rate / 1e6:7.3f} {'':>7s} "
            f"{'':>6s} {'':>10s} {base['tree_rss'] / 2**20:7.0f}MB {'':>7s} {'':>7s} {'':>7s} {1.0:6.1f}  "
            f"{base['load'][0]:8.1f}/{base['load'][1]:<8.1f} {base['idle'] * 100:4.0f}%"
        )
        print(
            f"  baseline: stdlib json.load + rewrite + one json.dump of {len(files)} whole files "
            f"({base['events']:,} of {ev_total:,} events; --baseline-events 0 for all), one process; "
            f"'x base' divides a {args.workers}-worker merge's events/s on the whole run by it"
        )
        print(
            f"  like with like (those {len(files)} files, one process each, plain .json out): merge "
            f"{same['wall_s']:.2f} s wall / {same['cpu_s']:.2f} CPU s for {same['counts']['events_read']:,} "
            f"events vs baseline {base['wall_s']:.2f} s / {base['cpu_s']:.2f} CPU s: "
            f"{base['wall_s'] / same['wall_s']:.1f}x faster in wall, "
            f"{base['cpu_s'] / same['cpu_s']:.1f}x in CPU"
        )
        records = rows[0][1].get("links") or []
        for pairing, what in (
            ("scope_id", "VizTracer->Proton scope links kept"),  # issue 8: flows Perfetto keeps
            ("stage_name", "Torch region edges inside their RL-Insight stage"),
        ):
            links = [r[:3] for r in records if r[3] == pairing]
            if links:
                pairs = sum(p for p, _, _ in links)
                before = pairs - sum(raw for _, raw, _ in links)
                after = pairs - sum(acausal for _, _, acausal in links)
                print(
                    f"  {what}: {before:,}/{pairs:,} ({before / pairs:.1%}) without per-artifact "
                    f"alignment, {after:,}/{pairs:,} ({after / pairs:.1%}) with it ({len(links)} files)"
                )
        built_twins = rows[0][1].get("native") or {}
        built = ", ".join(k for k, v in built_twins.items() if v) or "none built"
        print(f"  compiled twins (rows without 'py'): {built}")
        by_fmt = {fmt: r for fmt, r, _ in rows}
        if args.rounds > 1:
            print(
                f"  rounds: {args.rounds}; rows: each one's median run by wall; ratios: the median "
                "(and range) of the rounds' own"
            )
        if args.against:
            for fmt in args.formats.split(","):
                ref, now = f"{fmt} @{args.against}", fmt
                print(
                    f"  {fmt}: this tree vs {args.against}: {_ratio(rounds, ref, now, 'wall_s')} events/s "
                    f"(wall), {_ratio(rounds, ref, now, 'cpu_s')} events per CPU s; twins there: "
                    + (", ".join(k for k, v in (by_fmt[ref].get("native") or {}).items() if v) or "none")
                )
        for mark in [m for m, _, _ in modes]:
            a, b = "pftrace.gz" + mark, "json.gz" + mark
            if a in by_fmt and b in by_fmt:
                print(
                    f"  .pftrace.gz / .json.gz{mark}: {_ratio(rounds, a, b, 'wall_s')} wall, "
                    f"{_ratio(rounds, a, b, 'cpu_s')} CPU"
                )
        for fmt in [f for f in by_fmt if not f.endswith(" py")]:
            if fmt + " py" in by_fmt:
                py = fmt + " py"
                print(
                    f"  {fmt}: twins vs Python {_ratio(rounds, py, fmt, 'cpu_s')} less CPU, "
                    f"{_ratio(rounds, py, fmt, 'wall_s')} less wall"
                )
        sizes = {fmt: r["size"] for fmt, r, _ in rows}
        for fmt in ("pftrace", "pftrace.gz", "json"):
            if fmt in sizes and sizes.get("json.gz"):
                print(f"  .{fmt} is {sizes[fmt] / sizes['json.gz']:.2f}x the size of .json.gz")
        print(
            "  RSS total: peak of the merge's process tree; parent = the merging process; worker = the "
            "largest worker process (each holds one file's events)"
        )
        print(
            "  load: 1-minute load average before/after the run (other work on the machine); idle: share "
            "of the machine's CPU time left idle during the run"
        )
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
