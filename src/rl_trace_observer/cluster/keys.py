"""Where each planned job runs, what it is called, and how it is handed to its node.

A job's key is a digest of everything that decides its output bytes: its files (node, path, size,
mtime), its place and identities in the plan (namespaces, merged pids, the process titles, the
sequence id), the clock corrections, the timeline base, the selection and the output format. Two
runs that plan the same job give it the same key, which is how a re-run finds what is done.
"""

from __future__ import annotations

import copy
import hashlib
import pickle
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from .. import __version__
from ..merge.files.sources import Source
from ..merge.formats import format_for
from ..merge.formats.base import AlignsOnPartner
from ..merge.job.spec import Job, Task
from .node import NodeJob, local_source

KEY_VERSION = 1


@dataclass(frozen=True)
class Placement:
    """Where a planned (virtual) source really is: a node, its output directory, the file below it."""

    node_id: str
    label: str
    root: str
    rel: str
    size: int
    mtime_ns: int

    def source(self) -> Source:
        return local_source(self.root, self.rel, self.label, self.size)


def _task_view(t: Task, where: Mapping[str, Placement]) -> tuple[Any, ...]:
    def file(src: Source | None) -> Any:
        if src is None:
            return None
        p = where.get(src.url)
        return (src.url, p.size, p.mtime_ns) if p is not None else (src.url, src.size)

    return (
        t.index,
        file(t.source),
        t.kind,
        t.host,
        t.owner_key,
        t.owner_merged,
        t.anchor_ns,
        t.namespace,
        t.correction,
        file(t.partner),
    )


def job_key(job: Job, where: Mapping[str, Placement], shards: bool) -> str:
    spec = job.shards
    shard_view = None
    if shards and spec is not None:
        shard_view = (sorted(spec.processes.items()), spec.windows, sorted(spec.task_steps.items()))
    view = (
        KEY_VERSION,
        __version__,
        [_task_view(t, where) for t in job.tasks],
        job.base_ns,
        job.out_format,
        sorted(job.planned.items()),
        sorted(job.titles.items()),
        job.windows,
        job.min_dur_ns,
        job.scope_namespace,
        job.sequence_id,
        job.clock_mode,
        job.clock_tolerance_ns,
        shard_view,
    )
    return hashlib.sha256(pickle.dumps(view, protocol=4)).hexdigest()[:24]


def node_of(job: Job, where: Mapping[str, Placement]) -> str | None:
    """The node that holds the job's files (a job's files are one process's, or one TokenSpeed
    rank's: one host); None when a file's node is unknown."""
    nodes = Counter(where[t.source.url].node_id for t in job.tasks if t.source.url in where)
    if len(nodes) != 1 or sum(nodes.values()) != len(job.tasks):
        return None
    return next(iter(nodes))


def for_node(key: str, job: Job, where: Mapping[str, Placement]) -> tuple[NodeJob, list[str]]:
    """The job as its node runs it: every source opened on the node, the span shards tagged with the
    key. Returns notes about what the node cannot do (a partner file on another node)."""
    notes: list[str] = []
    local = copy.copy(job)
    node = node_of(job, where)
    tasks = []
    for t in job.tasks:
        partner = t.partner
        if partner is not None:
            p = where.get(partner.url)
            if p is None or p.node_id != node:
                fmt = format_for(t.kind)
                label = fmt.partner_label if isinstance(fmt, AlignsOnPartner) else "partner file"
                notes.append(f"{t.source.url}: its {label} {partner.url} is on another node: not aligned")
                partner = None
            else:
                partner = p.source()
        tasks.append(replace(t, source=where[t.source.url].source(), partner=partner))
    local.tasks = tasks
    if job.shards is not None:
        local.shards = replace(job.shards, tag=key)
    return NodeJob(key, local), notes
