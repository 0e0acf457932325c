"""The driver's last step: the jobs' stored pieces, in plan order, stitched into the one output.

Exactly what :func:`rl_trace_observer.merge.run.execute.run_all` does with pieces that come from
local worker processes, so the bytes are the same: the JSON header or nothing, every job's piece in
sequence order (deflate pieces joined into ONE gzip member, CRC combined), the process/thread names
or the clock packet last. Pieces are hard-linked out of the store before the stitcher consumes (and
deletes) them, so the store keeps them for a re-run until the merge is complete.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..capture.atomic import atomic_output
from ..merge.files.spill import Spilled
from ..merge.files.writeback import WritebackFile
from ..merge.run.execute import RunState, close_output, fold, open_output, trace_header
from ..merge.run.jobs import Job
from .node import JobDone
from .store import Store

if TYPE_CHECKING:
    from ..merge.pipeline.clock import ClockChoice
    from ..merge.plan.plan import Plan


class NothingKept(Exception):
    """No job kept an event: the output is not replaced (``state`` still says what was read)."""

    def __init__(self, state: RunState) -> None:
        super().__init__("nothing kept")
        self.state = state


@dataclass
class Assembled:
    state: RunState
    missing: list[Job] = field(default_factory=list)  # planned jobs with no result (their node failed)


def _linked(store: Store, key: str, done: JobDone) -> Spilled:
    """A throw-away name for the stored piece: the stitcher deletes what it copied."""
    src = store.piece(key)
    link = src.with_name(f".{src.name}.{os.getpid()}.out")
    link.unlink(missing_ok=True)
    try:
        os.link(src, link)
    except OSError:  # no hard links here: copy
        link.write_bytes(src.read_bytes())
    return Spilled(str(link), done.piece_size, done.deflated)


def assemble(
    out: Path,
    fmt: str,
    plan: Plan,
    clock: ClockChoice,
    base: int,
    jobs: list[tuple[Job, str]],
    results: dict[str, JobDone],
    store: Store,
) -> Assembled:
    state = RunState(base, titles=clock.titles(plan), header=trace_header(base, clock))
    done = Assembled(state)
    present = [
        (job, key, results[key]) for job, key in jobs if key in results and results[key].result is not None
    ]
    done.missing = [job for job, key in jobs if key not in results or results[key].result is None]
    if not any(o.kept for _, _, d in present for o in d.result.outcomes):  # type: ignore[union-attr]
        for _, _, d in present:
            fold(state, d.result)  # type: ignore[arg-type]
        raise NothingKept(state)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(out) as raw:
        f = WritebackFile(raw)
        writer = open_output(f, fmt, base, clock)
        for _, key, d in present:
            assert d.result is not None
            fold(state, d.result)
            writer.add([_linked(store, key, d)] if d.piece_size else [])
        close_output(writer, state, clock)
        f.flush()
    state.output_size, state.written = out.stat().st_size, True
    return done
