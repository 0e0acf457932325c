"""Running the planned jobs on worker processes and streaming their bytes into the output.

Why processes, and why this shape: parsing is CPU-bound Python, so the GIL rules out threads;
each job parses, rewrites and serialises (and, for ``.json.gz``, deflates) its file inside the
worker, so the parent only concatenates bytes. Results are consumed in job order with a bounded
window, sized by an estimate of each file's decompressed bytes, so memory never grows with the
number or total size of the inputs — at most a couple of files' events are alive at once.
"""

from __future__ import annotations

import multiprocessing
import posixpath
import secrets
import struct
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...capture.atomic import atomic_output
from ..files import spill
from ..files.compress import GzipMember, write_any_piece
from ..files.sources import GZIP_MAGIC, Source
from ..files.writeback import WritebackFile
from ..formats import format_for
from ..plan.plan import Plan, PlannedArtifact
from ..timeline.identity import ProcessDecl, ThreadDecl, process_title
from ..timeline.model import Rebase
from ..writers.chrome_json import ChromeJsonWriter, metadata_events
from .jobs import Job, JobResult, Outcome, Task
from .worker import init_worker, run_job

if TYPE_CHECKING:
    from ..options import MergeOptions
    from ..pipeline.clock import ClockChoice

INLINE_BYTES = 24 << 20  # below this much input, worker start-up costs more than it saves
INFLIGHT_BYTES = 256 << 20  # estimated decompressed input being parsed at once (all workers)
TRACE_SCHEMA = "rl-trace-merge/1"


class NothingUsable(Exception):
    """No event of any input survived: the output is not replaced (an earlier good one stays)."""

    def __init__(self, state: RunState) -> None:
        super().__init__("nothing usable")
        self.state = state


@dataclass
class RunState:
    base_ns: int
    outcomes: dict[int, Outcome] = field(default_factory=dict)
    processes: dict[int, ProcessDecl] = field(default_factory=dict)
    threads: dict[tuple[int, int], ThreadDecl] = field(default_factory=dict)
    titles: dict[int, str] = field(default_factory=dict)
    output_size: int = 0
    written: bool = False
    writer_stats: dict[str, Any] = field(default_factory=dict)
    shard_parts: list[dict[str, Any]] = field(default_factory=list)  # span shard parts (..shards)
    header: dict[str, Any] = field(default_factory=dict)  # the JSON output's header (trace_header)


def _estimate(src: Source) -> int:
    """Decompressed size: a gzip file's trailer holds it (mod 4 GiB); else the stored size."""
    try:
        with src.open() as f:
            if f.read(2) != GZIP_MAGIC or src.size < 18:
                return src.size
            f.seek(src.size - 4)
            isize = int(struct.unpack("<I", f.read(4))[0])
            return max(isize, src.size)
    except Exception:
        return src.size * 8


def build_jobs(
    plan: Plan,
    clock: ClockChoice,
    fmt: str,
    base: int,
    windows: Any,
    opts: MergeOptions,
    estimate: Callable[[Source], int] | None = None,
) -> list[Job]:
    """``estimate``: a file's decompressed size where the file is not readable here (a Ray merge's node
    files: their node measured it); it orders the jobs, so both ways must agree."""
    estimate = estimate or _estimate
    index = {id(a): i for i, a in enumerate(plan.artifacts)}
    planned = {k: p.merged_pid for k, p in plan.processes.items()}
    titles = clock.titles(plan)  # process labels, with each host's clock correction
    units = _units(plan)
    partners = _partners(plan)
    jobs = []
    for n, unit in enumerate(units):
        tasks = [_task(index[id(a)], a, plan, clock) for a in unit]
        for task, art in zip(tasks, unit, strict=True):
            partner_kind = format_for(art.info.kind).partner
            if partner_kind is not None:
                task.partner = partners.get((art.info.owner, partner_kind))
        weight = sum(estimate(a.source) for a in unit)
        jobs.append(
            Job(
                tasks=tasks,
                base_ns=base,
                out_format=fmt,
                planned=planned,
                titles=titles if fmt.startswith("pftrace") else {},
                windows=windows,
                min_dur_ns=int(opts.min_duration_us * 1000),
                scope_namespace=len(plan.artifacts) + n + 1,
                weight=weight,
                clock_mode=opts.clock_mode,
                clock_tolerance_ns=int(opts.clock_tolerance_us * 1000),
            )
        )
    jobs.sort(key=lambda j: (-j.weight, j.tasks[0].source.path))
    for seq, job in enumerate(jobs, start=1):
        job.sequence_id = seq
    if opts.shards:
        from ..shards.spec import spec_for

        spec = spec_for(plan, opts.shards, secrets.token_hex(4))
        for job in jobs:
            job.shards = spec
    return jobs


def _units(plan: Plan) -> list[list[PlannedArtifact]]:
    """Artifacts merged together in one job: a TokenSpeed rank's files (``rank_role``:
    :mod:`..formats.proton.pairing`); every other artifact alone."""
    groups: dict[tuple[str, str], list[PlannedArtifact]] = {}
    singles: list[list[PlannedArtifact]] = []
    for art in plan.selected():
        if format_for(art.info.kind).rank_role is not None and art.hints.group:
            groups.setdefault((posixpath.dirname(art.source.path), art.hints.group), []).append(art)
        else:
            singles.append([art])
    return singles + [sorted(g, key=lambda a: a.source.path) for g in groups.values()]


def _partners(plan: Plan) -> dict[tuple[Any, str], Source]:
    """(owner process, kind) → its first file of that kind: what a format with a partner in its process
    (``Format.partner``: a Torch trace on its RL-Insight log) aligns on. That file is read again inside
    each such job (a few MB, against ~100 MB of Torch trace): the jobs stay small enough to run side
    by side, and each job's output stays what it was."""
    out: dict[tuple[Any, str], Source] = {}
    for art in plan.selected():
        if art.info.owner is not None:
            out.setdefault((art.info.owner, art.info.kind), art.source)
    return out


def _task(i: int, art: PlannedArtifact, plan: Plan, clock: ClockChoice) -> Task:
    owner = plan.processes[art.info.owner] if art.info.owner else None
    assert owner is not None, f"{art.info.path}: planned without an owner"
    return Task(
        index=i,
        source=art.source,
        kind=art.info.kind,
        host=owner.key.host,
        owner_key=owner.key,
        owner_merged=owner.merged_pid,
        anchor_ns=art.info.anchor_ns,
        namespace=i + 1,
        correction=clock.correction_for(owner.key),
    )


def _results(jobs: list[Job], workers: int, auto: bool, progress: Any) -> Iterator[JobResult]:
    total = sum(j.weight for j in jobs) or 1
    done = 0
    if workers <= 0 or len(jobs) <= 1 or (auto and total < INLINE_BYTES):
        for job in jobs:
            res = run_job(job)
            done += job.weight
            if progress:
                progress(done, total)
            yield res
        return
    methods = multiprocessing.get_all_start_methods()
    mp = multiprocessing.get_context("fork" if "fork" in methods else None)
    with mp.Pool(workers, initializer=init_worker) as pool:
        pending: deque[tuple[Job, Any]] = deque()
        queue = deque(jobs)
        inflight = 0
        while queue or pending:
            while (
                queue
                and len(pending) < workers + 1
                and (not pending or inflight + queue[0].weight <= INFLIGHT_BYTES)
            ):
                job = queue.popleft()
                pending.append((job, pool.apply_async(run_job, (job,))))
                inflight += job.weight
            job, fut = pending.popleft()
            res = fut.get()
            inflight -= job.weight
            done += job.weight
            if progress:
                progress(done, total)
            yield res


def run_all(
    plan: Plan, clock: ClockChoice, fmt: str, out: Path, base: int, windows: Any, opts: MergeOptions
) -> RunState:
    from ..options import default_workers

    jobs = build_jobs(plan, clock, fmt, base, windows, opts)
    for job in jobs:  # outputs come back through part files, not the pipe (see ..writers.spill)
        job.spill_path = spill.part_path(out, job.sequence_id)
    workers = default_workers() if opts.workers is None else opts.workers
    state = RunState(base, titles=clock.titles(plan), header=trace_header(base, clock))
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_output(out) as raw:
            f = WritebackFile(raw)  # written back as it goes: the final fsync has little left
            writer = _writer(f, fmt, base, clock)
            kept = 0
            for res in _results(jobs, workers, opts.workers is None, opts.progress):
                lows = [o.min_ts for o in res.outcomes if o.min_ts is not None]
                if lows and min(lows) < base:
                    raise Rebase(min(lows))
                fold(state, res)
                kept += sum(o.kept for o in res.outcomes)
                writer.add(res.pieces)
            if not kept:
                raise NothingUsable(state)
            close_output(writer, state, clock)
            f.flush()
    except BaseException:
        spill.remove_parts(out)
        raise
    state.output_size, state.written = out.stat().st_size, True
    return state


class PacketsOut:
    """``.pftrace`` / ``.pftrace.gz``: the jobs' packet sequences one after the other (one gzip member)."""

    def __init__(self, out: Any, gzip: bool) -> None:
        self._out = out
        self._gz = GzipMember(out) if gzip else None

    def add(self, pieces: list[Any]) -> None:
        for piece in pieces:
            write_any_piece(self._out, self._gz, piece)

    def close(self, tail: bytes) -> None:
        if self._gz is None:
            self._out.write(tail)
        else:
            self._gz.write(tail)
            self._gz.close()


def trace_header(base: int, clock: ClockChoice) -> dict[str, Any]:
    """The Chrome JSON output's ``rl_trace_observer`` header (also kept with span shards)."""
    return {
        "schema": TRACE_SCHEMA,
        "base_ns": base,
        "clock": clock.section.get("mode", "wall"),
        "clock_alignment": clock.trace_metadata(),  # method, worst uncertainty, reference
    }


def close_output(writer: ChromeJsonWriter | PacketsOut, state: RunState, clock: ClockChoice) -> None:
    """The output's last bytes: process/thread names (JSON), the clock statement (protobuf)."""
    if isinstance(writer, ChromeJsonWriter):
        writer.close(_metadata(state))
    else:  # packets are self-contained; the clock statement is one more
        writer.close(clock.pftrace_metadata())


def fold(state: RunState, res: JobResult) -> None:
    """A finished job's identities, outcomes, shard parts and writer counts into the run's state."""
    _collect(state, res)
    state.shard_parts.extend(res.shards)
    _add_stats(state.writer_stats, res.writer_stats)  # the protobuf writer's counts


def open_output(f: Any, fmt: str, base: int, clock: ClockChoice) -> ChromeJsonWriter | PacketsOut:
    """The writer that stitches job pieces into the output (its header first)."""
    return _writer(f, fmt, base, clock)


def _writer(f: Any, fmt: str, base: int, clock: ClockChoice) -> ChromeJsonWriter | PacketsOut:
    if fmt.startswith("pftrace"):
        return PacketsOut(f, gzip=fmt.endswith(".gz"))
    return ChromeJsonWriter(f, gzip=fmt == "json.gz", header=trace_header(base, clock))


def _collect(state: RunState, res: JobResult) -> None:
    for o in res.outcomes:
        state.outcomes[o.index] = o
    for pid, decl in res.processes.items():
        state.processes.setdefault(pid, decl)
    for key, th in res.threads.items():
        state.threads.setdefault(key, th)


def _add_stats(total: dict[str, Any], part: dict[str, Any]) -> None:
    for key, value in part.items():
        if isinstance(value, dict):
            _add_stats(total.setdefault(key, {}), value)
        else:
            total[key] = total.get(key, 0) + value


def _metadata(state: RunState) -> list[dict[str, Any]]:
    procs = [(pid, process_title(d, state.titles), pid) for pid, d in sorted(state.processes.items())]
    threads = [(t.merged_pid, t.merged_tid, t.name, t.sort_index) for _, t in sorted(state.threads.items())]
    return metadata_events(procs, threads)
