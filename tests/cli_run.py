"""``rl-trace ARGS`` in a fresh interpreter, as a user runs it, with a clean environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .conftest import ROOT, clean_env


def rl_trace(*args: str, timeout: float = 180, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rl_trace_observer.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env(),
        cwd=cwd,
    )
