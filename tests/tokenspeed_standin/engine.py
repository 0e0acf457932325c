"""The stand-in's main process: rank processes, a stand-in ``AsyncLLM`` and a stand-in gateway,
behind TokenSpeed's REAL control server and REAL RL control app.

- :class:`Ranks` spawns the scheduler ranks (:mod:`.ranks`) and fans commands out to them.
- :class:`StandInAsyncLLM` is what ``build_sglang_compat_app`` drives: the methods the RL routes call
  (after TokenSpeed's own request parsing) with TokenSpeed's semantics: memory tags released twice or
  resumed while resident fail (``memory_occupation.py``), weight requests reach every rank.
- :func:`gateway_app` stands in for the smg gateway: ``/health``, ``/readiness``, SGLang-native
  ``/generate`` (a one-element list, like smg; ``meta_info.output_token_logprobs`` only with
  ``--enable-output-logprobs``) and ``/start_profile`` / ``/stop_profile``, whose body it parses
  into smg's ``StartProfileRequest`` fields — ``profile_id`` is not one of them, so it is dropped —
  and turns into the real ``ProfileReq`` with the real ``SchedulerControlClient.start_profile``.
"""

# no `from __future__ import annotations`: FastAPI resolves the handlers' Request annotations
import asyncio
import multiprocessing
import threading
from types import SimpleNamespace
from typing import Any

from . import ranks as ranks_mod

START_PROFILE_FIELDS = (
    "output_dir",
    "start_step",
    "num_steps",
    "activities",
    "with_stack",
    "record_shapes",
    "profile_by_stage",
)  # smg's StartProfileRequest minus its `url`; no profile_id


class RankError(RuntimeError):
    pass


class Ranks:
    def __init__(self, tp: int, model_path: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conns, self.procs, self.locks = [], [], []
        for rank in range(tp):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=ranks_mod.main, args=(rank, tp, model_path, child), daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)
            self.locks.append(threading.Lock())
        self.pids = [conn.recv()[1] for conn in self.conns]  # each rank says "ready" once loaded

    def _call_sync(self, rank: int, msg: tuple[Any, ...]) -> Any:
        with self.locks[rank]:
            self.conns[rank].send(msg)
            status, result = self.conns[rank].recv()
        if status != "ok":
            raise RankError(result)
        return result

    async def call(self, rank: int, *msg: Any) -> Any:
        return await asyncio.to_thread(self._call_sync, rank, msg)

    async def all(self, *msg: Any) -> list[Any]:
        return list(await asyncio.gather(*[self.call(r, *msg) for r in range(len(self.conns))]))

    def close(self) -> None:
        for proc in self.procs:
            proc.terminate()


class StandInAsyncLLM:
    """The ``AsyncLLM`` methods TokenSpeed's RL control app calls, backed by the stand-in ranks."""

    def __init__(self, ranks: Ranks, model: str, memory_saver: bool) -> None:
        self.ranks = ranks
        self.server_args = SimpleNamespace(
            rl_control_api_key=None, weight_version="default", model=model, kvstore_storage_backend=None
        )
        self.memory_saver = memory_saver
        self.released: set[str] = set()
        self.admission = True

    async def init_weights_update_group(self, obj: Any) -> tuple[bool, str]:
        body = {k: getattr(obj, k) for k in ("master_address", "master_port", "rank_offset", "world_size")}
        body |= {"group_name": obj.group_name, "backend": obj.backend}
        results = await self.ranks.all("init_group", body)
        return all(ok for ok, _ in results), "; ".join(m for _, m in results)

    async def update_weights_from_distributed(self, obj: Any) -> tuple[bool, str]:
        if "weights" in self.released:
            return False, "weights are released; resume them before updating"
        results = await self.ranks.all("update", obj.names, obj.dtype_names, obj.shapes, obj.weight_version)
        return all(ok for ok, _ in results), results[0][1]

    async def destroy_weights_update_group(self, obj: Any) -> tuple[bool, str]:
        return True, "weight update group not initialized"

    async def release_memory_occupation(self, req: Any) -> Any:
        from tokenspeed.runtime.engine.memory_occupation import _normalize_tags

        tags, err = _normalize_tags(req.tags)
        if err is None and not self.memory_saver:
            err = "memory saver not enabled (--enable-memory-saver)"
        already = [t for t in tags or [] if t in self.released]
        if err is None and already:
            err = f"tags already released: {already!r}"
        if err is None:
            self.released.update(tags or [])
        return SimpleNamespace(success=err is None, message=err or "released")

    async def resume_memory_occupation(self, req: Any) -> Any:
        from tokenspeed.runtime.engine.memory_occupation import _normalize_tags

        tags, err = _normalize_tags(req.tags)
        resident = [t for t in tags or [] if t not in self.released]
        if err is None and resident:
            err = f"tags not released: {resident!r}"
        if err is None:
            self.released.difference_update(tags or [])
        return SimpleNamespace(success=err is None, message=err or "resumed")

    async def flush_cache(self) -> None:
        return None

    def block_generation_admission(self) -> None:
        self.admission = False

    def allow_generation_admission(self) -> None:
        self.admission = True

    async def pause_scheduler(self, mode: str = "wait") -> bool:
        return True

    async def resume_scheduler(self) -> bool:
        return True

    def abort_request(self, rid: str) -> None:
        return None

    async def get_load(self) -> list[Any]:
        return []


def _profile_req(body: dict[str, Any]) -> Any:
    """The ``ProfileReq`` TokenSpeed's engine builds for this gateway request (real code path)."""
    from tokenspeed.runtime.engine.scheduler_control_client import SchedulerControlClient

    captured: list[Any] = []

    async def execute(req: Any) -> Any:
        captured.append(req)
        return SimpleNamespace(success=True, message="")

    fake = SimpleNamespace(auto_create_handle_loop=lambda: None, _execute_profile=execute)
    kwargs = {k: body[k] for k in START_PROFILE_FIELDS if body.get(k) is not None}
    asyncio.run(SchedulerControlClient.start_profile(fake, **kwargs))  # type: ignore[arg-type]
    return captured[0]


def gateway_app(ranks: Ranks, llm: StandInAsyncLLM, real_logprobs: bool) -> Any:
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse
    from tokenspeed.runtime.engine.io_struct import GenerateReqInput, ProfileReq, ProfileReqType
    from tokenspeed.runtime.sampling.sampling_params import SamplingParams

    app = FastAPI(title="stand-in smg gateway (tests only)")

    @app.get("/health")
    @app.get("/readiness")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.post("/generate")
    async def generate(request: Request) -> JSONResponse:
        body = await request.json()
        if not llm.admission:
            return JSONResponse({"error": "generation paused"}, status_code=503)
        obj = GenerateReqInput(
            input_ids=body["input_ids"],
            sampling_params=body.get("sampling_params") or {},
            return_logprob=body.get("return_logprob"),
        )
        obj.rid = body.get("rid") or "gnt-standin"  # what the servicer does with gRPC request_id
        params = dict(obj.sampling_params)  # type: ignore[arg-type]
        SamplingParams(**params).verify(vocab_size=1 << 20)  # TokenSpeed's own sampling model
        results = await ranks.all("generate", obj.rid, list(obj.input_ids), params)  # type: ignore[arg-type]
        out = results[0]
        meta: dict[str, Any] = {
            "id": obj.rid,
            "finish_reason": {"type": out["finish"]},
            "prompt_tokens": len(obj.input_ids),  # type: ignore[arg-type]
            "completion_tokens": len(out["output_ids"]),
        }
        if obj.return_logprob and real_logprobs:
            meta["output_token_logprobs"] = [
                [lp, t, None] for lp, t in zip(out["logprobs"], out["output_ids"], strict=True)
            ]
        return JSONResponse([{"text": "", "output_ids": out["output_ids"], "meta_info": meta}])

    async def profile(req: Any) -> JSONResponse:
        first, *rest = [asyncio.ensure_future(ranks.call(r, "profile", req)) for r in range(len(ranks.conns))]
        ok, message = await first  # only rank 0 answers; other ranks may still be saving
        if req.type == ProfileReqType.START_PROFILE:
            await asyncio.gather(*rest)
        status = 200 if ok else 500
        body = {
            "status": "ok" if ok else "error",
            "message": message,
            "workers_profiled": int(ok),
            "total_workers": 1,
        }
        return JSONResponse(body, status_code=status)

    @app.api_route("/start_profile", methods=["GET", "POST"])
    async def start_profile(request: Request) -> JSONResponse:
        raw = await request.body()
        body = (await request.json()) if raw else {}
        if body.get("profile_by_stage") and body.get("num_steps") is None:
            pass  # TokenSpeed accepts it and its batch predicate crashes later; the rollout never sends it
        return await profile(await asyncio.to_thread(_profile_req, body))

    @app.api_route("/stop_profile", methods=["GET", "POST"])
    async def stop_profile() -> JSONResponse:
        return await profile(ProfileReq(type=ProfileReqType.STOP_PROFILE))

    return app
