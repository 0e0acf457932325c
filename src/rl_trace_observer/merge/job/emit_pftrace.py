"""The ``.pftrace`` emitter: a job's events as its own protobuf packet sequence (interning is per
sequence).

The bridge from the merge's :class:`..timeline.model.Event` structs to
:class:`..output.pftrace_fused.FusedWriter`, which encodes them as they are (no per-event dict). Times
reach the writer in ns relative to the job's base: the fused fast path makes them so; events from the
listed passes (absolute ns) are shifted here.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from ..output.compress import deflate_piece
from ..output.pftrace_fused import FusedWriter
from ..timeline.identity import process_title
from ..timeline.model import Event, Rebase

if TYPE_CHECKING:
    from ..transform.passes import IdentityMapper
    from .file import FileJob, JobRun
    from .spec import Job, Outcome

__all__ = ["PftraceEmitter"]


class PftraceEmitter:
    """Writes a job's events as its own protobuf sequence (interning is per sequence)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.buf = io.BytesIO()
        self.writer = FusedWriter(self.buf, base_ns=0, sequence_id=job.sequence_id)
        self.declared: set[int] = set()
        # an artifact whose events wait for more of its own (a rank report's linked scope flow starts)
        self._waiting: dict[int, tuple[list[Event], dict[Any, bool], set[Any]]] = {}

    def emit(self, f: FileJob, run: JobRun) -> None:
        """A file's kept events; a rank's report waits for its held flow starts (they bind to its
        slices)."""
        assert f.mapper is not None and f.ctx is not None
        self.add(f.kept, f.mapper, f.out, f.in_order, f.ctx.fanned, wait=f.wait)

    def add(
        self,
        events: list[Event],
        mapper: IdentityMapper,
        out: Outcome,
        in_order: dict[Any, bool] | None = None,
        fanned: set[Any] | None = None,
        wait: bool = False,
    ) -> None:
        """Write one artifact's kept events.

        ``in_order`` is None for events from the listed passes (absolute ns: shifted to the base here,
        every thread sorted); the fused fast path gives its events relative to the base, which threads
        are in order already and which flows can fan out (``fanned``). ``wait``: keep them until the
        next :meth:`add` for the same artifact (its held flow starts bind to its slices).
        """
        w = self.writer
        for pid, decl in sorted(mapper.processes.items()):
            if pid not in self.declared:
                self.declared.add(pid)
                w.process(pid, process_title(decl, self.job.titles), pid)
        for (pid, tid), th in sorted(mapper.threads.items()):
            w.thread(pid, tid, th.name, th.sort_index)
        if in_order is None:
            events = self._relative(events, out)
            in_order, fanned = {}, None
        waiting = self._waiting.pop(out.index, None)
        if waiting is not None:
            events = waiting[0] + events
            in_order = {**in_order, **waiting[1]}
            fanned = None if fanned is None else fanned | waiting[2]
        if wait:
            self._waiting[out.index] = (events, in_order, fanned or set())
            return
        w.write_events(events, in_order, fanned)

    def _relative(self, events: list[Event], out: Outcome) -> list[Event]:
        """Absolute ns → relative to the base; a start below it re-plans the base (:class:`Rebase`)."""
        base = self.job.base_ns
        if events:
            starts: list[Any] = [e.ts for e in events]
            lo, hi = min(starts), max(starts)
            out.min_ts, out.max_ts = lo, hi
            if lo < base:  # the writer cannot go below its base: re-plan it
                raise Rebase(lo)
            for e in events:
                e.ts -= base  # type: ignore[operator]
        return events

    def close(self, run: JobRun) -> None:
        """The job's packets as one piece (deflated for ``.pftrace.gz``: in the worker, in parallel)."""
        run.result.pieces, run.result.writer_stats = self.finish()

    def finish(self) -> tuple[list[Any], dict[str, Any]]:
        for events, in_order, fanned in self._waiting.values():
            self.writer.write_events(events, in_order, fanned)
        self._waiting.clear()
        stats = self.writer.close()
        data = self.buf.getvalue()
        piece: Any = deflate_piece(data) if self.job.out_format == "pftrace.gz" else data
        return [piece], {
            "slices": stats.slices,
            "instants": stats.instants,
            "counters": stats.counters,
            "dropped": dict(stats.dropped),
        }
