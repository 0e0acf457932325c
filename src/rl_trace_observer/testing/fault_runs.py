"""Fault scenarios against a traced training loop (:mod:`.capture_load`) on a real file system
(:mod:`.loopfs`): a frozen mount, exit and SIGKILL while frozen, a disk that fills and frees, an
output directory removed or replaced, a read-only one, a buffer cap reached during a freeze.

Each scenario returns plain figures (what a test asserts and the benchmark prints). ``src``
runs the loop against another checkout's ``src`` (the benchmark's "before" column); the loop's
own file is always this one.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from . import capture_load
from .loopfs import LoopFS

PASS_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV")


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def wait_gone(pid: int | None, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while pid is not None and not _gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def threads(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return None


class ChildDied(RuntimeError):
    """The traced loop exited while an answer was awaited; the message holds its stderr."""


class Traced:
    """The training loop in a child process, driven over its stdin/stdout (never the disk).

    Every wait for an answer also watches the child: one that dies (at start, say, for a missing
    module) raises :class:`ChildDied` with its exit status and stderr at once, not after the wait's
    timeout."""

    def __init__(self, out: Path, rate: float, src: str | None = None, **env: str) -> None:
        full = {k: v for k, v in os.environ.items() if k in PASS_ENV}
        # no metric sampler (on by default with capture): these runs measure the writer alone, and a
        # sampler would write onto the test's mount from a process the harness does not own
        full.update(
            RL_TRACE_OUTPUT_DIR=str(out),
            RL_INSIGHT_SERVER_URL="local://rl-trace-observer",
            RL_TRACE_METRICS="0",
        )
        full.update(env)
        if src:
            full["PYTHONPATH"] = src
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close()); not on the mount
        code = f"import runpy; runpy.run_path({capture_load.__file__!r}, run_name='__main__')"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, "--rate", str(rate)],
            env=full,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            cwd="/",
        )
        self._answers: queue.Queue[dict[str, Any]] = queue.Queue()
        self.drain: int | None = None  # the loop's drain process, once an answer named it
        self.errors: list[str] = []  # exceptions the loop's observer calls raised (none expected)
        self._reader_done = threading.Event()  # the child's stdout ended (it exited or closed it)
        threading.Thread(target=self._read, daemon=True).start()
        self.last: dict[str, Any] = {}
        try:
            ready = self._answer(120)
        except BaseException:
            self.close(drain_wait_s=0)
            raise
        assert "ready" in ready, ready

    def _answer(self, timeout_s: float) -> dict[str, Any]:
        """The next answer; ``queue.Empty`` after ``timeout_s``, :class:`ChildDied` as soon as the
        child is gone with nothing left to read (answers it wrote before dying are still returned)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self._answers.get(timeout=min(0.05, max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                pass
            if self.proc.poll() is not None:  # gone: what it wrote before is read within a second
                self._reader_done.wait(1.0)
                if self._answers.empty():
                    raise ChildDied(
                        f"the traced loop exited with status {self.proc.returncode}; its stderr:\n"
                        + self.stderr_text(tail=8192)
                    )
                continue
            if time.monotonic() >= deadline:
                raise queue.Empty

    def stderr_text(self, tail: int | None = None) -> str:
        """What the child wrote to stderr so far (its last ``tail`` characters when given)."""
        try:
            self.stderr.seek(0)
            text = self.stderr.read().decode(errors="replace")
            return text[-tail:] if tail else text
        except ValueError:  # closed
            return "(stderr closed)"

    def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            for line in self.proc.stdout:
                with contextlib.suppress(ValueError):
                    answer = json.loads(line)
                    if "error" in answer:
                        self.errors.append(answer["error"])
                    else:
                        self.drain = answer.get("drain") or self.drain
                        self._answers.put(answer)
        finally:
            self._reader_done.set()

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()

    def ask(self, command: str, timeout_s: float = 60) -> dict[str, Any]:
        self.send(command)
        self.last = self._answer(timeout_s)
        return self.last

    def exit(self, timeout_s: float) -> float | None:
        """Ask the loop to stop; seconds until the process was gone, None if still alive then."""
        t0 = time.monotonic()
        self.send("exit")
        with contextlib.suppress(queue.Empty, ChildDied):  # its exit is what was asked for
            self.last = self._answer(timeout_s)
        try:
            self.proc.wait(max(0.0, timeout_s - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            return None
        return time.monotonic() - t0

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def warnings(self) -> list[str]:
        return [ln for ln in self.stderr_text().splitlines() if "rl-trace-observer" in ln]

    def close(self, drain_wait_s: float = 30.0) -> None:
        """End the loop, and its drain if it has not finished by then: a scenario that failed must
        not leave a drain writing into a mount point the fixture is about to unmount."""
        if self.proc.poll() is None:
            self.kill()
        self.stderr.close()
        if self.drain is not None and not wait_gone(self.drain, drain_wait_s):
            with contextlib.suppress(OSError):
                if b"capture.drain" in Path(f"/proc/{self.drain}/cmdline").read_bytes():  # still ours
                    os.kill(self.drain, signal.SIGKILL)


# --------------------------------------------------------------------------- what is on disk
def read_out(out: Path) -> dict[str, Any]:
    """The event log(s) and process record in ``out``: lines, parse errors, spans' seq numbers."""
    logs = sorted(out.glob("rl-insight-*.chrome.jsonl")) if out.exists() else []
    lines, bad, seqs, first, names = 0, 0, [], None, 0
    for log in logs:
        for raw in log.read_bytes().splitlines():
            lines += 1
            try:
                ev = json.loads(raw)
            except ValueError:
                bad += 1
                continue
            first = ev if first is None else first
            names += ev.get("ph") == "M"
            if ev.get("ph") == "X" and ev.get("name") == "actor_update":
                seqs.append(ev["args"].get("seq"))
    records = [json.loads(p.read_text()) for p in out.glob("rl-trace-process-*.json")] if out.exists() else []
    events = records[0].get("events") if records else None
    in_order = seqs == sorted(seqs)
    return {
        "logs": len(logs),
        "lines": lines,
        "bad_lines": bad,
        "spans": len(seqs),
        "seq_in_order": in_order,
        "seq_contiguous": in_order and seqs == list(range(seqs[0], seqs[0] + len(seqs))) if seqs else True,
        "max_seq": max(seqs) if seqs else -1,
        "contiguous_prefix": next((i for i, q in enumerate(seqs) if q != i), len(seqs)),
        "first_is_lane_name": bool(first and first.get("ph") == "M"),
        "lane_names": names,
        "record_events": events,
    }


def _started(out: Path, timeout_s: float = 60) -> None:
    """Wait until the loop's event log exists (its drain is up), then one more second of load."""
    deadline = time.monotonic() + timeout_s
    while not list(out.glob("rl-insight-*.chrome.jsonl")) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)


def _settle(loop: Traced, timeout_s: float = 60) -> bool:
    """Wait for the loop's drain (if any) to finish after the loop exited."""
    return wait_gone(loop.last.get("drain"), timeout_s)


# --------------------------------------------------------------------------- scenarios
def freeze(
    fs: LoopFS,
    rate: float,
    freeze_s: float = 3.0,
    src: str | None = None,
    *,
    control: bool = False,
    **env: str,
) -> dict[str, Any]:
    """``control``: the very same run, commands and windows, with the disk NOT frozen (an A/A run:
    its "frozen" window against its "unfaulted" one is the noise floor of that comparison)."""
    out = fs.mount / "out"
    loop = Traced(out, rate, src, **env)
    drain_rss = None
    try:
        _started(out)  # warm-up: the drain is up, lanes exist
        loop.send("window unfaulted")
        time.sleep(freeze_s)  # as long as the freeze: the same number of samples per percentile
        loop.send("specials unfaulted")
        time.sleep(0.2)
        loop.send("window frozen")
        time.sleep(0.05)
        with contextlib.nullcontext() if control else fs.frozen_for():
            thaw_at = time.monotonic() + freeze_s
            time.sleep(1.0)
            loop.send("specials frozen")  # 1 s in: a call that waits on the disk waits ~2 s
            time.sleep(1.0)
            with contextlib.suppress(queue.Empty):  # a loop blocked on the disk does not answer
                drain = loop.ask("report", timeout_s=0.5).get("drain")
                drain_rss = rss_mib(drain) if drain else None
            time.sleep(max(0.0, thaw_at - time.monotonic()))
            loop.send("window after")
        time.sleep(1.0)
        exit_s = loop.exit(60)
        settled = _settle(loop)
        disk = read_out(out)
        return {
            "windows": loop.last.get("windows", {}),
            "lines_handed": loop.last.get("lines"),
            "seq": loop.last.get("seq"),
            "exit_s": exit_s,
            "settled": settled,
            "disk": disk,
            "drain_rss_mib_frozen": drain_rss,
            "warnings": loop.warnings(),
            "errors": loop.errors,
            "expected_frozen_calls": int(rate * freeze_s),
            "control": control,
        }
    finally:
        loop.close()


def exit_while_frozen(fs: LoopFS, rate: float, src: str | None = None) -> dict[str, Any]:
    out = fs.mount / "out"
    loop = Traced(out, rate, src)
    try:
        _started(out)
        with fs.frozen_for():
            time.sleep(0.5)
            exit_s = loop.exit(10.0)
            alive_after_10s = exit_s is None
            thaw_at = time.monotonic()
        after_thaw = None
        if alive_after_10s:
            loop.proc.wait(60)
            after_thaw = time.monotonic() - thaw_at
        settled = _settle(loop)
        disk = read_out(out)
        return {
            "exit_s": exit_s,
            "exit_after_thaw_s": after_thaw,
            "settled": settled,
            "lines_handed": loop.last.get("lines"),
            "seq": loop.last.get("seq"),
            "disk": disk,
        }
    finally:
        loop.close()


def kill_while_frozen(fs: LoopFS, rate: float, src: str | None = None) -> dict[str, Any]:
    out = fs.mount / "out"
    loop = Traced(out, rate, src)
    try:
        _started(out)
        with fs.frozen_for():
            time.sleep(1.0)
            try:
                report = loop.ask("report", timeout_s=3)
            except queue.Empty:  # the loop itself is blocked on the disk
                report = {}
            loop.kill()
            killed_at = time.monotonic()
        settled = wait_gone(report.get("drain"), 60)
        disk = read_out(out)
        return {
            "seq_reported_before_kill": report.get("seq"),
            "settled": settled,
            "settle_s": time.monotonic() - killed_at,
            "disk": disk,
        }
    finally:
        loop.close()


def full_disk(fs: LoopFS, rate: float, cycles: int = 5, src: str | None = None) -> dict[str, Any]:
    out = fs.mount / "out"
    loop = Traced(out, rate, src)
    try:
        _started(out)
        for _ in range(cycles):
            fs.fill(leave_bytes=16 << 10)
            time.sleep(0.6)
            fs.free()
            time.sleep(0.4)
        exit_s = loop.exit(60)
        settled = _settle(loop)
        disk = read_out(out)
        return {
            "exit_s": exit_s,
            "settled": settled,
            "lines_handed": loop.last.get("lines"),
            "disk": disk,
            "warnings": loop.warnings(),
        }
    finally:
        fs.free()
        loop.close()


def removed(base: Path, rate: float, *, replace: bool = False, src: str | None = None) -> dict[str, Any]:
    out = base / "out"
    loop = Traced(out, rate, src)
    try:
        _started(out)
        before = read_out(out)
        if replace:
            os.rename(out, base / "out.old")
            out.mkdir()
        else:
            subprocess.run(["rm", "-rf", str(out)], check=True)
        t0 = time.monotonic()
        detected = None
        while time.monotonic() - t0 < 10:
            if list(out.glob("rl-insight-*.chrome.jsonl")):
                detected = time.monotonic() - t0
                break
            time.sleep(0.02)
        time.sleep(1.0)
        exit_s = loop.exit(60)
        settled = _settle(loop)
        disk = read_out(out)
        return {
            "lines_before": before["lines"],
            "new_file_after_s": detected,
            "exit_s": exit_s,
            "settled": settled,
            "lines_handed": loop.last.get("lines"),
            "disk": disk,
            "warnings": loop.warnings(),
        }
    finally:
        loop.close()


def read_only(fs: LoopFS, rate: float, src: str | None = None) -> dict[str, Any]:
    out = fs.mount / "out"
    out.mkdir(exist_ok=True)
    fs.remount(read_only=True)
    try:
        loop = Traced(out, rate, src)
        try:
            time.sleep(1.5)
            deadline = time.monotonic() + 30  # a loaded machine: the drain may take seconds to start
            while True:
                counts = loop.ask("counts")
                settled = counts["written"] + counts["dropped"] >= counts["lines"]
                if settled or time.monotonic() > deadline:
                    break
            exit_s = loop.exit(30)
            return {
                "exit_s": exit_s,
                "counts": counts,
                "returncode": loop.proc.returncode,
                "lines_handed": loop.last.get("lines"),
                "warnings": loop.warnings(),
                "files": len(list(out.iterdir())),
            }
        finally:
            loop.close()
    finally:
        fs.remount(read_only=False)


def drain_stopped(fs: LoopFS, rate: float, stop_s: float = 3.0, src: str | None = None) -> dict[str, Any]:
    """The drain SIGSTOPped for ``stop_s`` (a drain starved of CPU, at its extreme): the one case
    where the pipe fills and the pump holds a backlog. Windows ``unfaulted``, ``stopped``, ``after``."""
    out = fs.mount / "out"
    loop = Traced(out, rate, src)
    drain = None
    try:
        _started(out)
        drain = loop.ask("report").get("drain")
        loop.send("window unfaulted")
        time.sleep(stop_s)
        loop.send("window stopped")
        time.sleep(0.05)
        if drain is not None:
            os.kill(drain, signal.SIGSTOP)
        try:
            time.sleep(stop_s)
        finally:
            if drain is not None:
                os.kill(drain, signal.SIGCONT)
        loop.send("window after")
        time.sleep(2.0)
        exit_s = loop.exit(60)
        settled = _settle(loop)
        return {
            "windows": loop.last.get("windows", {}),
            "lines_handed": loop.last.get("lines"),
            "exit_s": exit_s,
            "settled": settled,
            "disk": read_out(out),
        }
    finally:
        if drain is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(drain, signal.SIGCONT)
        loop.close()
