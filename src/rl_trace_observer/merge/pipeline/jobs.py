"""The plan cut into jobs: what each job reads (its tasks) and everything decided for it.

A job is one file, or the files that must be read together (a TokenSpeed rank's report and Proton
files: their formats' ``rank_role``). Jobs are ordered by their estimated decompressed size, largest
first, so the slowest starts early; that order is the output's order, so every executor plans the jobs
with the same estimates (a Ray merge's come from the nodes that hold the files).
"""

from __future__ import annotations

import os
import posixpath
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..files.sources import Source, decompressed_size
from ..formats import format_for
from ..formats.base import partner_of, rank_role_of
from ..job.spec import Job, Task
from ..plan.plan import Plan, PlannedArtifact

if TYPE_CHECKING:
    from ..options import MergeOptions
    from .clock import ClockChoice


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
    estimate = estimate or decompressed_size
    index = {id(a): i for i, a in enumerate(plan.artifacts)}
    planned = {k: p.merged_pid for k, p in plan.processes.items()}
    titles = clock.titles(plan)  # process labels, with each host's clock correction
    units = _units(plan)
    partners = _partners(plan)
    jobs = []
    for n, unit in enumerate(units):
        tasks = [_task(index[id(a)], a, plan, clock) for a in unit]
        if opts.skip_lines and windows:
            for task in tasks:
                if task.source.local:
                    task.skip_lines = opts.skip_lines.get(os.path.realpath(task.source.path), ())
        for task, art in zip(tasks, unit, strict=True):
            partner_kind = partner_of(format_for(art.info.kind))
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
        if rank_role_of(format_for(art.info.kind)) is not None and art.hints.group:
            groups.setdefault((posixpath.dirname(art.source.path), art.hints.group), []).append(art)
        else:
            singles.append([art])
    return singles + [sorted(g, key=lambda a: a.source.path) for g in groups.values()]


def _partners(plan: Plan) -> dict[tuple[Any, str], Source]:
    """(owner process, kind) → its first file of that kind: what a format with a partner in its
    process (``AlignsOnPartner.partner``: a Torch trace on its RL-Insight log) aligns on. That file is
    read again inside each such job (a few MB, against ~100 MB of Torch trace): the jobs stay small
    enough to run side by side, and each job's output stays what it was."""
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
        fold_into_owner=bool(art.record_entry and art.record_entry.get("engine_of_owner")),
    )
