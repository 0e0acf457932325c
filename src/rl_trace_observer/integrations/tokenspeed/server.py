"""One replica's TokenSpeed server actor: the methods VERL calls on a rollout server handle.

It launches ``tokenspeed serve`` on its node (:mod:`.launcher`), then speaks to its control port:

- ``generate`` → ``POST /generate`` in the SGLang dialect, with VERL's request id as ``rid`` (so the
  rollout request spans recorded by VERL-side hooks join TokenSpeed's own logs, which carry the rid),
  ``return_logprob`` from VERL's ``logprobs`` flag and real per-token logprobs
  (``--enable-output-logprobs``; without it TokenSpeed returns placeholder zeros);
- ``sleep`` / ``wake_up`` → ``/release_memory_occupation`` / ``/resume_memory_occupation``, strictly:
  TokenSpeed fails a release of a tag already released (``memory_occupation.py``), so the actor
  tracks what is released and never sends a tag twice. ``sleep`` first stops a running profile:
  VERL's sync trainer sleeps replicas *before* it stops rollout profiling;
- ``abort_all_requests`` → ``/abort_request {abort_all}`` (TokenSpeed pauses with abort, then resumes);
- ``start_profile`` / ``stop_profile`` → :mod:`.profiling`;
- weight sync requests from the trainer-side adapter (:mod:`.adapter`) go through here too, so
  the memory state has one owner.

Plain class: :mod:`.replica` wraps it with ``ray.remote``. Imports VERL only inside methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from ... import config as config_mod
from ...capture import get_recorder
from .http import ControlClient, reply_message, reply_ok
from .launcher import ServerProcess, ServeSpec, free_port, server_env
from .profiling import ProfileControl, call_quietly

log = logging.getLogger("rl_trace_observer")

TAGS = ("weights", "kv_cache")


class TokenSpeedError(RuntimeError):
    """A TokenSpeed control request failed; the message names the route and TokenSpeed's reason."""


def _cfg(obj: Any, name: str, default: Any = None) -> Any:
    value = getattr(obj, name, None) if not isinstance(obj, dict) else obj.get(name)
    return default if value is None else value


class TokenSpeedServer:
    def __init__(
        self,
        rollout_config: Any,
        model_path: str,
        replica_rank: int,
        world_size: int,
        *,
        cuda_visible_devices: str | None = None,
        name: str = "tokenspeed_server",
    ) -> None:
        self.config = rollout_config
        self.model_path = model_path
        self.replica_rank = replica_rank
        self.world_size = world_size
        self.cuda_visible_devices = cuda_visible_devices
        self.name = name
        self.settings = config_mod.load()
        self.global_steps: int | None = None
        self.released: set[str] = set()
        self.process: ServerProcess | None = None
        self.client: ControlClient | None = None
        self.profiles: ProfileControl | None = None
        self._address = ""
        self._memory_lock = asyncio.Lock()

    # ------------------------------------------------------------------------- launch
    async def launch_server(self) -> str:
        rec = get_recorder()
        if rec is not None:
            rec.update_identity(role="rollout", replica=self.replica_rank, world_size=self.world_size)
        cfg, s = self.config, self.settings
        spec = ServeSpec(
            model=self.model_path,
            tp=self.world_size,
            port=free_port(),
            control_port=free_port(),
            dtype=_cfg(cfg, "dtype"),
            gpu_memory_utilization=_cfg(cfg, "gpu_memory_utilization"),
            max_num_seqs=_cfg(cfg, "max_num_seqs"),
            max_model_len=_cfg(cfg, "max_model_len"),
            enforce_eager=bool(_cfg(cfg, "enforce_eager", False)),
            trust_remote_code=bool(_cfg(cfg, "trust_remote_code", False)),
            command=s.tokenspeed_command,
            extra_args=s.tokenspeed_args,
            env=server_env(s.tokenspeed_profile_activities, self.cuda_visible_devices),
        )
        self.process = ServerProcess(spec, self.name)
        self.client = ControlClient(f"http://127.0.0.1:{spec.control_port}")
        self.process.start()
        await self.process.wait_healthy(self.client, s.tokenspeed_startup_timeout_s)
        import ray

        self._address = f"{ray.util.get_node_ip_address()}:{spec.port}"
        self.profiles = ProfileControl(
            self.client,
            replica=self.replica_rank,
            ranks=self.world_size,
            activities=s.tokenspeed_profile_activities,
            stall_timeout_s=s.tokenspeed_profile_stall_timeout_s,
            server_alive=lambda: self.process is not None and self.process.alive,
        )
        log.info("[rl-trace-observer] %s: tokenspeed serve is up (%s)", self.name, self.process.log_path)
        return self._address

    def get_server_address(self) -> str:
        return self._address

    def get_world_size(self) -> int:
        return self.world_size

    def get_node_ip(self) -> str:
        import ray

        return str(ray.util.get_node_ip_address())

    def log_path(self) -> str:
        return str(self.process.log_path) if self.process else ""

    async def _call(self, method: str, path: str, body: Any = None, timeout_s: float = 600) -> Any:
        assert self.client is not None, "launch_server() first"
        status, reply = await self.client.request(method, path, body, timeout_s=timeout_s)
        if not reply_ok(status, reply):
            raise TokenSpeedError(f"{self.name}: {method} {path} → HTTP {status}: {reply_message(reply)}")
        return reply

    # ----------------------------------------------------------------------- generate
    def _max_new_tokens(self, params: dict[str, Any], prompt_len: int) -> int:
        asked = params.pop("max_new_tokens", None)
        if asked is None:
            asked = params.pop("max_tokens", None)
        response = int(_cfg(self.config, "response_length", 512))
        room = int(_cfg(self.config, "prompt_length", 512)) + response - prompt_len
        limit = int(_cfg(self.config, "max_model_len", 0) or 0) - prompt_len
        budget = min(response, room) if asked is None else int(asked)
        ceiling = min(room, limit) if limit > 0 else room
        return max(0, min(budget, ceiling))

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        **_: Any,
    ) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        if image_data or video_data:
            raise NotImplementedError("the tokenspeed rollout does not take images or videos yet")
        params = dict(sampling_params)
        return_logprob = bool(params.pop("logprobs", False))  # VERL's flag; TokenSpeed's own is a count
        params.pop("prompt_logprobs", None)
        params["max_new_tokens"] = self._max_new_tokens(params, len(prompt_ids))
        body = {
            "rid": request_id,
            "input_ids": list(prompt_ids),
            "sampling_params": params,
            "return_logprob": return_logprob,
        }
        # Request spans (issue 13's capture API) join on this rid: call site for a server-side span.
        with _generate_span(self.replica_rank):
            reply = await self._call("POST", "/generate", body)
        out = reply[0] if isinstance(reply, list) else reply
        token_ids = [int(t) for t in out.get("output_ids") or []]
        meta = out.get("meta_info") or {}
        log_probs = None
        if return_logprob:
            pairs = meta.get("output_token_logprobs") or []
            if len(pairs) != len(token_ids):
                raise TokenSpeedError(
                    f"{self.name}: /generate gave {len(pairs)} logprobs for {len(token_ids)} tokens "
                    f"(rid {request_id})"
                )
            log_probs = [float(p[0]) for p in pairs]
        finish = meta.get("finish_reason")
        kind = finish.get("type") if isinstance(finish, dict) else finish
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs,
            stop_reason="aborted" if kind == "abort" else "completed",
            num_preempted=0,
            extra_fields={"global_steps": self.global_steps},
        )

    # ------------------------------------------------------------------ memory / control
    async def release_memory(self, tags: list[str] | None = None) -> list[str]:
        """Release the given tags that are not released yet (never one twice); returns them."""
        async with self._memory_lock:
            todo = [t for t in (tags or TAGS) if t in TAGS and t not in self.released]
            if todo:
                await self._call("POST", "/release_memory_occupation", {"tags": todo})
                self.released.update(todo)
            return todo

    async def resume_memory(self, tags: list[str] | None = None) -> list[str]:
        async with self._memory_lock:
            todo = [t for t in (tags or TAGS) if t in self.released]
            if todo:
                await self._call("POST", "/resume_memory_occupation", {"tags": todo})
                self.released.difference_update(todo)
            return todo

    async def sleep(self) -> None:
        await self.stop_profile()  # VERL sleeps before it stops rollout profiling: stop first
        await self.release_memory(list(TAGS))

    async def wake_up(self) -> None:
        await self.resume_memory(list(TAGS))

    async def release_kv_cache(self) -> None:
        await self.release_memory(["kv_cache"])

    async def resume_kv_cache(self) -> None:
        await self.resume_memory(["kv_cache"])
        await self.clear_kv_cache()

    async def clear_kv_cache(self) -> None:
        await self._call("GET", "/flush_cache")

    async def abort_all_requests(self, reject_request: bool = False, **_: Any) -> dict[str, Any]:
        await self._call("POST", "/abort_request", {"abort_all": True})
        return {"aborted_count": None, "request_ids": []}

    async def abort_request(self, request_id: str, **_: Any) -> dict[str, Any]:
        await self._call("POST", "/abort_request", {"rid": request_id})
        return {"aborted": True, "request_id": request_id}

    async def resume_generation(self) -> None:
        return None  # /abort_request {abort_all} resumes by itself

    async def wait_for_requests_to_drain(self) -> None:
        return None

    async def set_global_steps(self, global_steps: int | None) -> None:
        self.global_steps = global_steps

    # ------------------------------------------------------------------------ weights
    async def init_weights_update_group(self, body: dict[str, Any]) -> Any:
        return await self._call("POST", "/init_weights_update_group", body)

    async def update_weights_from_distributed(self, body: dict[str, Any]) -> Any:
        return await self._call("POST", "/update_weights_from_distributed", body)

    # ---------------------------------------------------------------------- profiling
    async def start_profile(self, global_step: int | None = None, **_: Any) -> bool:
        if self.profiles is None:
            return False
        return bool(await call_quietly("start_profile", self.profiles.start(global_step)))

    async def stop_profile(self, **_: Any) -> None:
        if self.profiles is not None:
            await call_quietly("stop_profile", self.profiles.stop())

    async def wait_for_profiles(self, timeout_s: float | None = None) -> list[dict[str, Any]]:
        """Wait for the files of every window this server profiled; what each registered."""
        if self.profiles is None:
            return []
        windows = await self.profiles.wait(timeout_s)
        return [
            {"step": w.step, "directory": str(w.directory), "registered": sorted(w.registered)}
            for w in windows
        ]

    def shutdown(self) -> None:
        if self.profiles is not None:
            self.profiles.close()
        if self.process is not None:
            self.process.terminate()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.shutdown()


@contextlib.contextmanager
def _generate_span(replica: int) -> Any:
    """VERL's own RL-Insight stage for generation (``sglang_generate`` / ``vllm_generate`` alike)."""
    try:
        from verl.utils.tracking import RLInsightLogger

        cm: Any = RLInsightLogger.trace_state("tokenspeed_generate", state_lane_id=f"replica_{replica}")
    except Exception:
        cm = contextlib.nullcontext()
    with cm:
        yield
