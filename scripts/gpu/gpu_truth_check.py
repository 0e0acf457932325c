"""On a GPU host: a real CUDA ``torch.profiler`` capture checked against the report and HTA 0.5.0.

What it does (no download, no model hub):

1. starts 2 processes (``torch.multiprocessing``) that train a small MLP for 4 steps, with an
   all-reduce of the gradients each step, inside ``record_function("actor_update")`` (an RL stage
   name the report guesses) under ``torch.profiler`` (CPU + CUDA, schedule wait 1 / active 3, one
   trace file per rank with ``distributedInfo``). Two GPUs or more: NCCL, one GPU each. One GPU:
   both processes share it and all-reduce over gloo (NCCL refuses two ranks on one device), so the
   communication shows as memcpy kernels rather than NCCL kernels;
2. merges the two files with ``rl-trace merge`` and reads the report: every kernel placed by its
   launch (``rules.window`` = 0), steps = the profiler's ``ProfilerStep#N``, stage ``update`` guessed
   from ``actor_update`` with the banner, busy ≤ wall and every split summing to its total;
3. runs ``benchmarks/hta_parity.py`` on the two original files with HTA's whole-µs rounding off
   (``HTA_DISABLE_NS_ROUNDING=1``: torch >= 2.4 writes fractional µs, which HTA otherwise rounds
   inward per kernel): busy, idle, compute, non-compute, communication per rank within 0.1 %.

Usage (repository root, this package + CUDA torch installed; HTA goes into its own venv):
    python scripts/gpu/gpu_truth_check.py OUT_DIR [--venv DIR]
Prints one line per check; exit code 0 when all hold.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

STEPS = 4


def _rank(rank: int, world: int, out: str, backend: str, port: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world)
    model = torch.nn.Sequential(*(torch.nn.Linear(1024, 1024) for _ in range(4))).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(256, 1024, device=device)
    trace = Path(out) / f"rank{rank}.pt.trace.json"
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=activities, schedule=schedule(wait=1, warmup=0, active=STEPS - 1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(trace))) as prof:  # fmt: skip
        for _ in range(STEPS):
            with record_function("actor_update"):
                loss = model(x).square().mean()
                opt.zero_grad()
                loss.backward()
                for p in model.parameters():
                    dist.all_reduce(p.grad)
                opt.step()
            torch.cuda.synchronize(device)
            prof.step()
    dist.destroy_process_group()


def capture(out: Path) -> str:
    import torch
    import torch.multiprocessing as mp

    if not torch.cuda.is_available():
        raise SystemExit("FAIL: no CUDA device")
    backend = "nccl" if torch.cuda.device_count() >= 2 else "gloo"
    mp.spawn(_rank, args=(2, str(out), backend, 29517), nprocs=2, join=True)
    return backend


def checks(out: Path, backend: str) -> list[tuple[str, bool]]:
    from rl_trace_observer.analysis.report.output import summarize
    from rl_trace_observer.merge.options import MergeOptions
    from rl_trace_observer.merge.pipeline import merge

    merged = out / "merged.json.gz"
    merge([str(p) for p in sorted(out.glob("rank*.pt.trace.json"))], str(merged), MergeOptions())
    s = summarize(merged)
    gpu = s["gpu"] or {}
    rows = gpu.get("rows") or []
    stage_rows = [r for r in rows if r["scope"] == "stage" and r["stage"] == "update"]
    kinds = gpu.get("kinds") or {}
    return [
        ("the report has a GPU section", bool(rows)),
        ("every kernel placed by its launch", gpu.get("rules", {}).get("window", 1) == 0),
        (f"steps from ProfilerStep#N ({[st['step'] for st in s['steps']]})", len(s["steps"]) == STEPS - 1),
        ("actor_update guessed as update, with the banner", s["source"]["stage_source"] == "names"
         and s["source"]["guessed"]["names"].get("actor_update") == "update" and bool(stage_rows)),
        ("two ranks, one device row each", sorted(r["rank"] for r in rows if r["scope"] == "run") == [0, 1]),
        (f"communication kernels seen ({backend}: {kinds})",
         kinds.get("comm", 0) > 0 if backend == "nccl" else kinds.get("memory", 0) > 0),
        ("busy <= wall, busy = comp + comm + mem, idle = host + kernel + other", all(
            r["busy_ns"] <= r["wall_ns"] and r["compute_ns"] + r["comm_ns"] + r["memory_ns"] == r["busy_ns"]
            and r["host_wait_ns"] + r["kernel_wait_ns"] + r["other_wait_ns"] == r["idle_ns"] for r in rows)),
    ]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--venv", type=Path, default=Path.home() / ".cache" / "rl-trace-observer" / "hta-0.5.0")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("rank*.pt.trace.json"):
        old.unlink()
    backend = capture(args.out)
    failed = 0
    for what, ok in checks(args.out, backend):
        print(("ok  " if ok else "FAIL") + f" {what}")
        failed += not ok
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from hta_parity import check  # the benchmark's comparison, on the two original files

    parity = args.out / "parity"
    parity.mkdir(exist_ok=True)
    for f in args.out.glob("rank*.pt.trace.json"):
        (parity / f.name).write_bytes(f.read_bytes())
    rc = check(parity, args.venv, args.out / "parity.json", exact_us=True)
    print(
        ("ok  " if rc == 0 else "FAIL")
        + " busy, idle, compute, non-compute, comm per rank vs HTA 0.5.0 within 0.1 %"
    )
    sys.exit(1 if failed or rc else 0)


if __name__ == "__main__":
    main()
