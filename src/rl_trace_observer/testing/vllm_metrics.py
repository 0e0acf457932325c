"""A stand-in engine's ``/metrics``: vLLM's metric names and types, served by prometheus_client.

For engines that cannot run here (vLLM needs a GPU): the demo's rollout replicas, the VERL
end-to-end mock engine and the sampler benchmark. What a scraper sees is what vLLM (v1 engine)
exposes with stats on — the same family names, types, label names (``model_name``, ``engine``) and
histogram buckets — over real HTTP, in the Prometheus text format, from prometheus_client's own
server (as vLLM's is). The engine calls the methods below at the moments vLLM updates them:
per scheduler iteration (running / waiting / KV-cache use, tokens) and per finished request.
"""

from __future__ import annotations

import threading
from typing import Any

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0)  # fmt: skip
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)

GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
COUNTERS = (  # as registered: prometheus_client appends ``_total`` on the wire
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:num_preemptions",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
)
HISTOGRAMS = (
    ("vllm:time_to_first_token_seconds", TTFT_BUCKETS),
    ("vllm:inter_token_latency_seconds", ITL_BUCKETS),
    ("vllm:e2e_request_latency_seconds", REQUEST_BUCKETS),
    ("vllm:request_queue_time_seconds", REQUEST_BUCKETS),
    ("vllm:request_prefill_time_seconds", REQUEST_BUCKETS),
    ("vllm:request_decode_time_seconds", REQUEST_BUCKETS),
    ("vllm:request_prompt_tokens", TOKEN_BUCKETS),
    ("vllm:request_generation_tokens", TOKEN_BUCKETS),
)


class VllmMetrics:
    """One engine's metrics in a private registry; :meth:`serve` puts them on ``/metrics``."""

    def __init__(self, model_name: str = "demo", engine: str = "0") -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        labels = ("model_name", "engine")
        self.labels = {"model_name": model_name, "engine": engine}
        reg = self.registry
        self.g = {n: Gauge(n, n, labels, registry=reg).labels(**self.labels) for n in GAUGES}
        self.c = {n: Counter(n, n, labels, registry=reg).labels(**self.labels) for n in COUNTERS}
        self.h = {
            n: Histogram(n, n, labels, buckets=b, registry=reg).labels(**self.labels) for n, b in HISTOGRAMS
        }
        self._success = Counter(
            "vllm:request_success", "finished requests", (*labels, "finished_reason"), registry=reg
        )
        for reason in ("stop", "length", "abort"):
            self._success.labels(**self.labels, finished_reason=reason)
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.address: str | None = None

    # ------------------------------------------------------------------- the engine
    def iteration(
        self, *, running: int, waiting: int, kv_usage: float, prompt_tokens: int, new_tokens: int
    ) -> None:
        """One scheduler step: what vLLM's iteration stats carry."""
        self.g["vllm:num_requests_running"].set(running)
        self.g["vllm:num_requests_waiting"].set(waiting)
        self.g["vllm:kv_cache_usage_perc"].set(max(0.0, min(1.0, kv_usage)))
        if prompt_tokens:
            self.c["vllm:prompt_tokens"].inc(prompt_tokens)
            self.c["vllm:prefix_cache_queries"].inc(prompt_tokens)
        if new_tokens:
            self.c["vllm:generation_tokens"].inc(new_tokens)

    def preempted(self, n: int = 1) -> None:
        self.c["vllm:num_preemptions"].inc(n)

    def finished(
        self,
        *,
        reason: str,
        queue_s: float,
        prefill_s: float,
        decode_s: float,
        ttft_s: float,
        e2e_s: float,
        prompt_tokens: int,
        generation_tokens: int,
    ) -> None:
        """One finished request: vLLM's per-request histograms and the success counter."""
        self._success.labels(**self.labels, finished_reason=reason).inc()
        h = self.h
        h["vllm:request_queue_time_seconds"].observe(max(queue_s, 0.0))
        h["vllm:request_prefill_time_seconds"].observe(max(prefill_s, 0.0))
        h["vllm:request_decode_time_seconds"].observe(max(decode_s, 0.0))
        h["vllm:time_to_first_token_seconds"].observe(max(ttft_s, 0.0))
        h["vllm:e2e_request_latency_seconds"].observe(max(e2e_s, 0.0))
        h["vllm:request_prompt_tokens"].observe(prompt_tokens)
        h["vllm:request_generation_tokens"].observe(generation_tokens)
        if generation_tokens > 1:
            h["vllm:inter_token_latency_seconds"].observe(max(decode_s, 0.0) / (generation_tokens - 1))

    # ------------------------------------------------------------------ the endpoint
    def serve(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve ``/metrics`` on a background thread; returns ``host:port`` (what VERL registers)."""
        from prometheus_client import start_http_server

        if self.address is None:
            self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
            self.address = f"{host}:{self._server.server_address[1]}"
        return self.address

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        self.address = None
