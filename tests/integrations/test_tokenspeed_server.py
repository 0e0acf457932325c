"""The launcher and the profile control against a running server, without VERL.

The server is the CPU stand-in ``tokenspeed serve`` (TokenSpeed's real control server and scheduler
profiler, :mod:`tests.tokenspeed_standin`), started by the product's own launcher: health wait,
``/start_profile`` refusals worded by TokenSpeed, a window's files waited for and registered.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rl_trace_observer import config as config_mod
from rl_trace_observer.capture import configure, reset
from rl_trace_observer.integrations.tokenspeed.http import ControlClient
from rl_trace_observer.integrations.tokenspeed.launcher import ServerProcess, ServeSpec, free_port, server_env
from rl_trace_observer.integrations.tokenspeed.profiling import ProfileControl

from ..conftest import ROOT, requires, run_python
from ..verl_e2e.assets import build_model, build_tokenizer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
STANDIN_PY = ROOT / ".venv-tokenspeed" / "bin" / "python"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    if not STANDIN_PY.exists():
        pytest.skip("no .venv-tokenspeed (run scripts/bootstrap.sh)")
    model = tmp_path_factory.mktemp("tiny-model")
    build_model(model, build_tokenizer(model))
    spec = ServeSpec(
        model=str(model),
        tp=2,
        port=free_port(),
        control_port=free_port(),
        host="127.0.0.1",
        command=[str(STANDIN_PY), "-m", "tests.tokenspeed_standin", "serve"],
        env={"PYTHONPATH": str(ROOT), **server_env(("VIZTRACER", "PROTON"), None)},
    )
    proc = ServerProcess(spec, "test_server")
    proc.start()
    client = ControlClient(f"http://127.0.0.1:{spec.control_port}")
    asyncio.run(proc.wait_healthy(client, 300))
    yield proc
    proc.terminate()
    assert not proc.alive


@pytest.fixture
def recorder(tmp_path: Path) -> Iterator[Any]:
    rec = configure(config_mod.load({"RL_TRACE_OUTPUT_DIR": str(tmp_path / "trace"), "RL_TRACE_RUN_ID": "t"}))
    yield rec
    reset()


def _control(server: ServerProcess, activities: tuple[str, ...]) -> ProfileControl:
    client = ControlClient(f"http://127.0.0.1:{server.spec.control_port}")
    return ProfileControl(client, replica=0, ranks=2, activities=activities, stall_timeout_s=60)


def test_a_refused_profile_is_one_warning_naming_tokenspeeds_reason(
    server: ServerProcess, recorder: Any, caplog: pytest.LogCaptureFixture
) -> None:
    control = _control(server, ("GPU", "PROTON"))

    async def twice() -> list[bool]:
        return [await control.start(3), await control.start(4)]

    with caplog.at_level(logging.WARNING, logger="rl_trace_observer"):
        assert asyncio.run(twice()) == [False, False]
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 1 and "PROTON cannot be combined with GPU" in lines[0], lines
    assert control.current is None


def test_a_window_is_collected_and_registered_per_rank(server: ServerProcess, recorder: Any) -> None:
    control = _control(server, ("VIZTRACER", "PROTON"))
    client = control.client

    async def window() -> Any:
        assert await control.start(7)
        assert not await control.start(7)  # one window at a time
        body = {"rid": "rid-1", "input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4}}
        status, reply = await client.post("/generate", body)
        assert status == 200 and reply["meta_info"]["id"] == "rid-1"
        await control.stop()
        assert await control.stop() is None  # stop without a window: nothing happens
        return await control.wait(120)

    (win,) = asyncio.run(window())
    assert (
        win.step == 7 and win.directory == recorder.output_dir / "tokenspeed" / "t" / "step-7" / "replica-0"
    )
    assert len(win.registered) == 4, win.registered
    assert recorder.flush()  # the records are rewritten by the drain, in order with the events
    records = [json.loads(p.read_text()) for p in recorder.output_dir.glob("rl-trace-process-*.json")]
    schedulers = [r for r in records if r.get("tokenspeed", {}).get("scheduler")]
    assert sorted(r["rank"] for r in schedulers) == [0, 1]
    for rec in schedulers:
        kinds = sorted(a["kind"] for a in rec["artifacts"])
        assert kinds == ["proton", "viztracer"] and all(a["step"] == 7 for a in rec["artifacts"])
        assert rec["tokenspeed"]["recorded_by_pid"] == os.getpid()
    control.close()


def test_a_server_that_exits_fails_with_its_log(tmp_path: Path) -> None:
    crash = [sys.executable, "-c", "import sys; print('no GPU here'); sys.exit(3)"]
    spec = ServeSpec(model="m", tp=1, port=free_port(), control_port=free_port(), command=crash)
    proc = ServerProcess(spec, "failing")
    proc.start()
    client = ControlClient(f"http://127.0.0.1:{spec.control_port}")
    with pytest.raises(RuntimeError, match=r"exited with code 3(.|\n)*no GPU here"):
        asyncio.run(proc.wait_healthy(client, 60))


def test_a_server_that_never_answers_times_out_and_is_stopped() -> None:
    spec = ServeSpec(model="m", tp=1, port=free_port(), control_port=free_port(),
                     command=[sys.executable, "-c", "import time; time.sleep(600)"])  # fmt: skip
    proc = ServerProcess(spec, "silent")
    proc.start()
    client = ControlClient(f"http://127.0.0.1:{spec.control_port}")
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="RL_TRACE_TOKENSPEED_STARTUP_TIMEOUT_S"):
        asyncio.run(proc.wait_healthy(client, 2))
    assert time.monotonic() - t0 < 30 and not proc.alive


def test_the_server_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """SIGKILL the launching process (as Ray kills actors): the server goes too (PDEATHSIG)."""
    pid_file = tmp_path / "server.pid"
    code = f"""
        import sys, time
        from rl_trace_observer.integrations.tokenspeed.launcher import ServerProcess, ServeSpec
        spec = ServeSpec(model="m", tp=1, port=1, control_port=2,
                         command=[sys.executable, "-c", "import time; time.sleep(600)"])
        p = ServerProcess(spec, "orphan"); p.start()
        open({str(pid_file)!r}, "w").write(str(p.proc.pid))
        time.sleep(600)
    """
    parent = subprocess.Popen([sys.executable, "-c", __import__("textwrap").dedent(code)], cwd=ROOT)
    for _ in range(100):
        if pid_file.exists() and pid_file.read_text():
            break
        time.sleep(0.1)
    child = int(pid_file.read_text())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(child, signal.SIGKILL)
    raise AssertionError("the server outlived the process that started it")


def test_importing_the_integration_is_light() -> None:
    code = """
        import json, sys
        import rl_trace_observer.integrations.tokenspeed.profiling
        import rl_trace_observer.integrations.tokenspeed.launcher
        heavy = ("torch", "verl", "ray", "tokenspeed")
        print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in heavy)))
    """
    assert json.loads(run_python(code, dict(os.environ)).stdout) == []


@requires("verl")
def test_verl_finds_the_tokenspeed_rollout_through_its_registries() -> None:
    """What ``main_ppo`` does with ``rollout.name=tokenspeed`` once our plugin registered it."""
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import get_rollout_replica_class

    from rl_trace_observer.integrations.verl import contract, tokenspeed_rollout

    tokenspeed_rollout.install(trainer_hooks=False)  # the registration only; idempotent
    assert tokenspeed_rollout.registered()
    assert get_rollout_replica_class("tokenspeed").__name__ == "TokenSpeedReplica"
    assert get_rollout_class("tokenspeed", "async").__name__ == "TokenSpeedServerAdapter"
    assert [contract.problem(s) for s in tokenspeed_rollout.REGISTRIES + tokenspeed_rollout.PROFILE_STEP] == [
        None
    ] * 8
