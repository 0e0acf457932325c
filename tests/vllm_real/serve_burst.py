"""One real vLLM engine serving bursts of token-in/token-out requests, traced as VERL's servers are.

Run as ``python -m tests.vllm_real.serve_burst MODEL_DIR RESULT_JSON [EXTRA_TARGET ...]`` with capture
on (``RL_TRACE_OUTPUT_DIR``, ``RL_TRACE_METRICS=1``). The server class is our smallest adapter of
VERL's ``vLLMHttpServer``: an async ``generate(prompt_ids, sampling_params, request_id)`` on a
real ``AsyncLLM`` held as ``self.engine``, given to ``trace_rollout_server`` — the path our VERL
integration takes for every rollout server class — so the server spans and their engine sub-spans
come from the real engine's ``RequestOutput`` stream. The engine's ``/metrics`` (vLLM's own
registry, text/plain) and every ``EXTRA_TARGET`` (``job=host:port``, e.g. node_exporter) are
registered with ``rl_insight.update_prometheus_config`` as VERL and RL-Insight's hardware guide do,
and written as a Prometheus ``file_sd`` file (``$FILE_SD``) for the Prometheus the test runs.

Two bursts (``BURSTS``) of concurrent requests longer than the KV cache holds: vLLM queues them and
preempts some. Between and after the bursts the engine idles for ``IDLE_S`` (every scraper sees
the same settled values). The result file holds vLLM's own accounting: FinishedRequestStats per
request (a stat logger), its preemption count, and the final ``/metrics`` page.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

KV_CACHE_BYTES = 256 * 1024  # 512 tokens; each request needs 2 blocks of 128 of them by its end
BURSTS = ((6, 140), (6, 140))  # (requests, new tokens each)
PROMPT = list(range(20, 40))
IDLE_S = 4.0


class EngineServer:
    """The smallest adapter: VERL's server ``generate`` contract on a real ``AsyncLLM``."""

    def __init__(self, engine: Any, replica_rank: int = 0) -> None:
        self.engine = engine
        self.replica_rank = replica_rank
        self.global_steps = 0

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str) -> Any:
        from vllm import SamplingParams

        params = SamplingParams(ignore_eos=True, **sampling_params)
        final = None
        async for out in self.engine.generate(
            {"prompt_token_ids": prompt_ids}, params, request_id=request_id
        ):
            final = out
        assert final is not None
        out = final.outputs[0]
        return _Output(list(out.token_ids), "completed" if out.finish_reason in ("stop", "length") else "x")


@dataclasses.dataclass
class _Output:  # VERL's TokenOutput fields our server wrapper reads
    token_ids: list[int]
    stop_reason: str


async def main(model: str, result: str, extra: list[str]) -> None:
    from rl_trace_observer.integrations.rl_insight import install
    from rl_trace_observer.integrations.verl.rollout_servers import trace_rollout_server
    from rl_trace_observer.integrations.vllm import engine as ve

    install()
    import rl_insight

    trace_rollout_server(EngineServer)
    finished = ve.FinishedRequests()
    t0 = time.monotonic()
    engine = ve.start_engine(
        ve.engine_args(model, kv_cache_bytes=KV_CACHE_BYTES, max_num_seqs=8, max_model_len=256,
                       served_model_name="tiny-llama"),
        finished,
    )  # fmt: skip
    await ve.warm_up(engine)
    ready_s = time.monotonic() - t0
    address = ve.serve_metrics()
    rl_insight.update_prometheus_config([address], "vllm", [{"replica": 0}])
    jobs: dict[str, list[str]] = {"vllm": [address]}
    for item in extra:
        job, _, target = item.partition("=")
        rl_insight.update_prometheus_config([target], job, [{}])
        jobs.setdefault(job, []).append(target)
    if os.environ.get("FILE_SD"):
        from .exporters import write_file_sd

        write_file_sd(Path(os.environ["FILE_SD"]), {j: [(t, {}) for t in ts] for j, ts in jobs.items()})
    server = EngineServer(engine)
    await asyncio.sleep(IDLE_S)  # every scraper has the idle engine (warm-up counted) before the bursts
    windows = []
    for b, (n, new) in enumerate(BURSTS):
        start = time.time_ns()
        await asyncio.gather(*[server.generate(PROMPT, {"max_tokens": new}, f"b{b}-r{i}") for i in range(n)])
        windows.append([start, time.time_ns()])
        await asyncio.sleep(IDLE_S)
    page = urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()
    stats = {rid: dataclasses.asdict(f) for rid, f in finished.snapshot().items()}
    with open(result, "w") as f:
        record = {"ready_s": ready_s, "address": address, "finished": stats, "jobs": jobs}
        record.update(preemptions=finished.preemptions, metrics_page=page, bursts=windows)
        json.dump(record, f)
    engine.shutdown()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
