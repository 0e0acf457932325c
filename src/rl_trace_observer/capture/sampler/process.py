"""The sampler process: win the node's election, describe itself, sample until it should leave.

It is a capture process like any other — it has a process record (role ``sampler``) that names
its samples file as an artifact, and its lines go through the capture writer (its own drain) —
but it never joins the election it won. When it leaves (:mod:`.lifetime`) it says why in its log
and in the samples file's ``stop`` line — also when it is ended by SIGTERM, SIGINT or SIGHUP (the
reason is the signal's name; :mod:`..ending`). A file without a ``stop`` line was ended by SIGKILL
(or a crash).
"""

from __future__ import annotations

import fcntl
import logging
import os
import sys
import threading
from pathlib import Path

from ... import config as config_mod
from .. import identity
from ..ending import Ending
from . import node
from .lifetime import NORMAL_END, Lifetime
from .loop import Sampler, run
from .sink import open_sink
from .wire import SAMPLES_NAME

log = logging.getLogger("rl_trace_observer")


def main(argv: list[str]) -> int:
    node.mark_sampler_process()
    ending = Ending().install()  # SIGTERM & co.: a stop line naming it, then the normal way out
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    if len(argv) != 1:
        print("usage: python -m rl_trace_observer.capture.sampler OUTPUT_DIR", file=sys.stderr)
        return 2
    output_dir = Path(argv[0])
    cfg = config_mod.load()
    if cfg.output_dir is None:  # started by hand: the argument is the output directory
        cfg = config_mod.load({**os.environ, "RL_TRACE_OUTPUT_DIR": str(output_dir)})
    folder = node.node_dir(output_dir, cfg)
    election = node._open_lock(folder / node.SAMPLER)
    if not node.try_lock(election, fcntl.LOCK_EX):
        return 0  # another sampler won the race
    if (folder / node.LEFT).exists():
        # Started before a sampler left because the output directory went (a member's re-check
        # can launch one while the last is still running): winning the election after it must
        # not begin sampling into the directory the writers recreate.
        return 0
    members = node._open_lock(folder / node.MEMBERS)
    host = identity.hostname()
    path = output_dir / SAMPLES_NAME.format(host=host, pid=os.getpid())
    sink = open_sink(path, cfg)
    _describe(cfg, path)
    sampler = Sampler(cfg, output_dir, sink, host=host)
    threading.Thread(
        target=_wake_on, args=(ending, sampler), name="rl-trace-sampler-end", daemon=True
    ).start()
    lifetime = Lifetime(folder, output_dir, members, ending)
    try:
        reason = run(sampler, lifetime)
        if reason != NORMAL_END:
            log.warning("[rl-trace-observer] sampler pid %s leaves: %s", os.getpid(), reason)
        if lifetime.output_gone():
            node.mark_left(folder, reason)  # no member starts another one for this directory
    finally:
        lifetime.close()
        sampler.close()
        sink.close(5.0)
        fcntl.flock(election, fcntl.LOCK_UN)  # still holding members.lock when nobody holds it: see node
    return 0


def _wake_on(ending: Ending, sampler: Sampler) -> None:
    """Cut the sampler's sleep short once an ending signal came (it then writes its stop line)."""
    ending.event.wait()
    sampler.wake.set()


def _describe(cfg: config_mod.Config, path: Path) -> None:
    """This process's record: role ``sampler``, its samples file as an artifact; never raises."""
    try:
        from ..recorder import configure

        rec = configure(cfg)
        if rec is not None:
            rec.update_identity(role="sampler")
            rec.register_artifact(path, "metric_samples")
    except Exception as exc:
        log.warning("[rl-trace-observer] sampler: no process record: %s", exc)
