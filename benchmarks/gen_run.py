"""Generate a realistic RL run directory for the merge benchmark (``benchmarks/merge_bench.py``).

    python benchmarks/gen_run.py OUT [--events 10_000_000] [--ranks 8] [--steps 2] [--hosts 1]
                                     [--replicas 2] [--tp 4] [--clock-error-us 40,-25,0] [--jobs 2]

What it writes, per host ``OUT/<host>/`` (every file streamed to disk; memory stays bounded):
- actor ranks (one process each): PyTorch/Kineto traces in torch >= 2.4 shape (``baseTimeNanoseconds``,
  pretty-printed, CPU ops on the OS pid, GPU kernels on pid = device index with ``ac2g`` flows keyed by
  correlation id, the ``Spans``/``Traces`` string pids), gzipped once like VERL/torch do, named like
  VERL's DistProfiler: ``verl_profile/actor_train_step{N}_rank{R}_pid{PID}_{stamp}.json.gz``; and a
  VizTracer report per step (``viztracer/``).
- rollout replicas: TokenSpeed scheduler ranks (VizTracer + Proton ``chrome_trace`` with reused launch ids
  and an injected Proton clock error) from :mod:`rl_trace_observer.testing.tokenspeed`,
  under ``verl_profile/agent_loop_rollout_replica_{r}/``.
- every process (driver, actors, rollout servers): an RL-Insight event log and a process record, written
  by the real capture layer (:class:`rl_trace_observer.capture.Recorder`) with a simulated clock, with
  every artifact registered.
``--events`` is the total over all trace files (about: Kineto 50 %, TokenSpeed 38 %, VizTracer 10 %,
RL-Insight 2 %). Prints sizes and counts per kind.
"""

from __future__ import annotations

import argparse
import gzip
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import orjson

from rl_trace_observer import config as config_mod
from rl_trace_observer.capture import Recorder
from rl_trace_observer.testing.tokenspeed import TokenSpeedSpec, write_rank

T0_NS = 1_767_258_000_000_000_000  # 2026-01-01T09:00:00Z
KINETO_BASE_PERIOD_NS = 90 * 86_400 * 10**9  # torch floors baseTimeNanoseconds to a ~3-month boundary
SHARE = {"kineto": 0.50, "tokenspeed": 0.38, "viztracer": 0.10, "rl_insight": 0.02}
_INDENT = orjson.OPT_INDENT_2


@dataclass(frozen=True)
class Proc:
    """One simulated OS process and what it wrote."""

    host: str
    pid: int
    role: str
    rank: int | None
    lane: str
    artifacts: list[tuple[str, str, int]] = field(default_factory=list)  # (absolute path, kind, step)


@dataclass(frozen=True)
class Step:
    number: int
    start_ns: int
    gen: tuple[int, int]  # rollout window
    train: tuple[int, int]  # actor update window


# ----------------------------------------------------------------------------------- streaming output
class GzipOut:
    """One gzip member written through zlib (torch/VERL write one member; Perfetto rejects several)."""

    def __init__(self, path: Path, level: int) -> None:
        self.raw: BinaryIO = open(path, "wb")  # noqa: SIM115
        self.gz = gzip.GzipFile(fileobj=self.raw, mode="wb", compresslevel=level, mtime=0)
        self.buf: list[bytes] = []
        self.size = 0

    def write(self, data: bytes) -> None:
        self.buf.append(data)
        self.size += len(data)
        if self.size > 1 << 20:
            self.gz.write(b"".join(self.buf))
            self.buf, self.size = [], 0

    def close(self) -> None:
        self.gz.write(b"".join(self.buf))
        self.gz.close()
        self.raw.close()


class PlainOut(GzipOut):
    def __init__(self, path: Path, level: int = 0) -> None:
        self.raw = open(path, "wb")  # noqa: SIM115
        self.buf, self.size = [], 0

    def write(self, data: bytes) -> None:
        self.buf.append(data)
        self.size += len(data)
        if self.size > 1 << 20:
            self.raw.write(b"".join(self.buf))
            self.buf, self.size = [], 0

    def close(self) -> None:
        self.raw.write(b"".join(self.buf))
        self.raw.close()


def _us(rng: random.Random, low: float, high: float) -> int:
    return int(rng.uniform(low, high) * 1000)


# ----------------------------------------------------------------------------------- Kineto
_OPS = ("aten::linear", "aten::matmul", "aten::layer_norm", "aten::gelu", "aten::softmax", "aten::add")
_KERNELS = (
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64",
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>",
    "void at::native::cunn_SoftMaxForward<4, c10::BFloat16, float>",
)


_KERNEL_ARGS = {  # the constant part of a Kineto kernel's args (launch configuration)
    "registers per thread": 128,
    "shared memory": 49152,
    "blocks per SM": 1.5,
    "warps per SM": 12.0,
    "grid": [132, 1, 1],
    "block": [384, 1, 1],
    "est. achieved occupancy %": 19,
}


def _x(
    cat: str, name: str, pid: int | str, tid: int | str, ts: float, dur: float, args: Any
) -> dict[str, Any]:
    """A complete event with Kineto's key order."""
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _meta(name: str, pid: int, tid: int, ts: float, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "M", "name": name, "ts": ts, "pid": pid, "tid": tid, "args": args}


def _kineto_events(
    rng: random.Random, pid: int, device: int, start_ns: int, base_ns: int, n: int
) -> Iterator[dict[str, Any]]:
    """CPU op trees with launches, their kernels and ac2g flows, chronologically (about n events)."""

    def ts(ns: int) -> float:
        return round((ns - base_ns) / 1000, 3)

    t, corr, gpu_free = start_ns, 1, start_ns
    step_end = start_ns + n * 5_000  # ops stop before it: children never cross the annotation
    top = {"External id": 0, "Record function id": 0, "Ev Idx": 0}
    yield _x(
        "user_annotation", "actor_update", pid, pid, ts(t), round((step_end + 50_000 - t) / 1000, 3), top
    )
    produced = 1
    while produced < n and t < step_end - 300_000:
        op, launch = _OPS[rng.randrange(len(_OPS))], _us(rng, 3, 8)
        op_start = t = t + _us(rng, 1, 4)
        op_dur = launch + _us(rng, 6, 20)
        child = op_start + _us(rng, 1, 3)
        k_start = max(child + _us(rng, 5, 15), gpu_free + 1_000)
        gpu_free = k_start + _us(rng, 4, 200)
        cpu_args = {"External id": corr, "Record function id": 0, "Sequence number": corr, "Fwd thread id": 0}
        yield _x("cpu_op", op, pid, pid, ts(op_start), op_dur / 1000, {**cpu_args, "Ev Idx": produced})
        launch_args = {"External id": corr, "cbid": 211, "correlation": corr}
        yield _x("cuda_runtime", "cudaLaunchKernel", pid, pid, ts(child), launch / 1000, launch_args)
        yield {"ph": "s", "id": corr, "pid": pid, "tid": pid, "ts": ts(child), "cat": "ac2g", "name": "ac2g"}
        kernel_args = {
            "External id": corr,
            "device": device,
            "stream": 7,
            "correlation": corr,
            **_KERNEL_ARGS,
        }
        name = _KERNELS[corr % len(_KERNELS)]
        yield _x("kernel", name, device, 7, ts(k_start), (gpu_free - k_start) / 1000, kernel_args)
        yield {
            "ph": "f",
            "id": corr,
            "pid": device,
            "tid": 7,
            "ts": ts(k_start),
            "cat": "ac2g",
            "name": "ac2g",
            "bp": "e",
        }
        produced += 5
        t = op_start + op_dur
        corr += 1


def write_kineto(
    path: Path, pid: int, device: int, host: str, start_ns: int, n: int, seed: int, level: int
) -> int:
    """One rank-step torch.profiler trace, ``.json.gz`` in one gzip member, events streamed."""
    rng = random.Random(seed)
    base_ns = start_ns - start_ns % KINETO_BASE_PERIOD_NS
    out = GzipOut(path, level)
    head = {"schemaVersion": 1, "deviceProperties": [{"id": device, "name": "NVIDIA H100 80GB HBM3"}]}
    head |= {
        "trace_id": f"{seed:032X}",
        "host_name": host,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": base_ns,
    }
    out.write(orjson.dumps(head, option=_INDENT)[:-2] + b',\n  "traceEvents": [\n')
    at = round((start_ns - base_ns) / 1000, 3)
    metas = [
        _meta("process_name", pid, 0, at, {"name": "python"}),
        _meta("thread_name", pid, pid, at, {"name": f"thread {pid} (python)"}),
        _meta("process_name", device, 0, at, {"name": "python"}),
        _meta("process_labels", device, 0, at, {"labels": f"GPU {device}"}),
        _meta("thread_name", device, 7, at, {"name": "stream 7 "}),
    ]
    count = 0
    for ev in [*metas, *_kineto_events(rng, pid, device, start_ns, base_ns, n)]:
        out.write((b",\n" if count else b"") + orjson.dumps(ev, option=_INDENT))
        count += 1
    tail = _x("Trace", "PyTorch Profiler (0)", "Spans", "PyTorch Profiler", at, 1.0, {"Op count": 0})
    out.write(b",\n" + orjson.dumps(tail, option=_INDENT) + b'\n  ],\n  "traceName": "' + str(path).encode())
    out.write(b'"\n}\n')
    out.close()
    return count + 1


# ----------------------------------------------------------------------------------- VizTracer (actor)
def write_viztracer(path: Path, pid: int, start_ns: int, n: int, seed: int) -> int:
    """A VizTracer report: nested Python calls written on exit (children first), monotonic µs."""
    rng = random.Random(seed)
    base_ns = start_ns - 3_600 * 10**9  # wall - monotonic: the host booted an hour before
    out = PlainOut(path)
    out.write(b'{"traceEvents":[')
    out.write(
        orjson.dumps(
            {"ph": "M", "pid": pid, "tid": pid, "name": "process_name", "args": {"name": "MainProcess"}}
        )
    )
    out.write(
        b","
        + orjson.dumps(
            {"ph": "M", "pid": pid, "tid": pid, "name": "thread_name", "args": {"name": "MainThread"}}
        )
    )
    count, t = 2, start_ns

    def emit(name: str, begin: int, end: int) -> None:
        ev = {
            "pid": pid,
            "tid": pid,
            "ts": round((begin - base_ns) / 1000, 3),
            "ph": "X",
            "dur": (end - begin) / 1000 * 1.0000000002,
            "name": name,
            "cat": "FEE",
        }
        out.write(b"," + orjson.dumps(ev))

    while count < n:
        outer = t
        for _ in range(min(40, max(1, (n - count) // 2))):
            call = t = t + _us(rng, 1, 3)
            for _ in range(rng.randrange(1, 4)):
                inner = t = t + _us(rng, 0.5, 2)
                t += _us(rng, 5, 80)
                emit(
                    f"_forward_micro_batch (verl/workers/actor/dp_actor.py:{200 + rng.randrange(40)})",
                    inner,
                    t,
                )
                count += 1
            t += _us(rng, 1, 5)
            emit("forward_backward (verl/workers/engine/fsdp/transformer_impl.py:512)", call, t)
            count += 1
        t += _us(rng, 5, 20)
        emit("update_policy (verl/workers/actor/dp_actor.py:401)", outer, t)
        count += 1
        t += _us(rng, 20, 100)
    meta = {"version": "1.1.1", "overflow": False, "baseTimeNanoseconds": base_ns}
    out.write(
        b"]," + orjson.dumps({"viztracer_metadata": meta, "file_info": {"files": {}, "functions": {}}})[1:]
    )
    out.close()
    return count


# ----------------------------------------------------------------------------------- RL-Insight + records
class SimClock:
    """The capture layer's clock, pinned to simulated time (process records get plausible snapshots)."""

    def __init__(self, wall_ns: int) -> None:
        self.now = wall_ns

    def wall_ns(self) -> int:
        return self.now

    def mono_ns(self) -> int:
        return self.now - T0_NS + 3_600 * 10**9

    def perf_ns(self) -> int:
        return self.mono_ns()


def write_process(out_dir: Path, proc: Proc, steps: list[Step], run_id: str, n: int, seed: int) -> int:
    """Event log + process record through the real Recorder: spans per step, metrics to fill ``n``."""
    rng = random.Random(seed)
    clock = SimClock(steps[0].start_ns - 10**9)
    cfg = config_mod.Config(output_dir=out_dir, run_id=run_id, role=proc.role, record_interval_s=3600.0)
    rec = Recorder(cfg, clock, host=proc.host, pid=proc.pid)
    rec.update_identity(rank=proc.rank, world_size=None if proc.rank is None else 8, local_rank=proc.rank)
    count = 0
    for step in steps:
        clock.now = step.start_ns
        rec.clock_snapshot("step_begin", step=step.number)
        spans = _spans_for(proc, step)
        for name, begin, end in spans:
            rec.span(
                name, begin, end, lane=proc.lane, args={"step": step.number, "segment": "state_interval"}
            )
        count += len(spans)
    metrics = max(0, n - count)
    lo, hi = steps[0].start_ns, steps[-1].train[1]
    for i in range(metrics):
        at = lo + (hi - lo) * i // max(1, metrics)
        rec.counter(
            "rollout/num_running_reqs" if proc.role == "rollout" else "actor/grad_norm",
            rng.uniform(0, 64),
            wall_ns=at,
            labels={"rank": str(proc.rank)},
        )
    for path, kind, step_no in proc.artifacts:
        clock.now = steps[step_no - 1].train[1]
        rec.register_artifact(path, kind, step=step_no, role=proc.role, rank=proc.rank)
    clock.now = steps[-1].train[1] + 10**9
    rec.close()
    return count + metrics


def _spans_for(proc: Proc, step: Step) -> list[tuple[str, int, int]]:
    gen, train = step.gen, step.train
    if proc.role == "driver":
        return [("train_batch", step.start_ns, train[1] + 1_000_000)]
    if proc.role == "rollout":
        return [("tokenspeed_generate", gen[0] + 1_000_000, gen[1] - 1_000_000)]
    mid = (train[0] + train[1]) // 2
    return [("actor_compute_log_prob", train[0], mid - 1_000_000), ("actor_update", mid, train[1])]


# ----------------------------------------------------------------------------------- plan and run
def _stamp(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y%m%d%H%M%S%f")[:-3]


class Task(NamedTuple):
    fn: Callable[..., int]
    args: tuple[Any, ...]
    kind: str


@dataclass
class Planner:
    """Turns the command line into processes, step windows and file-writing tasks."""

    args: argparse.Namespace

    def __post_init__(self) -> None:
        a = self.args
        self.servers = a.replicas * a.tp
        self.per_kineto = int(a.events * SHARE["kineto"] / (a.ranks * a.steps))
        self.per_viz = int(a.events * SHARE["viztracer"] / (a.ranks * a.steps))
        self.per_ts = int(a.events * SHARE["tokenspeed"] / (self.servers * a.steps))
        self.per_rli = max(4, int(a.events * SHARE["rl_insight"] / (1 + a.ranks + self.servers)))
        self.offsets = tuple(float(x) for x in a.clock_error_us.split(","))

    def windows(self) -> list[Step]:
        gen_ns = self.per_ts // 5 * 32_000 + 50_000_000  # the synthetic scheduler: ~32 µs per kernel scope
        train_ns = 2 * (self.per_kineto * 5_000 + 100_000_000)
        out, t = [], T0_NS
        for number in range(1, self.args.steps + 1):
            gen = (t + 200_000_000, t + 200_000_000 + gen_ns)
            train = (gen[1] + 100_000_000, gen[1] + 100_000_000 + train_ns)
            out.append(Step(number, t, gen, train))
            t = train[1] + 500_000_000
        return out

    def processes(self) -> list[Proc]:
        """Driver, actor ranks and scheduler ranks; OS pids are per host, so hosts reuse the same pids."""
        a = self.args
        hosts = [f"node-{chr(ord('a') + h)}" for h in range(a.hosts)]
        procs = [Proc(hosts[0], 1000, "driver", None, "trainer")]
        for role, count, first_pid in (("actor", a.ranks, 2000), ("rollout", self.servers, 3000)):
            per_host = max(1, count // a.hosts)
            for i in range(count):
                lane = f"rank_{i}" if role == "actor" else f"replica_{i // a.tp}"
                procs.append(
                    Proc(hosts[min(i // per_host, a.hosts - 1)], first_pid + i % per_host, role, i, lane)
                )
        return procs

    def actor(self, proc: Proc, step: Step, seed: int) -> list[Task]:
        a, rank, base = self.args, proc.rank or 0, self.args.out / proc.host
        start = (step.train[0] + step.train[1]) // 2 + 2_000_000  # inside actor_update
        name = f"actor_train_step{step.number}_rank{rank}_pid{proc.pid}_{_stamp(start)}.json.gz"
        path = base / "verl_profile" / name
        device = rank % max(1, a.ranks // a.hosts)
        vpath = base / "viztracer" / f"actor_rank{rank}_step{step.number}_pid{proc.pid}.viztracer.json"
        proc.artifacts.extend([(str(path), "torch", step.number), (str(vpath), "viztracer", step.number)])
        kineto = (path, proc.pid, device, proc.host, start, self.per_kineto, seed, a.gzip_level)
        return [
            Task(write_kineto, kineto, "kineto"),
            Task(write_viztracer, (vpath, proc.pid, start + 1_000_000, self.per_viz, seed), "viztracer"),
        ]

    def rollout(self, proc: Proc, step: Step, seed: int) -> list[Task]:
        a = self.args
        replica, tp = divmod(proc.rank or 0, a.tp)
        spec = TokenSpeedSpec(
            profile_id=f"verl-step{step.number}",
            ranks=a.tp,
            steps=8,
            events_per_rank=self.per_ts,
            proton_offsets_us=self.offsets,
            seed=seed,
            start_wall_ns=step.gen[0] + 5_000_000,
            scheduler_pid_base=proc.pid - tp,
            flush_parts=a.flush_parts,
        )
        tdir = a.out / proc.host / "verl_profile" / f"agent_loop_rollout_replica_{replica}"
        stem = tdir / f"verl-step{step.number}-TP{tp}"
        parts = [f".part_{i}" for i in range(a.flush_parts)] if a.flush_parts > 1 else [""]
        proc.artifacts.append((f"{stem}.viztracer.json", "viztracer", step.number))
        proc.artifacts.extend((f"{stem}.proton{p}.chrome_trace", "proton", step.number) for p in parts)
        return [Task(_tokenspeed_rank, (tdir, spec, tp), "tokenspeed")]

    def tasks(self) -> list[Task]:
        windows, procs, tasks = self.windows(), self.processes(), []
        hosts = sorted({p.host for p in procs})
        for proc in procs:
            for step in windows:
                # pids repeat on every host: the host's index keeps their files apart (same on host 0)
                seed = self.args.seed * 7919 + proc.pid * 31 + step.number + 104_729 * hosts.index(proc.host)
                if proc.role == "actor":
                    tasks += self.actor(proc, step, seed)
                elif proc.role == "rollout":
                    tasks += self.rollout(proc, step, seed)
        for proc in procs:  # after the trace tasks: they registered the artifacts
            rli = (self.args.out / proc.host, proc, windows, self.args.run_id, self.per_rli, proc.pid)
            tasks.append(Task(write_process, rli, "rl_insight"))
        return tasks


def _tokenspeed_rank(directory: Path, spec: TokenSpeedSpec, tp: int) -> int:
    return write_rank(directory, spec, tp).events


def _run(task: Task) -> tuple[str, int]:
    fn, fargs, kind = task
    for a in fargs:
        if isinstance(a, Path) and a.suffix:
            a.parent.mkdir(parents=True, exist_ok=True)
        elif isinstance(a, Path):
            a.mkdir(parents=True, exist_ok=True)
    return kind, fn(*fargs)


def _sizes(out: Path) -> dict[str, tuple[int, int]]:
    """Files and bytes on disk per kind, from the names."""
    kinds: dict[str, tuple[int, int]] = {}
    for path in out.rglob("*"):
        if not path.is_file():
            continue
        name = path.name
        if "rollout_replica" in path.parent.name:
            kind = "tokenspeed"
        elif name.endswith(".json.gz"):
            kind = "kineto"
        elif name.endswith(".viztracer.json"):
            kind = "viztracer"
        elif name.endswith(".jsonl"):
            kind = "rl_insight"
        else:
            kind = "process_record" if name.startswith("rl-trace-process-") else "other"
        files, size = kinds.get(kind, (0, 0))
        kinds[kind] = (files + 1, size + path.stat().st_size)
    return kinds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--events", type=lambda s: int(s.replace("_", "")), default=10_000_000)
    ap.add_argument(
        "--ranks", type=int, default=8, help="actor ranks (one Kineto + VizTracer trace each per step)"
    )
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--hosts", type=int, default=1)
    ap.add_argument("--replicas", type=int, default=2, help="rollout replicas (TokenSpeed servers)")
    ap.add_argument("--tp", type=int, default=4, help="scheduler ranks per replica")
    ap.add_argument("--flush-parts", type=int, default=1, help="> 1: Proton periodic-flush part files")
    ap.add_argument(
        "--clock-error-us", default="40,-25,0", help="Proton clock error per scheduler rank, cycled"
    )
    ap.add_argument("--gzip-level", type=int, default=1, help="torch uses 9; 1 generates ~4x faster")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run-id", default="bench-run")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    if args.out.exists() and any(args.out.iterdir()):
        print(f"gen_run: {args.out}: not empty; choose a new directory", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    tasks = Planner(args).tasks()
    counts: dict[str, int] = {}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for kind, n in pool.map(_run, tasks, chunksize=1):
            counts[kind] = counts.get(kind, 0) + n
    elapsed = time.perf_counter() - t0
    sizes = _sizes(args.out)
    print(f"{'kind':<15}{'files':>7}{'events':>13}{'MB on disk':>12}")
    for kind in ("kineto", "viztracer", "tokenspeed", "rl_insight", "process_record", "other"):
        files, size = sizes.get(kind, (0, 0))
        if files:
            print(f"{kind:<15}{files:>7}{counts.get(kind, 0):>13,}{size / 1e6:>12.1f}")
    total_events, total_bytes = sum(counts.values()), sum(s for _, s in sizes.values())
    print(f"{'total':<15}{sum(f for f, _ in sizes.values()):>7}{total_events:>13,}{total_bytes / 1e6:>12.1f}")
    print(
        f"generated in {elapsed:.1f} s ({total_events / elapsed / 1e6:.2f} M events/s, "
        f"{args.jobs} jobs) -> {args.out}"
    )
    print("(tokenspeed = VizTracer + Proton files of the scheduler ranks; viztracer = actor reports)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
