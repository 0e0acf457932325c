"""Synthetic TokenSpeed scheduler-rank traces: a stand-in for a GPU engine that cannot run here.

TokenSpeed (``lightseekorg/tokenspeed``) with ``activities=["VIZTRACER", "PROTON"]`` needs CUDA GPUs and
Triton's Proton profiler. This module writes the files one scheduler rank would write, in their real
wire format, from a deterministic simulation (seeded), so readers, the merger and clock alignment can
be tested on machines without a GPU. It follows these facts of the real tools:

- Names: ``{profile_id}-[DP{d}-][CP{c}-]TP{t}[-EXTEND|-DECODE]`` + ``.viztracer.json`` (VizTracer report)
  and ``.proton.chrome_trace`` (TokenSpeed passes ``….proton`` to Proton, which appends the format).
  With Proton's periodic flushing each phase goes to ``….proton.part_{phase}.chrome_trace``.
- VizTracer report (Python API ``save()``): ``traceEvents``, ``viztracer_metadata{version, overflow,
  baseTimeNanoseconds}`` (wall minus monotonic), ``file_info{files, functions}``; ``ts`` is monotonic µs
  with 3 decimals, ``dur`` a float; slices are ``cat: "FEE"``, named ``func (file:line)``, written when
  they EXIT (children before parents) and only when longer than ``min_duration`` (TokenSpeed: 100 µs).
  Before each Proton kernel scope TokenSpeed adds a raw flow start ``{"name": "viztracer->proton",
  "cat": "tokenspeed.proton", "ph": "s", "id": scope_id, "bp": "e"}`` (no finish: mergers add it at the
  Proton scope whose ``args.scope_id`` matches).
- Proton ``chrome_trace`` (trace mode): one compact JSON object, keys sorted (nlohmann), ``displayTimeUnit``
  ``"us"``, and a top-level ``baseTimeNanoseconds`` only in TokenSpeed's build (upstream Proton has NO
  anchor: ``ts`` is µs since the first event of the dump). Everything is in pid 0 (process ``Trace``);
  lanes ``CPU Thread {tid}`` (tid), ``GPU Stream {s}`` (200000 + s) with ``thread_sort_index`` = tid.
  Order: metadata, CPU scopes (``cat: "scope"``, ``args.call_stack``, ``args.scope_id``), then the
  ``launch->kernel`` flow pairs (``cat: "flow"``, ``bp: "e"``; ``s`` at the scope start on the CPU lane,
  ``f`` at the kernel start on the GPU lane), then kernels (``cat: "kernel"``). Launch ids restart in
  every process, so two ranks reuse the same ids.
- Proton's clock is its own: the injected error (``proton_offsets_us``, ``proton_drift_ppm``) moves every
  Proton time, anchor included, against the VizTracer report, as a real misalignment would.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import orjson

__all__ = ["RankFiles", "TokenSpeedSpec", "rank_tag", "write_profile", "write_rank"]

VIZTRACER_VERSION = "1.1.1"
MIN_DURATION_US = 100  # TOKENSPEED_VIZTRACER_MIN_DURATION_US default
GPU_LANE_BASE = 200_000
_SORTED = orjson.OPT_SORT_KEYS
_KERNELS = (  # (Proton scope name as TokenSpeed builds it: family.mode[kernel], GPU kernel name)
    ("norm.rmsnorm[triton_rmsnorm]", "_rms_norm_fwd_kernel"),
    ("gemm.qkv_proj[cublas]", "sm90_xmma_gemm_bf16bf16_bf16f32"),
    ("attention.decode[flashinfer]", "BatchDecodeWithPagedKVCacheKernel"),
    ("gemm.o_proj[cublas]", "sm90_xmma_gemm_bf16bf16_bf16f32"),
    ("moe.fused_experts[triton]", "fused_moe_kernel"),
)


@dataclass(frozen=True)
class TokenSpeedSpec:
    """What to simulate. ``proton_offsets_us`` is cycled over ranks (e.g. ``(40, -25, 0)``)."""

    profile_id: str = "tsprof"
    ranks: int = 2
    steps: int = 4
    events_per_rank: int = 4_000
    proton_offsets_us: tuple[float, ...] = (0.0,)
    proton_drift_ppm: float = 0.0
    anchored: bool = True  # TokenSpeed's Proton writes baseTimeNanoseconds; upstream Proton does not
    flush_parts: int = 1  # > 1: Proton periodic flushing, one part file per phase
    stage: str | None = None  # "EXTEND" / "DECODE" with profile_by_stage
    dp_rank: int | None = None
    cp_rank: int | None = None
    streams: tuple[int, ...] = (7,)
    seed: int = 0
    start_wall_ns: int = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
    scheduler_pid_base: int = 41_000
    uptime_s: float = 1384.6  # host monotonic clock at the start (VizTracer ts are monotonic µs)


@dataclass(frozen=True)
class RankFiles:
    """What one simulated rank wrote, with the ground truth a test needs (times are true wall ns)."""

    rank: int
    tag: str
    pid: int
    viztracer: Path
    proton: tuple[Path, ...]
    viztracer_base_ns: int
    proton_base_ns: tuple[int | None, ...]
    proton_offset_ns: int
    proton_drift_ppm: float
    scope_links: int  # viztracer->proton flow starts, each with a matching Proton scope
    launch_flows: int  # launch->kernel pairs
    viztracer_events: int
    proton_events: int
    start_ns: int
    end_ns: int
    scope_ids: tuple[int, int] = field(default=(0, 0))  # [first, last] scope / launch id used

    @property
    def events(self) -> int:
        return self.viztracer_events + self.proton_events


def rank_tag(tp: int, dp: int | None = None, cp: int | None = None, stage: str | None = None) -> str:
    """TokenSpeed's per-scheduler file tag, e.g. ``DP1-TP0-DECODE``."""
    parts = [f"DP{dp}"] if dp is not None else []
    parts += [f"CP{cp}"] if cp is not None else []
    parts.append(f"TP{tp}")
    if stage:
        parts.append(stage)
    return "-".join(parts)


# ----------------------------------------------------------------------------------- simulation
@dataclass(frozen=True)
class _Scope:
    """One Proton kernel scope and the kernel it launched (true wall-clock ns)."""

    scope_id: int
    flow_ns: int  # VizTracer getts() just before the scope is entered
    start_ns: int
    end_ns: int
    name: str
    kernel: str
    stream: int
    kernel_start_ns: int
    kernel_end_ns: int


@dataclass
class _Step:
    phase: int
    items: list[tuple[str, int, int] | _Scope]  # VizTracer slices (name, start, end) in exit order, scopes


def _us(rng: random.Random, low: float, high: float) -> int:
    return int(rng.uniform(low, high) * 1000)


def _simulate(spec: TokenSpeedSpec, rank: int) -> Iterator[_Step]:
    """Scheduler steps of one rank: forward_batch > decoder layers > kernel scopes, in time order."""
    rng = random.Random(spec.seed * 1_000_003 + rank)
    kernels = max(1, spec.events_per_rank // 5)  # 5 events per kernel scope across both files, + layers
    per_step = math.ceil(kernels / spec.steps)
    t = spec.start_wall_ns + _us(rng, 0, 50) + rank * 1_000
    stream_free = dict.fromkeys(spec.streams, 0)
    next_id = 0
    for step in range(spec.steps):
        items: list[tuple[str, int, int] | _Scope] = []
        step_start = t
        t += _us(rng, 20, 60)
        left, layer = per_step, 0
        while left > 0:
            layer_start, n = t, min(left, 4)
            t += _us(rng, 2, 6)
            for _ in range(n):
                name, kernel = _KERNELS[rng.randrange(len(_KERNELS))]
                flow_ns = t
                start = t + _us(rng, 0.4, 1.5)  # entering the Proton scope
                end = start + _us(rng, 8, 30)
                stream = spec.streams[rng.randrange(len(spec.streams))]
                k_start = max(start + _us(rng, 4, 12), stream_free[stream] + _us(rng, 0.5, 2))
                k_end = k_start + _us(rng, 6, 120)
                stream_free[stream] = k_end
                items.append(_Scope(next_id, flow_ns, start, end, name, kernel, stream, k_start, k_end))
                next_id += 1
                t = end + _us(rng, 1, 5)
            t = max(t, layer_start + (MIN_DURATION_US + 5) * 1000) + _us(rng, 1, 3)  # kept by min_duration
            items.append((f"forward (tokenspeed/runtime/models/qwen3.py:{231 + layer % 3})", layer_start, t))
            left -= n
            layer += 1
        t += _us(rng, 5, 15)
        items.append(("forward_batch (tokenspeed/runtime/engine/model_executor.py:412)", step_start, t))
        yield _Step(step * spec.flush_parts // spec.steps, items)
        t += _us(rng, 50, 300)


# ----------------------------------------------------------------------------------- writers
def _tmp(path: Path, what: str) -> Path:
    return path.with_name(f".{path.name}.{what}.{os.getpid()}.tmp")


class _JsonArray:
    """A comma-separated run of JSON values streamed to a file (bounded memory)."""

    def __init__(self, f: BinaryIO) -> None:
        self.f, self.count = f, 0

    def add(self, data: bytes) -> None:
        self.f.write(b"," + data if self.count else data)
        self.count += 1


class _VizTracerFile:
    """A VizTracer Python-API report, written as the scheduler runs."""

    def __init__(self, path: Path, pid: int, base_ns: int, rank: int) -> None:
        self.path, self.pid, self.base_ns = path, pid, base_ns
        self._tmp = _tmp(path, "w")
        self._f = open(self._tmp, "wb")  # noqa: SIM115  (closed in close())
        self._f.write(b'{"traceEvents":[')
        self.events = _JsonArray(self._f)
        for name, value in (("process_name", f"SpawnProcess-{rank + 1}"), ("thread_name", "MainThread")):
            meta = {"ph": "M", "pid": pid, "tid": pid, "name": name, "args": {"name": value}}
            self.events.add(orjson.dumps(meta))

    def _ts(self, ns: int) -> float:
        return round((ns - self.base_ns) / 1000, 3)

    def slice(self, name: str, start_ns: int, end_ns: int) -> None:
        # VizTracer converts clock ticks with a float factor: durations are not whole ns in µs.
        dur = (end_ns - start_ns) / 1000 * 1.0000000002
        ev = {"pid": self.pid, "tid": self.pid, "ts": self._ts(start_ns), "ph": "X", "dur": dur}
        self.events.add(orjson.dumps({**ev, "name": name, "cat": "FEE"}))

    def flow_start(self, scope_id: int, ts_ns: int) -> None:
        ev = {"name": "viztracer->proton", "cat": "tokenspeed.proton", "ph": "s", "ts": self._ts(ts_ns)}
        self.events.add(orjson.dumps({**ev, "id": scope_id, "bp": "e", "pid": self.pid, "tid": self.pid}))

    def close(self) -> None:
        meta = {"version": VIZTRACER_VERSION, "overflow": False, "baseTimeNanoseconds": self.base_ns}
        tail = {"viztracer_metadata": meta, "file_info": {"files": {}, "functions": {}}}
        self._f.write(b"]," + orjson.dumps(tail)[1:])
        self._f.close()
        os.replace(self._tmp, self.path)


class _ProtonPart:
    """One Proton ``chrome_trace`` dump; its three sections are streamed to temp files, then joined."""

    def __init__(self, path: Path, cpu_tid: int, streams: tuple[int, ...], anchored: bool) -> None:
        self.path, self.cpu_tid, self.streams, self.anchored = path, cpu_tid, streams, anchored
        self.min_ns: int | None = None
        self._tmps = [_tmp(path, s) for s in ("scopes", "flows", "kernels")]
        self._files = [open(p, "wb") for p in self._tmps]  # noqa: SIM115  (closed in close())
        self.scopes, self.flows, self.kernels = (_JsonArray(f) for f in self._files)

    def _ts(self, proton_ns: int) -> float:
        assert self.min_ns is not None
        return (proton_ns - self.min_ns) / 1000

    def add(self, s: _Scope, clock: Any) -> None:
        start, end, k_start, k_end = (
            clock(t) for t in (s.start_ns, s.end_ns, s.kernel_start_ns, s.kernel_end_ns)
        )
        if self.min_ns is None:
            self.min_ns = start
        gpu = GPU_LANE_BASE + s.stream
        scope = {
            "args": {"call_stack": [s.name], "scope_id": s.scope_id},
            "cat": "scope",
            "dur": (end - start) / 1000,
        }
        scope |= {"name": s.name, "ph": "X", "pid": 0, "tid": self.cpu_tid, "ts": self._ts(start)}
        self.scopes.add(orjson.dumps(scope, option=_SORTED))
        flow = {"bp": "e", "cat": "flow", "id": s.scope_id, "name": "launch->kernel", "pid": 0}
        self.flows.add(
            orjson.dumps({**flow, "ph": "s", "tid": self.cpu_tid, "ts": self._ts(start)}, option=_SORTED)
        )
        self.flows.add(orjson.dumps({**flow, "ph": "f", "tid": gpu, "ts": self._ts(k_start)}, option=_SORTED))
        kernel = {
            "args": {"call_stack": [s.name, s.kernel]},
            "cat": "kernel",
            "dur": (k_end - k_start) / 1000,
        }
        kernel |= {"name": s.kernel, "ph": "X", "pid": 0, "tid": gpu, "ts": self._ts(k_start)}
        self.kernels.add(orjson.dumps(kernel, option=_SORTED))

    def _metadata(self) -> list[dict[str, Any]]:
        def lane(tid: int, name: str) -> list[dict[str, Any]]:
            return [
                {"args": {"name": name}, "name": "thread_name", "ph": "M", "pid": 0, "tid": tid},
                {"args": {"sort_index": tid}, "name": "thread_sort_index", "ph": "M", "pid": 0, "tid": tid},
            ]

        meta = [
            {"args": {"name": "Trace"}, "name": "process_name", "ph": "M", "pid": 0, "tid": 0},
            {"args": {"sort_index": 0}, "name": "process_sort_index", "ph": "M", "pid": 0, "tid": 0},
            *lane(self.cpu_tid, f"CPU Thread {self.cpu_tid}"),
        ]
        for stream in self.streams:
            meta += lane(GPU_LANE_BASE + stream, f"GPU Stream {stream}")
        return meta

    def close(self) -> int:
        """Join the sections into the final file; returns the number of events written."""
        for f in self._files:
            f.close()
        head: dict[str, Any] = {"displayTimeUnit": "us"}
        if self.anchored and self.min_ns is not None:
            head["baseTimeNanoseconds"] = self.min_ns
        out = _tmp(self.path, "w")
        meta = self._metadata()
        with open(out, "wb") as f:
            f.write(orjson.dumps(head, option=_SORTED)[:-1] + b',"traceEvents":[')
            f.write(b",".join(orjson.dumps(m, option=_SORTED) for m in meta))
            for tmp, section in zip(self._tmps, (self.scopes, self.flows, self.kernels), strict=True):
                if section.count:
                    f.write(b",")
                    with open(tmp, "rb") as src:
                        while chunk := src.read(1 << 20):
                            f.write(chunk)
                tmp.unlink()
            f.write(b"]}\n")
        os.replace(out, self.path)
        return len(meta) + self.scopes.count + self.flows.count + self.kernels.count


# ----------------------------------------------------------------------------------- public API
def write_rank(directory: str | os.PathLike[str], spec: TokenSpeedSpec, rank: int) -> RankFiles:
    """Write one scheduler rank's VizTracer report and Proton dump(s) into ``directory``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tag = rank_tag(rank, spec.dp_rank, spec.cp_rank, spec.stage)
    stem = f"{spec.profile_id}-{tag}"
    pid = spec.scheduler_pid_base + rank
    offset_ns = round(spec.proton_offsets_us[rank % len(spec.proton_offsets_us)] * 1000)
    t0 = spec.start_wall_ns

    def proton_clock(true_ns: int) -> int:
        return true_ns + offset_ns + round(spec.proton_drift_ppm * 1e-6 * (true_ns - t0))

    viz = _VizTracerFile(out / f"{stem}.viztracer.json", pid, t0 - round(spec.uptime_s * 1e9), rank)
    parts: list[_ProtonPart] = []
    links = 0
    first_id = last_id = -1
    start_ns = end_ns = t0
    try:
        for number, step in enumerate(_simulate(spec, rank)):
            if not parts or len(parts) <= step.phase:
                suffix = f".part_{step.phase}" if spec.flush_parts > 1 else ""
                parts.append(
                    _ProtonPart(out / f"{stem}.proton{suffix}.chrome_trace", pid, spec.streams, spec.anchored)
                )
            part = parts[-1]
            for item in step.items:
                if isinstance(item, _Scope):
                    viz.flow_start(item.scope_id, item.flow_ns)
                    part.add(item, proton_clock)
                    links += 1
                    first_id = item.scope_id if first_id < 0 else first_id
                    last_id = item.scope_id
                else:
                    viz.slice(*item)
                    if number == 0 and item[0].startswith("forward_batch"):
                        start_ns = item[1]
                    end_ns = max(end_ns, item[2])
        viz.close()
        proton_events = sum(p.close() for p in parts)
    except BaseException:
        for path in out.glob(f".{stem}.*.tmp"):
            path.unlink(missing_ok=True)
        raise
    return RankFiles(
        rank=rank,
        tag=tag,
        pid=pid,
        viztracer=viz.path,
        proton=tuple(p.path for p in parts),
        viztracer_base_ns=viz.base_ns,
        proton_base_ns=tuple(p.min_ns if spec.anchored else None for p in parts),
        proton_offset_ns=offset_ns,
        proton_drift_ppm=spec.proton_drift_ppm,
        scope_links=links,
        launch_flows=links,
        viztracer_events=viz.events.count,
        proton_events=proton_events,
        start_ns=start_ns,
        end_ns=end_ns,
        scope_ids=(first_id, last_id),
    )


def write_profile(directory: str | os.PathLike[str], spec: TokenSpeedSpec) -> list[RankFiles]:
    """Every rank of one ``/start_profile`` … ``/stop_profile`` window."""
    return [write_rank(directory, spec, rank) for rank in range(spec.ranks)]
