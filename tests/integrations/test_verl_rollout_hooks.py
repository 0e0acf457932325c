"""The rollout hooks on VERL's real classes: client, server, weight sync, staleness.

Real ``LLMServerClient.generate`` (VERL's code: load-balancer round trip, fresh request id, the
call to the server handle), in this process, goes through VERL's own ``GlobalRequestLoadBalancer``
— a real Ray actor made by VERL's ``get_router_handle`` on a local Ray cluster — to the e2e
harness's ``MockLLMServer`` running as a real Ray actor with capture on (the one fake: it stands in
for vLLM's engine and speaks its wire format). Real ``CheckpointEngineManager`` methods
(``auto_await``), a real ``BaseRollout`` subclass, the real replay-buffer classes, in process. Every
patch is undone afterwards and checked by identity.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from rl_trace_observer import config as config_mod
from rl_trace_observer.capture import configure, engine_times, reset
from rl_trace_observer.capture import requests as rq
from rl_trace_observer.integrations.verl import contract, requests, rollout_servers, staleness, weight_sync

from ..conftest import ROOT, need
from ..trace_files import event_logs, read_jsonl

llm_server = need("verl.workers.rollout.llm_server")
np = need("numpy")
torch = need("torch")
from verl.checkpoint_engine.base import CheckpointEngineManager  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker  # noqa: E402
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync  # noqa: E402
from verl.workers.rollout.base import BaseRollout  # noqa: E402

from ..verl_e2e.mock_rollout import MockLLMServer  # noqa: E402

PATCHED = {
    llm_server.LLMServerClient: ("generate", "_vllm_request_id", "_release_server"),
    AgentLoopWorker: ("_run_agent_loop",),
    CheckpointEngineManager: tuple(weight_sync.MANAGER_PHASES),
    ReplayBuffer: ("sample",),
    ReplayBufferAsync: ("sample",),
    BaseRollout: ("__init_subclass__",),
    MockLLMServer: ("generate", "sleep", "wake_up", "abort_all_requests", "set_global_steps"),
}


@pytest.fixture
def hooks(tmp_path: Path) -> Iterator[Any]:
    before = {cls: {n: vars(cls).get(n) for n in names} for cls, names in PATCHED.items()}
    reset()
    rec = configure(config_mod.load({"RL_TRACE_OUTPUT_DIR": str(tmp_path / "out")}))
    for module in (requests, rollout_servers, weight_sync, staleness):
        module.install()
    rollout_servers._instrument(MockLLMServer)  # what trace_rollout_server does when capture is on
    try:
        yield rec
    finally:
        for module in (requests, rollout_servers, weight_sync, staleness):
            module.uninstall()
        reset()
        after = {cls: {n: vars(cls).get(n) for n in names} for cls, names in PATCHED.items()}
        assert after == before, "every patch is undone, the very same objects back"


def events(rec: Any) -> list[dict[str, Any]]:
    rec.events.flush()
    return read_jsonl(rec.events.path)


@pytest.fixture(scope="module")
def ray_node() -> Iterator[Any]:
    """A local one-node Ray cluster for the client's round trips (VERL's balancer, the server)."""
    ray = need("ray")
    from ..ray_cluster import local_ray_cluster

    with local_ray_cluster(["rollout_node"], "rlh"):
        yield ray


@pytest.fixture(scope="module")
def remote_server(ray_node: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, Path]]:
    """MockLLMServer as a Ray actor capturing into its own directory (its module traces the class, as
    a rollout VERL does not ship must), and VERL's balancer in front of it: (server, balancer, dir)."""
    from verl.workers.rollout.router import get_router_handle

    out = tmp_path_factory.mktemp("server")
    env = {"RL_TRACE_OUTPUT_DIR": str(out), "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
    server = (
        ray_node.remote(MockLLMServer)
        .options(num_cpus=0, runtime_env={"env_vars": env})
        .remote(SimpleNamespace(profiler=None), replica_rank=0, world_size=1)
    )
    balancer = get_router_handle(servers={SERVER_ADDRESS: server})
    yield server, balancer, out
    for actor in (server, balancer):
        ray_node.kill(actor)


SERVER_ADDRESS = "127.0.0.1:20000"


def _server_events(ray: Any, server: Any, out: Path) -> list[dict[str, Any]]:
    """What the server actor wrote, once its log is flushed (a call in its own process)."""

    def flush(self: Any) -> bool:
        from rl_trace_observer.capture import get_recorder

        rec = get_recorder()
        if rec is not None:
            rec.events.flush()
        return rec is not None

    assert ray.get(server.__ray_call__.remote(flush)), "capture is off in the server actor"
    return [e for evs in event_logs(out).values() for e in evs]


def _client(balancer: Any) -> Any:
    rollout = SimpleNamespace(name="mock", full_determinism=False)
    config = SimpleNamespace(actor_rollout_ref=SimpleNamespace(rollout=rollout))
    return llm_server.LLMServerClient(config, load_balancer_handle=balancer)


def test_client_and_server_spans_from_verls_real_client(
    hooks: Any, remote_server: Any, ray_node: Any
) -> None:
    server, balancer, out = remote_server
    ray_node.get(server.set_global_steps.remote(4))
    client = _client(balancer)
    trajectory = {"step": 5, "sample_index": np.int64(3), "rollout_n": 1, "validate": False}

    async def agent_loop(self: Any, sampling_params: Any, trajectory: Any, **kwargs: Any) -> list[Any]:
        outs = []
        for _ in range(2):  # two turns of one session, as a multi-turn agent loop does
            outs.append(
                await client.generate("session-1", prompt_ids=[1, 2, 3], sampling_params={"max_tokens": 4})
            )
        return outs

    run = requests._wrap_run_agent_loop(agent_loop)  # the exact wrapper installed on AgentLoopWorker
    outs = asyncio.run(run(None, {}, trajectory, agent_name="single_turn_agent", uid="u-7", session_id=1))
    assert all(o.extra_fields["global_steps"] == 4 for o in outs)
    clients = [e for e in events(hooks) if e.get("name") == rq.CLIENT_SPAN]
    theirs = _server_events(ray_node, server, out)
    servers = {e["args"]["request_id"]: e for e in theirs if e.get("name") == rq.SERVER_SPAN}
    assert not [e for e in events(hooks) if e.get("name") == rq.SERVER_SPAN]  # served in the actor
    assert [c["args"]["turn"] for c in clients] == [1, 2]
    for c in clients:
        a = c["args"]
        assert a["request_id"] in servers and a["request_id"] != "session-1"  # the fresh id VERL sent
        assert a["session"] == "session-1" and a["server"] == SERVER_ADDRESS  # the balancer's answer
        assert (a["step"], a["sample_index"], a["rollout_n"], a["uid"], a["session_id"]) == (
            5,
            3,
            1,
            "u-7",
            1,
        )
        assert a["prompt_tokens"] == 3 and a["status"] == "completed" and a["version"] == 4
        s = servers[a["request_id"]]
        assert s["bind_id"] == c["bind_id"] and s["args"]["replica"] == 0 and s["args"]["version"] == 4
        assert s["args"]["response_tokens"] == a["response_tokens"] and s["args"]["prompt_tokens"] == 3
        assert c["ts_ns"] <= s["ts_ns"] and s["ts_ns"] + s["dur_ns"] <= c["ts_ns"] + c["dur_ns"]  # one host
        assert s["pid"] != c["pid"]
    for s in servers.values():  # from the engine's metrics (vLLM's RequestStateStats: 4 core times + arrival)
        assert len(s["args"]["engine_ns"]) == 5 and all(isinstance(t, int) for t in s["args"]["engine_ns"])
    assert hooks.record()["role"] == "agent_loop"

    def identity(self: Any) -> tuple[Any, Any]:
        from rl_trace_observer.capture import get_recorder

        rec = get_recorder()
        record = rec.record() if rec is not None else {}
        return record.get("role"), record.get("replica")

    # no profiler ran in this server: its first request names its role (the merge labels it by it)
    assert ray_node.get(server.__ray_call__.remote(identity)) == ("rollout", 0)


def test_a_failing_server_call_still_ends_both_spans(
    hooks: Any, remote_server: tuple[Any, Any, Path], ray_node: Any
) -> None:
    server, balancer, out = remote_server

    def break_engine(self: Any, broken: bool) -> None:  # in the actor: its engine dies mid-request
        async def dead(*args: Any, **kwargs: Any) -> Any:
            raise ConnectionError("replica died")
            yield  # pragma: no cover

        if broken:
            self.engine.working_generate, self.engine.generate = self.engine.generate, dead
        else:
            self.engine.generate = self.engine.working_generate

    ray_node.get(server.__ray_call__.remote(break_engine, True))
    try:
        with pytest.raises(ConnectionError):  # Ray re-raises the server's error as a RayTaskError subclass
            asyncio.run(_client(balancer).generate("s", prompt_ids=[1], sampling_params={}))
    finally:
        ray_node.get(server.__ray_call__.remote(break_engine, False))
    (client,) = [e for e in events(hooks) if e.get("name") == rq.CLIENT_SPAN]
    rid = client["args"]["request_id"]
    (served,) = [
        e for e in _server_events(ray_node, server, out) if e.get("args", {}).get("request_id") == rid
    ]
    assert (client["args"]["status"], served["name"], served["args"]["status"]) == (
        "error: RayTaskError(ConnectionError)",  # what the agent loop really caught
        rq.SERVER_SPAN,
        "error: ConnectionError",
    )


def test_server_control_methods_are_weight_sync_phases(hooks: Any) -> None:
    server = MockLLMServer(SimpleNamespace(profiler=None), replica_rank=2, world_size=1)

    async def control() -> None:
        await server.abort_all_requests()
        await server.sleep()
        await server.wake_up()
        await server.set_global_steps(7)

    asyncio.run(control())
    evs = events(hooks)
    got = [
        (e["name"], e["args"].get("replica"), e["args"].get("version"))
        for e in evs
        if e.get("cat") == rq.SYNC_CAT
    ]
    assert got == [("pause", 2, None), ("sleep", 2, None), ("wake_up", 2, None), ("weight_version", 2, 7)]


def test_sglang_shaped_server_gives_a_queue_phase(hooks: Any) -> None:
    class SGLangLike:
        replica_rank = 0
        global_steps = 1

        def __init__(self) -> None:
            async def generate_request(obj: Any, request: Any) -> Any:
                yield {"output_ids": [1, 2], "meta_info": {"queue_time": 0.001, "finish_reason": None}}

            self.tokenizer_manager = SimpleNamespace(generate_request=generate_request)

        async def generate(
            self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str
        ) -> Any:
            out = await self.tokenizer_manager.generate_request({"rid": request_id}, None).__anext__()
            await asyncio.sleep(0.002)
            return SimpleNamespace(token_ids=out["output_ids"], stop_reason=None)

    assert rollout_servers._instrument(SGLangLike)
    try:
        asyncio.run(SGLangLike().generate([1], {}, request_id="sg-1"))
        (server,) = [e for e in events(hooks) if e.get("name") == rq.SERVER_SPAN]
        queued, scheduled, first, last = server["args"]["engine_ns"]
        assert (scheduled - queued, first, last) == (1_000_000, None, None) and queued == server["ts_ns"]
    finally:
        rollout_servers.uninstall()


def test_an_http_engine_server_can_tell_its_phases(hooks: Any) -> None:
    class HttpServer:  # TokenSpeed's shape: the engine is behind HTTP, its answer has meta_info
        replica_rank = 3

        async def generate(
            self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any]
        ) -> Any:
            start = time.time_ns()
            rollout_servers.note_engine_phases(rq.phases_from_sglang({"queue_time": 0.002}, start))
            return SimpleNamespace(token_ids=[7], stop_reason="completed")

    assert rollout_servers._instrument(HttpServer)
    try:
        asyncio.run(HttpServer().generate("h-1", [1, 2], {}))  # request_id first, by position
        (server,) = [e for e in events(hooks) if e.get("name") == rq.SERVER_SPAN]
        queued, scheduled = server["args"]["engine_ns"][:2]
        assert scheduled - queued == 2_000_000 and server["args"]["replica"] == 3
        assert server["args"]["request_id"] == "h-1" and server["args"]["prompt_tokens"] == 2
    finally:
        rollout_servers.uninstall()
    rollout_servers.note_engine_phases(None)  # outside a server call: nothing happens


def test_server_classes_are_checked_and_never_wrapped_twice(
    hooks: Any, caplog: pytest.LogCaptureFixture
) -> None:
    class NoId:
        async def generate(self, prompt_ids: list[int]) -> None:
            return None

    with caplog.at_level(logging.ERROR, logger="rl_trace_observer"):
        assert not rollout_servers._instrument(NoId)
    assert "has no request_id parameter" in caplog.text
    assert vars(NoId)["generate"].__name__ == "generate" and not hasattr(
        vars(NoId)["generate"], "_rl_trace_wrapped"
    )

    class Child(MockLLMServer):
        pass

    assert rollout_servers._instrument(Child)
    assert "generate" not in vars(Child)  # inherits the parent's wrapper: one span per request


def test_trainer_phases_keep_auto_await_semantics(hooks: Any) -> None:
    calls: list[str] = []

    class Replica:
        async def sleep(self) -> None:
            calls.append("sleep")

        async def abort_all_requests(self, reject_request: bool = False) -> None:
            calls.append("abort")

        async def resume_generation(self) -> None:
            calls.append("resume")

    mgr = CheckpointEngineManager.__new__(CheckpointEngineManager)
    mgr.replicas, mgr.backend = [Replica(), Replica()], "nccl"
    mgr.sleep_replicas()  # called without await from plain code: auto_await runs it

    async def from_async() -> None:
        await mgr.abort_replicas()  # awaited from a coroutine: auto_await hands back the coroutine
        await mgr.resume_generation_replicas()

    asyncio.run(from_async())
    assert calls == ["sleep", "sleep", "abort", "abort", "resume", "resume"]
    evs = events(hooks)
    got = [(e["name"], e["args"]) for e in evs if e.get("cat") == rq.SYNC_CAT]
    assert got == [("sleep", {}), ("pause", {}), ("resume_generation", {})]


def test_adapter_phases_count_the_weights_and_nest_once(hooks: Any) -> None:
    class Adapter(BaseRollout):
        async def resume(self, tags: list[str]) -> None:
            return None

        async def release(self) -> None:
            return None

        async def update_weights(
            self, weights: Any, wire_format: str = "named_tensors", **kwargs: Any
        ) -> int:
            return sum(1 for _ in weights)

    class Derived(Adapter):
        async def update_weights(
            self, weights: Any, wire_format: str = "named_tensors", **kwargs: Any
        ) -> int:
            return await super().update_weights(weights, wire_format, **kwargs)

    adapter = Derived.__new__(Derived)
    adapter.replica_rank = 1
    weights = ((f"w{i}", torch.zeros(10, dtype=torch.float32)) for i in range(5))

    async def sync() -> int:
        await adapter.resume(tags=["weights"])
        n = await adapter.update_weights(weights, global_steps=3)
        await adapter.resume(["kv_cache"])
        await adapter.release()
        return n

    assert asyncio.run(sync()) == 5
    evs = events(hooks)
    got = [(e["name"], e["args"]) for e in evs if e.get("cat") == rq.SYNC_CAT]
    assert [name for name, _ in got] == ["resume_weights", "load_weights", "resume_kv_cache", "release"]
    load = got[1][1]
    assert (load["replica"], load["version"], load["bytes"], load["tensors"]) == (1, 3, 200, 5)
    assert load["gather_ns"] >= 0


def test_staleness_where_the_replay_buffer_hands_out_a_batch(hooks: Any) -> None:
    tags = [
        {"min_global_steps": 2, "max_global_steps": 3},
        {"min_global_steps": 3, "max_global_steps": 3},
        {"is_padding": True},
    ]
    batch = SimpleNamespace(keys=["a_0_0", "b_0_0", "pad"], tags=tags)
    sample = staleness._wrap_sample(lambda self, g, p, b: (batch, {}))
    assert sample(None, 4, "train", 2)[0] is batch
    sample(None, 4, "val", 2)  # validation is not training data
    evs = events(hooks)
    (span,) = [e for e in evs if e.get("name") == "consume_samples"]
    assert span["args"]["step"] == 4 and span["args"]["trainer_version"] == 3
    assert span["args"]["lag_steps"] == {"0": 1, "1": 1} and span["args"]["samples"] == 2
    assert [e["args"]["key"] for e in evs if e.get("name") == "sample_staleness"] == ["a_0_0", "b_0_0"]
    assert getattr(vars(ReplayBuffer)["sample"], "__wrapped__", None) is not None  # installed on VERL's


def test_a_missing_surface_is_one_error_and_nothing_is_patched(
    hooks: Any, caplog: pytest.LogCaptureFixture
) -> None:
    contract.reset_reports()
    fake = ModuleType("verl.workers.rollout.llm_server")

    class LLMServerClient:
        async def generate(self, request_id: str, **kwargs: Any) -> None:
            return None

    fake.LLMServerClient = LLMServerClient  # type: ignore[attr-defined]
    requests.uninstall()
    requests._state["requested"] = True
    with caplog.at_level(logging.ERROR, logger="rl_trace_observer"):
        requests._install_client(fake)
        requests._install_client(fake)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "_vllm_request_id" in errors[0].getMessage()
    assert "rollout request spans (client) is off" in errors[0].getMessage()
    assert vars(LLMServerClient)["generate"].__qualname__.endswith("LLMServerClient.generate")
    contract.reset_reports()


def test_requests_switch_off_leaves_verl_untouched(tmp_path: Path) -> None:
    """``RL_TRACE_REQUESTS=0``: the plugin installs none of the rollout hooks (fresh interpreter; the
    switch on is what every other test here and the end-to-end run use)."""
    switch = "0"
    from ..conftest import clean_env, run_python

    code = """
        import rl_trace_observer.integrations.verl.register as reg
        from verl.workers.rollout.llm_server import LLMServerClient
        from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
        print(reg.INSTALLED["rollout_requests"], LLMServerClient.generate.__code__.co_filename,
              ReplayBuffer.sample.__code__.co_filename)
    """
    env = clean_env(RL_TRACE_OUTPUT_DIR=str(tmp_path), RL_TRACE_REQUESTS=switch)
    installed, client_file, buffer_file = run_python(code, env).stdout.split()[-3:]
    ours = switch == "1"
    assert installed == str(ours)
    assert ("rl_trace_observer" in client_file) == ours and ("rl_trace_observer" in buffer_file) == ours


def test_engine_tap_keeps_the_first_item_then_runs_no_python_per_item() -> None:
    """After the first item the tap is a ``_Passing``: ``async for`` gets the engine stream's own
    awaitable (no frame of ours per token, checked with a profile hook), every item still arrives in
    order, and the generator's own methods (``aclose``) still reach it."""
    import sys

    async def stream(n: int) -> Any:
        for i in range(n):
            yield i

    calls: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename == rollout_servers.__file__:
            calls.append(frame.f_code.co_name)

    async def consume() -> tuple[list[int], Any]:
        call = rollout_servers._Call()
        tap = rollout_servers._Tap(stream(50), call)
        sys.setprofile(profile)
        try:
            got = [x async for x in tap]
        finally:
            sys.setprofile(None)
        assert type(tap) is rollout_servers._Passing
        half = rollout_servers._Tap(stream(5), rollout_servers._Call())
        async for _ in half:
            break
        await half.aclose()  # through __getattr__ to the real generator
        return got, call.first

    got, first = asyncio.run(consume())
    assert got == list(range(50)) and first == 0
    assert calls.count("__anext__") == 1
    assert len(calls) <= 2, calls  # __aiter__ + the __anext__ coroutine for item 0; nothing for items 1..49

    async def empty() -> Any:
        call = rollout_servers._Call()
        return [x async for x in rollout_servers._Tap(stream(0), call)], call.first

    assert asyncio.run(empty()) == ([], None)


def test_engine_offset_is_read_once_per_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wall − monotonic offset behind vLLM's phases is read (three brackets) at most once per
    ``OFFSET_TTL_NS``, and again after it."""
    reads: list[int] = []
    mono = [10**12]
    monkeypatch.setattr(engine_times, "_offset", (0, -(1 << 62)))
    monkeypatch.setattr(engine_times, "_mono_ns", lambda: mono[0])
    monkeypatch.setattr(engine_times, "wall_minus_mono", lambda: reads.append(1) or 1000 * len(reads))
    assert engine_times.engine_offset_ns() == 1000
    mono[0] += engine_times.OFFSET_TTL_NS
    assert engine_times.engine_offset_ns() == 1000 and len(reads) == 1
    mono[0] += 1
    assert engine_times.engine_offset_ns() == 2000 and len(reads) == 2
    stats = SimpleNamespace(queued_ts=1.0)
    assert rq.phases_from_vllm(stats) == rq.EnginePhases(1_000_002_000)
