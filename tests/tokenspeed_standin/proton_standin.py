"""Stand-in for ``tokenspeed_kernel.profiling`` (Proton needs a GPU): SYNTHETIC kernel times.

The surface TokenSpeed's scheduler uses is kept: ``profile_config_from_env`` reads the real
environment variables (``TOKENSPEED_KERNEL_PROFILE_DATA``, ``..._OUTPUT_FORMAT``), ``start_profiling``
/ ``stop_profiling`` open and finalize one session per process (a second one is refused, as Proton
does), ``ProfilingState.get().active`` and ``proton_available()``. ``kernel_scope`` stands where
TokenSpeed's ops enter a Proton scope: with a VizTracer active in the process it first adds the raw
``viztracer->proton`` flow start (cat ``tokenspeed.proton``, ``id`` = scope id, ``bp`` ``e``), as
``_VizTracerProtonScope`` does. Finalize writes ``<output>.chrome_trace`` in Proton's Chrome format
(pid 0 "Trace", ``CPU Thread`` and ``GPU Stream`` lanes, scopes with ``scope_id``, ``launch->kernel``
flows, kernels, sorted keys, TokenSpeed's top-level ``baseTimeNanoseconds``) with a top-level
``"synthetic"`` note; other formats get a small JSON placeholder under Proton's name.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson

GPU_STREAM = 7
GPU_LANE = 200_000 + GPU_STREAM
SYNTHETIC = "rl-trace-observer CPU stand-in: Proton needs a GPU; scope times are real, kernels are made up"


def proton_available() -> bool:
    return True


def profile_config_from_env(output: str | None = None, **_: Any) -> Any:
    env = os.environ
    return SimpleNamespace(
        output=output,
        data=env.get("TOKENSPEED_KERNEL_PROFILE_DATA", "tree"),
        output_format=env.get("TOKENSPEED_KERNEL_PROFILE_OUTPUT_FORMAT", ""),
        mode=env.get("TOKENSPEED_KERNEL_PROFILE_MODE") or None,
        backend=env.get("TOKENSPEED_KERNEL_PROFILE_BACKEND") or None,
        hook=env.get("TOKENSPEED_KERNEL_PROFILE_HOOK", "triton"),
    )


@dataclass
class _Session:
    config: Any
    tid: int = field(default_factory=threading.get_native_id)
    scopes: list[tuple[int, str, int, int]] = field(default_factory=list)  # id, name, start, end (wall ns)
    next_id: int = 1

    def write(self) -> Path:
        out = str(self.config.output)
        if self.config.data == "trace" and self.config.output_format == "chrome_trace":
            path = Path(out + ".chrome_trace")
            data = orjson.dumps(self._chrome(), option=orjson.OPT_SORT_KEYS)
        else:
            path = Path(out + "." + (self.config.output_format or "hatchet"))
            data = orjson.dumps({"synthetic": SYNTHETIC, "scopes": len(self.scopes)})
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(data + b"\n")
        os.replace(tmp, path)
        return path

    def _chrome(self) -> dict[str, Any]:
        base = self.scopes[0][2] if self.scopes else time.time_ns()
        lane = {"pid": 0, "ph": "M"}
        events: list[dict[str, Any]] = [
            {**lane, "name": "process_name", "tid": 0, "args": {"name": "Trace"}},
            {**lane, "name": "thread_name", "tid": self.tid, "args": {"name": f"CPU Thread {self.tid}"}},
            {**lane, "name": "thread_name", "tid": GPU_LANE, "args": {"name": f"GPU Stream {GPU_STREAM}"}},
        ]
        flows, kernels, gpu_free = [], [], base
        for sid, name, start, end in self.scopes:
            ts = (start - base) / 1000
            events.append(
                {
                    "args": {"call_stack": [name], "scope_id": sid},
                    "cat": "scope",
                    "dur": (end - start) / 1000,
                    "name": name,
                    "ph": "X",
                    "pid": 0,
                    "tid": self.tid,
                    "ts": ts,
                }
            )
            k_start = max(start + 2_000, gpu_free + 500)
            k_end = k_start + max(1_000, (end - start) // 2)
            gpu_free = k_end
            flow = {"bp": "e", "cat": "flow", "id": sid, "name": "launch->kernel", "pid": 0}
            flows += [
                {**flow, "ph": "s", "tid": self.tid, "ts": ts},
                {**flow, "ph": "f", "tid": GPU_LANE, "ts": (k_start - base) / 1000},
            ]
            kernels.append(
                {
                    "args": {"call_stack": [name, f"{name}_kernel"]},
                    "cat": "kernel",
                    "dur": (k_end - k_start) / 1000,
                    "name": f"{name}_kernel",
                    "ph": "X",
                    "pid": 0,
                    "tid": GPU_LANE,
                    "ts": (k_start - base) / 1000,
                }
            )
        return {
            "baseTimeNanoseconds": base,
            "displayTimeUnit": "us",
            "synthetic": SYNTHETIC,
            "traceEvents": events + flows + kernels,
        }


class ProfilingState:
    _session: _Session | None = None
    _lock = threading.Lock()

    @classmethod
    def get(cls) -> SimpleNamespace:
        return SimpleNamespace(active=cls._session is not None)


def start_profiling(config: Any) -> None:
    with ProfilingState._lock:
        if ProfilingState._session is not None:
            raise RuntimeError("a Proton session is already active")
        ProfilingState._session = _Session(config)


def stop_profiling() -> Path | None:
    with ProfilingState._lock:
        session, ProfilingState._session = ProfilingState._session, None
    return session.write() if session is not None else None


@contextlib.contextmanager
def kernel_scope(family: str, mode: str, kernel: str) -> Iterator[None]:
    session = ProfilingState._session
    if session is None:
        yield
        return
    sid = session.next_id
    session.next_id += 1
    try:
        from viztracer import get_tracer

        tracer = get_tracer()
        if tracer is not None and tracer.enable:
            tracer.add_raw(
                {
                    "ph": "s",
                    "name": "viztracer->proton",
                    "cat": "tokenspeed.proton",
                    "id": sid,
                    "bp": "e",
                    "ts": tracer.getts(),
                    "pid": os.getpid(),
                    "tid": threading.get_native_id(),
                }
            )
    except ImportError:
        pass
    start = time.time_ns()
    try:
        yield
    finally:
        session.scopes.append((sid, f"{family}.{mode}[{kernel}]", start, time.time_ns()))
