"""The walk of one file's events through the per-file job: which merge modules and folders it calls
into, in call order (a profile hook over ``run_job``, in this process, no workers).

    python benchmarks/event_walk.py TRACE [--format pftrace|json.gz]

Prints the number of distinct modules, of folders, and how many times control ENTERS each folder
(a call into it from another folder): the figure the job's forward shape is judged by.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

PKG = "rl_trace_observer.merge."


def walk(trace: Path, fmt: str) -> dict[str, Any]:
    from rl_trace_observer.merge.job import run as job_run
    from rl_trace_observer.merge.options import MergeOptions
    from rl_trace_observer.merge.pipeline import local

    seq: list[str] = []

    def hook(frame: Any, event: str, arg: Any) -> None:
        mod = frame.f_globals.get("__name__", "")
        if event == "call" and mod.startswith(PKG) and (not seq or seq[-1] != mod[len(PKG) :]):
            seq.append(mod[len(PKG) :])

    original = job_run.run_job

    def traced(job: Any) -> Any:
        sys.setprofile(hook)
        try:
            return original(job)
        finally:
            sys.setprofile(None)

    local.run_job = traced  # the pool calls the name it imported
    out = Path(tempfile.mkdtemp()) / f"walk.{fmt}"
    res = local.merge([str(trace)], str(out), MergeOptions(workers=0))
    entries: dict[str, int] = {}
    previous = None
    for folder in (m.split(".")[0] for m in seq):
        if folder != previous:
            entries[folder] = entries.get(folder, 0) + 1
        previous = folder
    modules = sorted(set(seq))
    return {"exit": res.exit_code, "modules": len(modules), "folders": len(entries), "entries": entries}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--format", default="pftrace", choices=["pftrace", "pftrace.gz", "json", "json.gz"])
    args = ap.parse_args()
    print(json.dumps(walk(args.trace, args.format), indent=1))


if __name__ == "__main__":
    main()
