"""Stage 5: a file's kept events handed to each emitter, once per file (never per event).

The emitters of a job, in the order they run: the span rows (``--shards``), then exactly one output
emitter — Chrome JSON pieces (:class:`JsonEmitter`) or the job's own ``.pftrace`` packet sequence
(:class:`.emit_pftrace.PftraceEmitter`). Span rows go first because the ``.pftrace`` emitter moves
absolute times to its base in place. An emitter's :meth:`close` runs once, after the job's last file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..output import chrome_json
from .emit_pftrace import PftraceEmitter
from .file import Emitter, FileJob, JobRun
from .spec import Job

if TYPE_CHECKING:
    from ..shards.sink import ShardSink


class JsonEmitter:
    """Chrome JSON: comma-terminated pieces (deflated for ``.json.gz``) appended to the job's result."""

    def __init__(self, job: Job) -> None:
        self.base_ns, self.gzip = job.base_ns, job.out_format == "json.gz"

    def emit(self, f: FileJob, run: JobRun) -> None:
        if f.fast:  # times are output µs already
            pieces, _, _ = chrome_json.encode_pieces(f.kept, self.base_ns, self.gzip, convert=False)
        else:
            pieces, lo, hi = chrome_json.encode_pieces(f.kept, self.base_ns, self.gzip)
            if f.kept:
                f.out.min_ts, f.out.max_ts = lo, hi
        run.result.pieces.extend(pieces)

    def close(self, run: JobRun) -> None:
        return None


class ShardEmitter:
    """Span rows of exactly what the output emitter gets (``--shards``; pyarrow, imported only then)."""

    def __init__(self, sink: ShardSink) -> None:
        self.sink = sink

    def emit(self, f: FileJob, run: JobRun) -> None:
        assert f.mapper is not None
        self.sink.add(f.kept, f.task, f.mapper, f.relative_to, f.unit_ns, f.far)

    def close(self, run: JobRun) -> None:
        run.result.shards = self.sink.close()


def emitters_for(job: Job) -> list[Emitter]:
    """The job's emitters, in the order they run."""
    found: list[Emitter] = []
    if job.shards is not None:
        from ..shards.sink import ShardSink

        found.append(ShardEmitter(ShardSink(job.shards, job.sequence_id)))
    found.append(PftraceEmitter(job) if job.out_format.startswith("pftrace") else JsonEmitter(job))
    return found


def emit(f: FileJob, run: JobRun) -> None:
    """Hand the file to every emitter. From here on its events reach the output: a failure is the
    merge's, not the file's alone."""
    f.out.emitted = True
    for emitter in run.emitters:
        emitter.emit(f, run)


__all__ = ["Emitter", "JsonEmitter", "PftraceEmitter", "ShardEmitter", "emit", "emitters_for"]
