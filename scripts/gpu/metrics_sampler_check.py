"""On a GPU host: the metric sampler against a real GPU, checked against ``nvidia-smi``.

This process is a capture member (so the node's sampler starts, sampling every 0.2 s), puts a CUDA
workload on ``cuda:0`` (idle, then ~4 GiB allocated and back-to-back matmuls, then idle again) and
polls ``nvidia-smi`` meanwhile. Then it stops, waits for the sampler to finish, and checks the
samples file and the merged trace. One line per check; exit 1 when one fails.

    python scripts/gpu/metrics_sampler_check.py OUT_DIR
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

IDLE_S, BUSY_S = 4.0, 12.0
FAILED: list[str] = []


def check(name: str, ok: bool, detail: str) -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
    if not ok:
        FAILED.append(name)


def smi() -> dict[str, tuple[float, float]]:
    """pci bus id (upper case, 8-digit domain) → (utilization.gpu %, memory.used MiB)."""
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=pci.bus_id,utilization.gpu,memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    ).stdout
    rows = {}
    for line in out.strip().splitlines():
        bus, util, mem = (p.strip() for p in line.split(","))
        rows[bus.upper()] = (float(util), float(mem))
    return rows


def _norm_bus(bus: str) -> str:
    """NVML's ``00000000:07:00.0`` and nvidia-smi's (same form, maybe lower case) compared equal."""
    domain, _, rest = bus.upper().partition(":")
    return f"{int(domain, 16):08X}:{rest}" if rest else bus.upper()


def workload(torch: Any, polls: list[tuple[float, dict[str, tuple[float, float]]]]) -> tuple[float, float]:
    """Idle, then busy on cuda:0, polling nvidia-smi; returns the busy window (wall s)."""
    end = time.time() + IDLE_S
    while time.time() < end:
        polls.append((time.time(), smi()))
        time.sleep(0.5)
    x = torch.randn(8192, 8192, device="cuda:0")
    hold = torch.empty(4 * 2**30 // 4, dtype=torch.float32, device="cuda:0")  # ~4 GiB
    torch.cuda.synchronize()
    t0 = time.time()
    last_poll = 0.0
    while time.time() - t0 < BUSY_S:
        for _ in range(20):
            x = (x @ x).clamp_(-1, 1)
        torch.cuda.synchronize()
        if time.time() - last_poll > 0.5:
            polls.append((time.time(), smi()))
            last_poll = time.time()
    t1 = time.time()
    del x, hold
    torch.cuda.empty_cache()
    end = time.time() + IDLE_S
    while time.time() < end:
        polls.append((time.time(), smi()))
        time.sleep(0.5)
    return t0, t1


def main(out: Path) -> int:
    os.environ.update(
        RL_TRACE_OUTPUT_DIR=str(out),
        RL_TRACE_METRICS="1",
        RL_TRACE_METRICS_INTERVAL_S="0.2",
        RL_TRACE_RUN_ID="gpu",
        RL_TRACE_METRICS_NODE_DIR=str(out.parent / f"{out.name}-nodes"),  # beside the output, not in it
    )
    import torch

    from rl_trace_observer.capture import get_recorder
    from rl_trace_observer.capture.sampler import leave, node, wait_for_sampler
    from rl_trace_observer.merge.formats.metric_samples.decode import decode

    assert torch.cuda.is_available(), "no CUDA device"
    rec = get_recorder()
    assert rec is not None
    deadline = time.monotonic() + 30
    while not node.sampler_running(node.node_dir(out)) and time.monotonic() < deadline:
        time.sleep(0.1)
    check("sampler started", node.sampler_running(node.node_dir(out)), str(node.node_dir(out)))
    polls: list[tuple[float, dict[str, tuple[float, float]]]] = []
    torch.zeros(1, device="cuda:0")  # a CUDA context: NVML lists this process on the GPU
    t0, t1 = workload(torch, polls)
    rec.close()
    leave()
    check("sampler exited", wait_for_sampler(out, 30), "after the last member left")
    (path,) = out.glob("metrics-*.samples.jsonl")
    data = decode(path.read_bytes())
    check("samples file", data.complete and not data.bad_lines, f"{len(data.samples)} samples, {path.name}")
    check("GPUs found", bool(data.meta["gpus"]["found"]), str(data.meta["gpus"]))
    mine = [
        e for e in data.events if e["k"] == "gpu_users" and any(pid == os.getpid() for pid, _ in e["users"])
    ]
    check("this process found on its GPU (NVML processes + CUDA_VISIBLE_DEVICES)", bool(mine), str(mine[:1]))
    if not mine:
        return 1
    src = mine[0]["src"]
    index = next(k for pid, k in mine[0]["users"] if pid == os.getpid())
    check("CUDA index of that GPU is 0 in this process", index == 0, f"got {index}")
    source = data.sources[src]
    bus = _norm_bus(str(source.fields.get("pci_bus_id")))
    series = {s.id: s.name for s in data.series.values() if s.src == src}
    values: dict[str, list[tuple[float, float]]] = {}
    current: dict[int, float] = {}
    for s in data.samples:
        if s.src != src:
            continue
        current.update(dict(s.values))
        for sid, v in current.items():
            values.setdefault(series[sid], []).append((s.t / 1e9, v))

    def mean(name: str, lo: float, hi: float) -> float:
        got = [v for t, v in values.get(name, []) if lo <= t <= hi]
        return statistics.fmean(got) if got else float("nan")

    busy = (t0 + 2.0, t1 - 0.5)  # NVML's utilisation window lags by up to 1 s
    idle = (t1 + 2.0, t1 + IDLE_S - 0.2)
    smi_busy = [p[bus] for t, p in polls if busy[0] <= t <= busy[1] and bus in p]
    ours_util, smi_util = mean("gpu_utilization_percent", *busy), statistics.fmean(u for u, _ in smi_busy)
    check("utilisation busy ≥ 80 %", ours_util >= 80, f"sampler {ours_util:.1f} %")
    check(
        "utilisation busy within 15 points of nvidia-smi",
        abs(ours_util - smi_util) <= 15,
        f"sampler {ours_util:.1f} %, nvidia-smi {smi_util:.1f} %",
    )
    check(
        "utilisation idle ≤ 20 %",
        mean("gpu_utilization_percent", *idle) <= 20,
        f"{mean('gpu_utilization_percent', *idle):.1f} %",
    )
    ours_mem = mean("gpu_memory_used_bytes", *busy) / 2**20
    smi_mem = statistics.fmean(m for _, m in smi_busy)
    check("memory used busy ≥ 4 GiB", ours_mem >= 4096, f"{ours_mem:.0f} MiB")
    check(
        "memory used within 3 % of nvidia-smi",
        abs(ours_mem - smi_mem) <= 0.03 * smi_mem,
        f"sampler {ours_mem:.0f} MiB, nvidia-smi {smi_mem:.0f} MiB",
    )
    watts, mhz = mean("gpu_power_watts", *busy), mean("gpu_sm_clock_mhz", *busy)
    check("power > 0 W and SM clock > 0 MHz", watts > 0 and mhz > 0, f"{watts:.0f} W, {mhz:.0f} MHz")
    if source.fields.get("gpm"):
        sm = mean("gpu_sm_active_percent", *busy)
        check("GPM SM activity busy ≥ 50 %", sm >= 50, f"{sm:.1f} %")
        check("GPM tensor activity present", "gpu_tensor_active_percent" in values, "")
    else:
        print(f"skip GPM: device {source.fields.get('name')} has no GPM (pre-Hopper)")
    stats = data.last_stats() or {}
    wall = (data.samples[-1].t - data.samples[0].t) / 1e9 if data.samples else 0
    check(
        "sampler CPU < 2 % of a core at 0.2 s",
        wall > 0 and stats.get("cpu_s", 1e9) / wall < 0.02,
        f"{stats.get('cpu_s')} CPU s over {wall:.1f} s",
    )
    merged = out / "merged.json"
    subprocess.run(
        [sys.executable, "-m", "rl_trace_observer.cli.main", "merge", str(out), "-o", str(merged)],
        check=True,
        capture_output=True,
    )
    import json

    doc = json.loads(merged.read_text())
    names = {
        e["pid"]: e["args"]["name"]
        for e in doc["traceEvents"]
        if e.get("ph") == "M" and e["name"] == "process_name"
    }
    gpu_pids = {p for p, n in names.items() if n.endswith("· GPU 0") and f"pid {os.getpid()}" in n}
    counters = [e for e in doc["traceEvents"] if e.get("ph") == "C" and e.get("pid") in gpu_pids]
    check(
        "merged: GPU counters under this process's GPU 0",
        bool(counters),
        f"{len(counters)} points, processes {[names[p] for p in gpu_pids]}",
    )
    return 1 if FAILED else 0


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "out/gpu-metrics-check").resolve()
    target.mkdir(parents=True, exist_ok=True)
    code = main(target)
    print("FAILED: " + ", ".join(FAILED) if FAILED else "all checks passed")
    sys.exit(code)
