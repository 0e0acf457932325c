"""Start ``tokenspeed serve`` for one replica, wait until it answers, and make it die with us.

The command is ``RL_TRACE_TOKENSPEED_COMMAND`` (default: this interpreter with ``-m tokenspeed.cli
serve``) + the flags below + ``RL_TRACE_TOKENSPEED_ARGS``. ``ts serve`` routes ``--control-port``
to its orchestrator, ``--host/--port`` to the smg gateway and the other ``ServerArgs`` flags to
the engine (``ts:cli/_argsplit.py``). The control server (``--control-port``) is where every
request of ours goes: it proxies ``/generate`` and ``/start_profile`` to the gateway and the RL
routes to the engine's RL control app.

Lifetime: the server runs in its own session (so its scheduler children can be signalled as a
group) with ``PR_SET_PDEATHSIG`` = SIGTERM, so it goes when the Ray actor that started it dies,
even by SIGKILL; a normal actor exit terminates the group first.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .http import ControlClient

log = logging.getLogger("rl_trace_observer")

PROTON_ENV = {  # Proton's output must be a timed trace in Chrome format to be merged (§1.4 of the facts)
    "TOKENSPEED_KERNEL_PROFILE_DATA": "trace",
    "TOKENSPEED_KERNEL_PROFILE_OUTPUT_FORMAT": "chrome_trace",
}
_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def default_command() -> list[str]:
    return [sys.executable, "-m", "tokenspeed.cli", "serve"]


@dataclass
class ServeSpec:
    """What one replica's server needs; :meth:`argv` is the full command line."""

    model: str
    tp: int
    port: int
    control_port: int
    host: str = "0.0.0.0"
    dtype: str | None = None
    gpu_memory_utilization: float | None = None
    max_num_seqs: int | None = None
    max_model_len: int | None = None
    enforce_eager: bool = False
    trust_remote_code: bool = False
    memory_saver: bool = True
    command: Sequence[str] = ()
    extra_args: Sequence[str] = ()
    env: dict[str, str] = field(default_factory=dict)

    def argv(self) -> list[str]:
        cmd = list(self.command) or default_command()
        cmd += ["--model", self.model, "--tp", str(self.tp), "--host", self.host, "--port", str(self.port)]
        cmd += ["--control-port", str(self.control_port), "--enable-output-logprobs"]
        if self.dtype:
            cmd += ["--dtype", self.dtype]
        if self.gpu_memory_utilization is not None:
            cmd += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.max_num_seqs:
            cmd += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.max_model_len:
            cmd += ["--max-model-len", str(self.max_model_len)]
        if self.memory_saver:
            cmd.append("--enable-memory-saver")
        if self.enforce_eager:
            cmd.append("--enforce-eager")
        if self.trust_remote_code:
            cmd.append("--trust-remote-code")
        return cmd + list(self.extra_args)


def _load_prctl() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # resolved here: nothing is loaded after fork
    except Exception:
        return None  # not Linux: the atexit hook still terminates the server on a normal exit


_PRCTL = _load_prctl()


def _child_setup() -> None:  # runs in the child between fork and exec: one system call, no allocation
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


class ServerProcess:
    """One running ``tokenspeed serve``; its output goes to a log file named in every error."""

    def __init__(self, spec: ServeSpec, name: str) -> None:
        self.spec = spec
        self.name = name
        log_dir = Path(tempfile.gettempdir()) / "rl-trace-tokenspeed"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{name}-{os.getpid()}-{int(time.time())}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, **self.spec.env}
        argv = self.spec.argv()
        with open(self.log_path, "ab") as out:
            out.write(f"$ {shlex.join(argv)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(  # the user's configured command
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=_child_setup,
            )  # fmt: skip
        atexit.register(self.terminate)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    async def wait_healthy(self, client: ControlClient, timeout_s: float) -> None:
        """Poll ``/health`` on the control port until 200; fail fast when the server exits."""
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.alive:
                code = self.proc.returncode if self.proc is not None else None
                raise RuntimeError(
                    f"tokenspeed serve for {self.name} exited with code {code} before it became "
                    f"healthy; its log is {self.log_path}:\n{self.tail()}"
                )
            with contextlib.suppress(Exception):
                status, _ = await client.request("GET", "/health", timeout_s=5)
                if status == 200:
                    return
            if time.monotonic() > deadline:
                self.terminate()
                raise TimeoutError(
                    f"tokenspeed serve for {self.name} did not answer /health on port "
                    f"{self.spec.control_port} within {timeout_s:g} s "
                    f"(RL_TRACE_TOKENSPEED_STARTUP_TIMEOUT_S); its log is {self.log_path}:\n{self.tail()}"
                )
            await asyncio.sleep(0.5)

    def terminate(self, grace_s: float = 10.0) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


def server_env(activities: Sequence[str], cuda_visible_devices: str | None) -> dict[str, Any]:
    """The server's extra environment: its GPUs, and Proton's Chrome-trace output when profiled."""
    env: dict[str, str] = {}
    if cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    if "PROTON" in activities:
        for key, value in PROTON_ENV.items():
            env[key] = os.environ.get(key, value)
        if os.environ.get("TOKENSPEED_KERNEL_PROFILE", "") not in ("", "0"):
            log.warning(
                "[rl-trace-observer] TOKENSPEED_KERNEL_PROFILE is set: TokenSpeed starts a Proton "
                "session at import and refuses /start_profile with PROTON; unset it"
            )
    return env
