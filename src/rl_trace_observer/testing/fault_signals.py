"""A fault scenario of its own: a capture drain ended by a signal while it writes the backlog a
frozen disk left (issue 34: Ray or ``kill`` ending an orphaned drain), on a real loop-mounted ext4.
The loop and the disk readers are :mod:`.fault_runs`."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from .fault_runs import Traced, _gone, _started, read_out, wait_gone
from .loopfs import LoopFS


def _log_bytes(out: Path) -> int:
    return sum(p.stat().st_size for p in out.glob("rl-insight-*.chrome.jsonl"))


def signal_after_thaw(
    fs: LoopFS, rate: float, sig: int, delay_s: float, freeze_s: float = 4.0
) -> dict[str, Any]:
    """A backlog gathers while the disk is frozen, the process exits (its drain goes on), the disk
    thaws, and ``delay_s`` after the file starts growing again the drain gets ``sig`` — while it
    writes the backlog, as an orphan reaper or ``kill`` would end it. What is on disk then, and what
    its record says."""
    out = fs.mount / "out"
    loop = Traced(out, rate)
    try:
        _started(out)
        drain = loop.ask("report").get("drain")
        with fs.frozen_for():
            time.sleep(freeze_s)
            exit_s = loop.exit(10.0)
            before = _log_bytes(out)
        deadline = time.monotonic() + 5.0  # the signal comes once the backlog is being written
        while _log_bytes(out) == before and not _gone(drain) and time.monotonic() < deadline:
            time.sleep(0.0002)
        time.sleep(delay_s)
        signalled = drain is not None and not _gone(drain)
        if signalled:
            assert drain is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(drain, sig)
        settled = wait_gone(drain, 60)
        disk = read_out(out)
        records = [json.loads(p.read_text()) for p in out.glob("rl-trace-process-*.json")]
        logs = sorted(out.glob("rl-insight-*.chrome.jsonl"))
        return {
            "exit_s": exit_s,
            "signalled": signalled,
            "settled": settled,
            "lines_handed": loop.last.get("lines"),
            "disk": disk,
            "ends_with_newline": all(p.read_bytes().endswith(b"\n") for p in logs if p.stat().st_size),
            "record_events": records[0].get("events") if records else None,
        }
    finally:
        loop.close()
