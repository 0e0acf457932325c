"""A job from its first file to its result: each file through the stages, forward, then the held
flow starts, then the emitters closed and the output spilled.

At most one file's events are alive at a time in a worker: they are emitted and released before the
next file of the job is read.
"""

from __future__ import annotations

from ..formats.base.chrome_json import gc_paused
from ..formats.partners import JobLinks
from ..output import spill
from ..timeline.model import Rebase
from ..transform.outliers import SpreadOut
from . import memory
from .align import align
from .counts import account, add_held, file_failed
from .emit import emit, emitters_for
from .file import FileJob, JobRun
from .passes import transform
from .read import read
from .spec import Job, JobResult, Outcome, Task

_in_worker = False  # set in the merge's own worker processes (see init_worker)


def init_worker() -> None:
    """Pool initializer: page reuse between files (see :mod:`.memory`)."""
    global _in_worker
    _in_worker = True
    memory.tune_allocator()


def run_job(job: Job) -> JobResult:
    """Run one job with the garbage collector paused: a job allocates millions of objects that live
    until it ends (events, flow chains), and collections passing over them cost ~10-20 % of the job."""
    with gc_paused():
        return _run(job)


def _run(job: Job) -> JobResult:
    links = JobLinks(job.tasks)
    run = JobRun(job, links, JobResult([], {}, {}, []), emitters_for(job), in_worker=_in_worker)
    parts = _Parts(job)
    for task in links.order(job.tasks):
        fast = not job.windows and job.min_dur_ns <= 0 and task.correction.fn is None
        try:
            try:
                _one_file(task, fast, run)
            except SpreadOut:  # times too far apart for the fused loop to judge: the listed passes do
                run.result.outcomes.pop()
                _one_file(task, False, run)
        except (Rebase, SpreadOut):
            raise
        except Exception as exc:  # one file's content broke a stage: that file is left out, named
            file_failed(run.result, task, exc)
        parts.spill(run)
    if run.held:
        for f in run.held:
            _held_flows(f, run)
        run.held.clear()
        parts.spill(run)
    for emitter in run.emitters:
        emitter.close(run)
    parts.spill(run)
    parts.finish(run)
    return run.result


def _one_file(task: Task, fast: bool, run: JobRun) -> None:
    """Read → align → passes → counts → emit, for one file."""
    out = Outcome(task.index)
    run.result.outcomes.append(out)
    f = FileJob(task, out, fast, run.job.base_ns)
    if not read(f, run):
        return
    align(f, run)
    transform(f, run)
    # the fused path's report waits for its held flow starts (they bind to its slices in one write);
    # the listed path wrote them apart, and its bytes are kept as they were
    f.wait = f.fast and bool(f.hold)
    account(f, run)
    emit(f, run)
    assert f.ctx is not None and f.res is not None
    if f.hold:
        run.links.held(f.url, f.hold, f.res)
        run.held.append(f)
    if f.ctx.collect_scopes:
        run.links.collected(f.ctx.scopes)
    if run.in_worker:
        memory.keep_arenas(f.events)


def _held_flows(f: FileJob, run: JobRun) -> None:
    """A rank report's held flow starts, now linked to the rank's Proton scopes, into its outcome."""
    import dataclasses

    assert f.res is not None and f.hold is not None
    res = dataclasses.replace(
        f.res, events=f.hold, read=0, metadata=0, dropped=0, dropped_why={}, problems=[]
    )
    sub = FileJob(f.task, Outcome(f.out.index), f.fast, f.job_base_ns, res=res, mapper=f.mapper)
    sub.events, sub.correction = f.hold, f.task.correction
    transform(sub, run)
    account(sub, run)
    emit(sub, run)
    add_held(f.out, sub.out, f.url)


class _Parts:
    """In a worker process, outputs go to the job's part file instead of the pipe (:mod:`..output.spill`)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.size = 0
        self.deflated: list[tuple[int, int]] = []  # (crc32, length) of each spilled deflate piece

    def spill(self, run: JobRun) -> None:
        result = run.result
        if not (run.in_worker and self.job.spill_path and result.pieces):
            return
        self.size += spill.append(self.job.spill_path, result.pieces, self.size == 0, self.deflated)
        result.pieces.clear()

    def finish(self, run: JobRun) -> None:
        if self.size:
            assert self.job.spill_path is not None
            run.result.pieces = [spill.Spilled(self.job.spill_path, self.size, tuple(self.deflated))]
