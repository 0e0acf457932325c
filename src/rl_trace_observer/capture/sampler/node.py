"""One sampler per node and run: who starts it, how it knows when to stop, how it learns targets.

Everything lives in a node-local folder, :func:`node_dir` (``RL_TRACE_METRICS_NODE_DIR``, by default
under the temp dir, keyed by the output directory), never on the output disk: a lock on NFS is
unreliable and a stat there may hang.

- ``members/<pid>``: every capture process that joins writes its pid's start time here first, then
- ``members.lock``: holds a SHARED ``flock`` on it for its whole life (the kernel drops it when the
  process dies, even by SIGKILL). The sampler exits once it can take it EXCLUSIVELY: nobody it
  samples for is left. A lock can outlive its members (a forked child that never recorded anything
  keeps its parent's lock; so would any process that somehow shares the descriptor, the sampler
  included), so the sampler also exits when no process listed in ``members/`` is alive (checked
  twice, a second apart; :func:`members_alive`).
- ``sampler.lock``: the sampler holds it EXCLUSIVELY for its life. A member that finds it free
  (after it holds its shared lock) starts a sampler; two racing starters are fine — the second
  sampler cannot take the lock and exits at once.
- The sampler releases ``sampler.lock`` only while holding ``members.lock`` exclusively (when it
  leaves because the lock is free), so a process that joins while the sampler is leaving either waits
  for its shared lock (and then finds the sampler gone and starts one) or was already a member (and
  the sampler stays); a member's re-check every :data:`RECHECK_S` repairs every other case (a killed
  sampler, one that left because its members were gone or its output directory was removed).
- ``targets/<pid>-<n>.json``: Prometheus targets registered by processes on this node (one file per
  registration, written atomically); the sampler rescans the folder when its mtime changes.
- ``profiling/<pid>``: present while that process runs a profiled step (the sampler then samples
  every ``RL_TRACE_METRICS_PROFILED_INTERVAL_S``); a flag of a dead pid is ignored.
- ``left``: a sampler left because the output directory was removed or replaced; members start no
  other sampler for it, and a sampler launched before that note (a member's re-check can launch one
  while the last is still running) exits on seeing it even when it wins the election. The first
  member of a later run (one that finds no other member: it can take ``members.lock`` exclusively)
  removes the note.

Nothing here runs on a training thread but a dict update and an ``Event.set``: joining, handing
over targets and profiling flags (all file operations, if only on the node's temp dir) happen on
one daemon thread per process (:class:`_Agent`); locks are taken with ``LOCK_NB``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from ...common.atomic import write_atomic
from ...common.encoding import dumps_line
from ..ending import start_detached

log = logging.getLogger("rl_trace_observer")

MEMBERS = "members.lock"
MEMBER_PIDS = "members"
SAMPLER = "sampler.lock"
LEFT = "left"  # written by a sampler that left because its output directory was removed or replaced
TARGETS = "targets"
PROFILING = "profiling"
RECHECK_S = 5.0
SAMPLER_MODULE = "rl_trace_observer.capture.sampler"


def node_root(config: Any = None) -> Path:
    """``RL_TRACE_METRICS_NODE_DIR``, else ``<temp dir>/rl-trace-observer-<uid>``."""
    if config is None:
        from ... import config as config_mod

        config = config_mod.load()
    root = getattr(config, "metrics_node_dir", None)
    return (
        Path(root) if root is not None else Path(tempfile.gettempdir()) / f"rl-trace-observer-{os.getuid()}"
    )


def node_dir(output_dir: Path, config: Any = None) -> Path:
    """The node-local folder of the run writing into ``output_dir`` (same on every process of it)."""
    key = hashlib.sha1(os.path.abspath(output_dir).encode()).hexdigest()[:16]
    return node_root(config) / key


def _open_lock(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)


def try_lock(fd: int, kind: int) -> bool:
    """``flock(fd, kind | LOCK_NB)``: True when taken, False when someone else holds it."""
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise


def sampler_running(folder: Path) -> bool:
    """Whether a sampler holds this node's election lock right now (creates nothing)."""
    try:
        fd = os.open(folder / SAMPLER, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        if try_lock(fd, fcntl.LOCK_EX):
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        return True
    finally:
        os.close(fd)


def wait_for_sampler(output_dir: Path, timeout_s: float, config: Any = None) -> bool:
    """Wait until this node's sampler (if any) has written its last sample and exited.

    For tools that read the output right after training (the demo, tests): the sampler notices
    that its last member left within one interval and then flushes. True when none is running.
    """
    import time

    folder = node_dir(output_dir, config)
    deadline = time.monotonic() + timeout_s
    while sampler_running(folder):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


# ------------------------------------------------------------------------ who is alive
def start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (``/proc/<pid>/stat`` field 22), telling a live member
    from a later process that reuses its pid; ``""`` where there is no ``/proc``; None: no such pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return None if os.path.isdir("/proc/self") else ("" if _alive(pid) else None)
    except OSError:
        return ""
    fields = stat.rsplit(b")", 1)[-1].split()
    return fields[19].decode() if len(fields) > 19 else ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def members_alive(folder: Path, *, but: int | None = None) -> bool:
    """Whether any process listed in ``members/`` (other than ``but``: the sampler) is alive and the
    same process that wrote its entry; entries of dead processes are removed."""
    where = folder / MEMBER_PIDS
    try:
        names = os.listdir(where)
    except OSError:
        return False
    live = False
    for name in names:
        if not name.isdigit() or int(name) == but:
            continue
        try:
            written = (where / name).read_text().strip()
        except OSError:
            continue
        now = start_time(int(name))
        if now is not None and (not written or not now or now == written):
            live = True
        else:
            with contextlib.suppress(OSError):
                os.unlink(where / name)
    return live


# ------------------------------------------------------------------ training processes
_state: dict[str, Any] = {"agent": None, "stay_out": False, "seq": 0}
_lock = threading.Lock()


class _Agent:
    """This process's side of the node's sampler, on one daemon thread: membership (re-checked
    every :data:`RECHECK_S`, starting a sampler when none runs), targets and profiling flags handed
    over as soon as they are asked for. Training threads only put work here and wake it."""

    def __init__(self, output_dir: Path, config: Any, run_id: str | None) -> None:
        self.output_dir, self.config, self.run_id = output_dir, config, run_id
        self.folder: Path | None = None  # found on the agent thread (the temp dir is probed there)
        self.pid = os.getpid()
        self.members_fd: int | None = None
        self.targets: list[list[dict[str, Any]]] = []
        self.profiling: bool | None = None  # the flag state still to write (None: nothing to do)
        self.wake = threading.Event()
        self.io = threading.Lock()  # held by the agent thread around its file operations
        self.stopped = False
        self._warned = False
        self.thread = threading.Thread(target=self._loop, name="rl-trace-sampler-join", daemon=True)

    def _loop(self) -> None:
        while not self.stopped and self.pid == os.getpid():
            try:
                if self.folder is None:
                    self.folder = node_dir(self.output_dir, self.config)
                self._once(self.folder)
            except Exception as exc:  # a node without a usable temp dir: no sampler, training untouched
                if not self._warned:
                    log.warning("[rl-trace-observer] pid %s: metric sampler not started: %s", self.pid, exc)
                    self._warned = True
            self.wake.wait(RECHECK_S)
            self.wake.clear()

    def _once(self, folder: Path) -> None:
        with _lock:
            targets, self.targets = self.targets, []
            flag, self.profiling = self.profiling, None
        with self.io:  # stop() waits for a round in progress: no lock is taken after it
            if self.stopped:
                return
            for batch in targets:
                _write_targets(folder, batch)
            if flag is not None:
                _write_flag(folder, flag)
            if self.members_fd is None:
                _register(folder)  # listed before locking: a lock holder is always listed
                fd = _open_lock(folder / MEMBERS)
                if try_lock(fd, fcntl.LOCK_EX):  # the only member: a new run into this directory
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(folder / LEFT)  # an earlier run's note must not keep it unsampled
                    fcntl.flock(fd, fcntl.LOCK_UN)
                if not try_lock(fd, fcntl.LOCK_SH):  # the sampler is leaving: join after it left
                    os.close(fd)
                    return
                self.members_fd = fd
            if not sampler_running(folder) and not (folder / LEFT).exists():
                start_sampler(folder, self.output_dir, self.run_id)

    def stop(self) -> None:
        """Leave: no longer listed, lock released (waits for a round in progress; tools only)."""
        self.stopped = True
        self.wake.set()
        with self.io:
            fd, self.members_fd = self.members_fd, None
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
            if self.folder is not None:
                with contextlib.suppress(OSError):
                    os.unlink(self.folder / MEMBER_PIDS / str(self.pid))


def _register(folder: Path) -> None:
    pid = os.getpid()
    (folder / MEMBER_PIDS).mkdir(parents=True, exist_ok=True)
    write_atomic(folder / MEMBER_PIDS / str(pid), (start_time(pid) or "").encode())


def _write_targets(folder: Path, targets: list[dict[str, Any]]) -> None:
    (folder / TARGETS).mkdir(parents=True, exist_ok=True)
    with _lock:
        _state["seq"] += 1
        seq = _state["seq"]
    write_atomic(folder / TARGETS / f"{os.getpid()}-{seq}.json", dumps_line(targets))


def _write_flag(folder: Path, on: bool) -> None:
    flag = folder / PROFILING / str(os.getpid())
    if on:
        flag.parent.mkdir(parents=True, exist_ok=True)
        flag.touch()
    else:
        with contextlib.suppress(FileNotFoundError):
            flag.unlink()


def stay_out() -> None:
    """This process never joins a node's sampler nor starts one, whatever its configs say: the
    sampler process itself, and a test runner whose in-process tests configure recorders (it would
    otherwise be a member, keeping a sampler alive, for as long as it runs)."""
    _state["stay_out"] = True


def mark_left(folder: Path, reason: str) -> None:
    """A sampler left because its output directory was removed or replaced: no member starts
    another one for this directory (that would write into the directory the writers recreate)."""
    with contextlib.suppress(OSError):
        write_atomic(folder / LEFT, reason.encode())


def mark_sampler_process() -> None:
    """Called first thing in the sampler process: it must never join or start a sampler itself."""
    stay_out()


def _agent() -> _Agent | None:
    agent: _Agent | None = _state["agent"]
    return agent if agent is not None and agent.pid == os.getpid() and not agent.stopped else None


def join(config: Any, *, run_id: str | None = None) -> None:
    """Make this process a member of its node's sampler (on the agent thread); never raises.

    ``config`` is the process's :class:`~rl_trace_observer.config.Config`; nothing happens with
    capture off, ``RL_TRACE_METRICS=0``, or in a process that stays out (:func:`stay_out`: the
    sampler process itself). ``run_id``: this
    process's run (a sampler it starts records the same one, e.g. a Ray job id it could not see).
    """
    if _state["stay_out"] or config.output_dir is None or not config.metrics:
        return
    with _lock:
        if _agent() is not None:
            return
        agent = _state["agent"] = _Agent(Path(config.output_dir), config, run_id)
    agent.thread.start()


def leave() -> None:
    """Stop being a member (tools that capture for a while, then go on: the demo's driver)."""
    with _lock:
        agent, _state["agent"] = _agent(), None
    if agent is not None:
        agent.stop()


def start_sampler(folder: Path, output_dir: Path, run_id: str | None = None) -> None:
    """Start a sampler process for this node, output to a node-local log. Detached (its own
    session, nobody's direct child: :mod:`..ending`): Ray SIGKILLs a worker's direct children when
    the worker exits, and the sampler must outlive the member that happened to start it."""
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["RL_TRACE_OUTPUT_DIR"] = str(output_dir)
    env["RL_TRACE_METRICS_NODE_DIR"] = str(folder.parent)  # the same folder, whatever the env said
    if run_id and not env.get("RL_TRACE_RUN_ID"):
        env["RL_TRACE_RUN_ID"] = run_id
    with open(folder / "sampler.log", "ab") as logf:
        launcher = start_detached(
            [sys.executable, "-m", SAMPLER_MODULE, str(output_dir)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=logf,
            close_fds=True,
            cwd="/",
        )
    with contextlib.suppress(subprocess.TimeoutExpired):
        launcher.wait(5.0)  # the sh exits within milliseconds (on the agent thread, never a training one)


def _after_fork_in_child() -> None:
    # The child shares the parent's shared lock (one open file description) while it lives; it is
    # a member of its own (listed, own agent) once it records something: its first recorder joins.
    global _lock
    _lock = threading.Lock()
    _state["agent"] = None


os.register_at_fork(after_in_child=_after_fork_in_child)


# -------------------------------------------------------------------- targets, profiling
def publish_targets(targets: list[dict[str, Any]]) -> None:
    """Hand one registration (a list of targets) to this node's sampler: written by this process's
    agent thread, never on the caller's. Nothing happens in a process that is no member (capture
    off, ``RL_TRACE_METRICS=0``): its record keeps the targets all the same."""
    with _lock:
        agent = _agent()
        if agent is None:
            return
        agent.targets.append(list(targets))
    agent.wake.set()


def mark_profiling(on: bool) -> None:
    """Tell this node's sampler that a profiled step runs in this process (or ended); never raises,
    never touches a file on the calling thread. Nothing happens in a process that is no member
    (capture off, ``RL_TRACE_METRICS=0``)."""
    with _lock:
        agent = _agent()
        if agent is None:
            return
        agent.profiling = on
    agent.wake.set()


def profiling_now(folder: Path) -> bool:
    """Whether any live process on this node runs a profiled step (flags of dead pids are removed)."""
    try:
        names = os.listdir(folder / PROFILING)
    except OSError:
        return False
    live = False
    for name in names:
        if name.isdigit() and _alive(int(name)):
            live = True
        else:
            with contextlib.suppress(OSError):
                os.unlink(folder / PROFILING / name)
    return live
