"""The report's GPU figures per rank against HolisticTraceAnalysis 0.5.0 on the ORIGINAL trace files.

    python benchmarks/hta_parity.py SET_DIR [--venv DIR] [--json OUT]   # e.g. shared/real-traces/hta-2rank

HTA is not a dependency: it goes into its own venv (default ``~/.cache/rl-trace-observer/hta-0.5.0``),
installed from the package index with ``--no-deps`` plus what its modules import (pandas, plotly,
psutil, networkx, pydot, pyyaml; it declares jupyterlab and pytest but never imports them). Per
rank, both sides:

- HTA ``get_temporal_breakdown``: idle, compute, non-compute, kernel time (µs) → ours: the device's
  ``run`` row: span − busy, compute, comm + memory, span (ns);
- HTA ``get_gpu_kernel_breakdown`` (one TraceAnalysis per rank): communication time (µs) → ours comm +
  overlap; ``get_comm_comp_overlap`` % → ours overlap / (comm + overlap);
- HTA ``get_idle_time_breakdown`` per stream → ours ``gpu.devices[].streams[]`` (shown, not held to
  the tolerance: for a kernel whose runtime event is missing — 64 on dlrm rank 1 — HTA's code joins
  ``index_correlation`` 0, i.e. the trace's row 0, as the launch; ours counts such a kernel as
  "launch unknown, never host wait", as HTA's documentation describes).

HTA leaves out the kernels of the last ProfilerStep when a trace has two or more steps. Like with
like: with one step (dlrm) HTA's default is compared with our ``run`` rows; with several, HTA with
``include_last_profiler_step=True`` is compared with our ``run`` rows, and HTA's default with the
union of our ``step`` rows of every step but the last (kernels our report attributes to those steps
by their launch — the same rule HTA filters with). Prints one table; exits 1 if any figure differs
by more than 0.1 %. Where the trace has fractional-µs times (torch >= 2.4), HTA's default rounds each
event inward to whole µs (start up, end down): that table is shown only, and the held one is HTA's
exact mode (``HTA_DISABLE_NS_ROUNDING=1``; ``--exact-us`` asks for it alone), see :func:`check`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HTA_PACKAGES = ["pandas", "plotly", "psutil", "networkx", "pydot", "pyyaml"]
TOLERANCE = 0.001
_GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"})
HTA_CHILD = r"""
import json, logging, sys, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
files, include_last = json.loads(sys.argv[1]), sys.argv[2] == "1"
out = {}
for rank, path in files.items():
    ta = TraceAnalysis(trace_files={int(rank): path}, trace_dir="/", include_last_profiler_step=include_last)
    tb = ta.get_temporal_breakdown(visualize=False).iloc[0]
    types, _ = ta.get_gpu_kernel_breakdown(visualize=False)
    comm = float(types[types["kernel_type"].str.contains("COMMUNICATION")]["sum"].sum())
    ov = float(ta.get_comm_comp_overlap(visualize=False).iloc[0]["comp_comm_overlap_pctg"])
    idle = ta.get_idle_time_breakdown(ranks=[int(rank)], visualize=False)[0]
    streams = {}
    for _, r in idle.iterrows():
        streams.setdefault(str(int(r["stream"])), {})[r["idle_category"]] = float(r["idle_time"])
    out[rank] = {"idle_us": float(tb["idle_time(us)"]), "compute_us": float(tb["compute_time(us)"]),
                 "non_compute_us": float(tb["non_compute_time(us)"]),
                 "kernel_us": float(tb["kernel_time(us)"]),
                 "comm_us": comm, "overlap_pct": ov, "streams": streams}
print(json.dumps(out))
"""


def hta_python(venv: Path) -> Path:
    py = venv / "bin" / "python"
    if (
        py.exists()
        and subprocess.run([py, "-c", "import hta.trace_analysis"], capture_output=True).returncode == 0
    ):
        return py
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "--no-deps", "HolisticTraceAnalysis==0.5.0"], check=True)
    subprocess.run([*pip, *HTA_PACKAGES], check=True)
    return py


def rank_files(folder: Path) -> dict[str, str]:
    import gzip

    out = {}
    for n, f in enumerate(sorted(folder.glob("*.json*"))):
        opener = gzip.open if f.name.endswith(".gz") else open
        with opener(f, "rt") as fh:  # the whole document: distributedInfo may nest (SGLang's pg_config)
            info = json.load(fh).get("distributedInfo") or {}
        rank = info.get("rank", n)  # a single-GPU trace names none: its place, as our report's rank
        out[str(rank)] = str(f)
    return out


def run_hta(py: Path, files: dict[str, str], include_last: bool, exact_us: bool = False) -> dict[str, Any]:
    """HTA's figures per rank. ``exact_us``: HTA_DISABLE_NS_ROUNDING=1 — HTA otherwise rounds every
    fractional-µs event inward to whole µs (torch >= 2.4 writes 3 decimals), our ns are exact."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", HTA_DISABLE_NS_ROUNDING="1" if exact_us else "0")
    out = subprocess.run([str(py), "-c", HTA_CHILD, json.dumps(files), "1" if include_last else "0"],
                         capture_output=True, text=True, env=env, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def ours(folder: Path, work: Path) -> dict[str, Any]:
    from rl_trace_observer.analysis.report.output import summarize
    from rl_trace_observer.merge.options import MergeOptions
    from rl_trace_observer.merge.pipeline import merge

    merge([str(folder)], str(work / "merged.json.gz"), MergeOptions())
    return summarize(work / "merged.json.gz")


def _ours_of(rows: list[dict[str, Any]], streams: list[dict[str, Any]] | None) -> dict[str, Any]:
    """HTA's figures, from our rows of one rank (ns → µs): one row, or several steps' rows joined
    (their kernel sets are disjoint; span from the first's start to the last's end)."""
    busy = sum(r["busy_ns"] for r in rows)
    span = rows[0]["span_ns"] if len(rows) == 1 else None
    out = {"compute_us": sum(r["compute_ns"] for r in rows) / 1e3,
           "non_compute_us": sum(r["comm_ns"] + r["memory_ns"] for r in rows) / 1e3,
           "comm_us": sum(r["comm_ns"] + r["overlap_ns"] for r in rows) / 1e3,
           "busy_us": busy / 1e3}  # fmt: skip
    comm = sum(r["comm_ns"] + r["overlap_ns"] for r in rows)
    out["overlap_pct"] = round(100 * sum(r["overlap_ns"] for r in rows) / comm, 2) if comm else None
    if span is not None:
        out["kernel_us"], out["idle_us"] = span / 1e3, (span - busy) / 1e3
    if streams is not None:
        out["streams"] = {
            str(s["stream"]): {k: s[f"{k}_ns" if k != "other" else "other_wait_ns"] / 1e3
                               for k in ("host_wait", "kernel_wait", "other")}
            for s in streams
        }  # fmt: skip
    return out


def _kept(row: dict[str, Any], keep_steps: list[int] | None) -> bool:
    if keep_steps is None:
        return bool(row["scope"] == "run")
    return row["scope"] == "step" and row["step"] in keep_steps


def compare(hta: dict[str, Any], mine: dict[str, Any]) -> list[tuple[str, float, float, float]]:
    rows = []
    hta = dict(hta, busy_us=hta["kernel_us"] - hta["idle_us"])
    for key in ("busy_us", "idle_us", "compute_us", "non_compute_us", "comm_us", "kernel_us", "overlap_pct"):
        if key in mine and mine[key] is not None:
            a, b = hta[key], mine[key]
            rows.append((key, a, b, abs(a - b) / abs(a) if a else abs(b)))
    for stream, cats in (mine.get("streams") or {}).items():
        for cat, b in cats.items():
            a = hta["streams"].get(stream, {}).get(cat, 0.0)
            if a or b:
                rows.append((f"stream {stream} {cat}_us", a, b, abs(a - b) / abs(a) if a else abs(b)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("set", type=Path)
    ap.add_argument("--venv", type=Path, default=Path.home() / ".cache" / "rl-trace-observer" / "hta-0.5.0")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--exact-us", action="store_true", help="HTA without its whole-µs rounding")
    args = ap.parse_args()
    sys.exit(check(args.set, args.venv, args.json, args.exact_us))


def check(folder: Path, venv: Path, json_out: Path | None = None, exact_us: bool = False) -> int:
    """Print the tables; 0 when every held figure is within the tolerance, else 1.

    On a trace with fractional-µs times (torch >= 2.4 writes 3 decimals) HTA's default rounds every
    event inward to whole µs, so its table is shown only and the held one is HTA's exact mode
    (``HTA_DISABLE_NS_ROUNDING=1``), where ``get_gpu_kernel_breakdown`` still truncates each kind's
    summed time to whole µs: its communication row is shown only there."""
    py = hta_python(venv)
    files = rank_files(folder)
    fractional = has_fractional_us(files)
    with tempfile.TemporaryDirectory() as tmp:
        summary = ours(folder, Path(tmp))
    gpu = summary["gpu"]
    steps = sorted({r["step"] for r in gpu["rows"] if r["scope"] == "step" and r["step"] is not None})
    cases = [("HTA default", False, None)]
    if len(steps) >= 2:
        cases = [
            ("HTA include_last_profiler_step", True, None),
            ("HTA default (last step left out)", False, steps[:-1]),
        ]
    modes = [(exact_us, True)] if exact_us or not fractional else [(False, False), (True, True)]
    if fractional:
        print(f"{folder.name}: fractional-µs times; HTA 0.5 rounds each event inward to whole µs by default")
    worst, result = 0.0, []
    for exact, held in modes:
        for label, include_last, keep_steps in cases:
            hta = run_hta(py, files, include_last, exact)
            title = f"{label}{', exact µs' if exact else ''}{'' if held else ' (shown only)'}"
            skip = {"comm_us"} if exact and fractional else set()
            rows, w = _table(title, hta, gpu, files, keep_steps, held, skip)
            worst, result = max(worst, w), result + rows
    print(
        f"\nworst relative difference of busy, idle, compute, non-compute, comm, kernel time, overlap: "
        f"{100 * worst:.4f} % (tolerance {100 * TOLERANCE:.1f} %; per-stream rows shown only)"
    )
    if json_out:
        json_out.write_text(json.dumps(result, indent=1))
    return 0 if worst <= TOLERANCE else 1


def _table(
    label: str,
    hta: dict[str, Any],
    gpu: dict[str, Any],
    files: dict[str, str],
    keep_steps: list[int] | None,
    held: bool,
    skip: set[str],
) -> tuple[list[dict[str, Any]], float]:
    """One table: per rank, HTA's figures against ours; the worst held relative difference."""
    print(f"\n{label} vs ours ({'run rows' if keep_steps is None else f'step rows {keep_steps}'})")
    print(f"{'rank':>4} {'figure':28} {'HTA (µs)':>14} {'ours (µs)':>14} {'diff':>9}")
    worst, result = 0.0, []
    for rank in sorted(files, key=int):
        mine = {int(rank), None} if len(files) == 1 else {int(rank)}  # a lone trace may name no rank
        mine_rows = [
            r for r in gpu["rows"] if r["rank"] in mine and r["stage"] == "all" and _kept(r, keep_steps)
        ]
        streams = (
            next(d["streams"] for d in gpu["devices"] if d["rank"] in mine) if keep_steps is None else None
        )
        for key, a, b, rel in compare(hta[rank], _ours_of(mine_rows, streams)):
            counted = held and key not in skip and not key.startswith("stream")
            if counted:
                worst = max(worst, rel)
            result.append({"case": label, "rank": int(rank), "figure": key, "hta": a, "ours": b, "rel": rel,
                           "held": counted})  # fmt: skip
            print(f"{rank:>4} {key:28} {a:14.1f} {b:14.1f} {100 * rel:8.4f}%{'' if counted else '  (shown)'}")
    return result, worst


def has_fractional_us(files: dict[str, str]) -> bool:
    """Any GPU event of the files with a start or duration that is not a whole µs."""
    import gzip

    for path in files.values():
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as fh:
            events = json.load(fh).get("traceEvents", [])
        gpu = [e for e in events if e.get("cat") in _GPU_CATEGORIES]
        if any(
            isinstance(e.get(k), float) and not float(e[k]).is_integer() for e in gpu for k in ("ts", "dur")
        ):
            return True
    return False


if __name__ == "__main__":
    main()
