"""Helpers for tests of the capture writer: a drain process outlives its training process."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from .conftest import clean_env, run_python


def process_gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie waiting for init to reap it counts as exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True
    return state in ("Z", "X")


def wait_until(predicate: Callable[[], bool], timeout_s: float, poll_s: float = 0.02) -> bool:
    """Poll ``predicate`` until it holds or ``timeout_s`` passed; its last answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def traced(code: str, out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter that captures into ``out`` (and any ``env`` besides)."""
    return run_python(code, clean_env(RL_TRACE_OUTPUT_DIR=str(out), **env))
