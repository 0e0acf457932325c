"""Stage 1: a file's bytes read once and decoded by its format, or the file left out and named."""

from __future__ import annotations

from ..files.sources import read_content
from ..formats import NotATrace, ReadContext, ReadResult, format_for
from ..formats.base import partner_of
from ..formats.base.chrome_json import gc_paused
from ..formats.partners import read_partner
from ..timeline.model import Problem
from ..transform.passes import IdentityMapper
from .counts import say_skipped
from .file import FileJob, JobRun
from .spec import Task


def read(f: FileJob, run: JobRun) -> bool:
    """Fill ``f.res``, ``f.events`` and ``f.mapper``; False: nothing of the file goes further (its
    outcome says why)."""
    task, out, path = f.task, f.out, f.url
    content = read_content(task.source)
    out.sha256, out.complete = content.sha256, content.complete
    if content.oversized or content.unreadable:  # a bomb, or a file gone unreadable: none of it
        out.skipped = True
        out.problems.append(
            Problem("oversized" if content.oversized else "unreadable", path, str(content.error))
        )
        return False
    if task.skip_lines and not content.error:
        content.data = without_lines(content.data, task.skip_lines)
    reader = format_for(task.kind)
    owner_pid = task.owner_key.pid if task.owner_key.pid >= 0 else None
    partner_url = task.partner.url if task.partner is not None else None
    ctx = ReadContext(
        path, task.source.name, task.anchor_ns, owner_pid, defer_times=f.fast, partner=partner_url
    )
    content_error = content.error
    try:
        with gc_paused():
            res = reader.read(content.data, ctx)
    except NotATrace as exc:
        out.skipped = True
        detail = f"{content_error}; nothing readable before the cut" if content_error else str(exc)
        out.problems.append(Problem("incomplete" if content_error else "not_a_trace", path, detail))
        return False
    del content
    out.complete = out.complete and res.complete
    out.anchor_ns, out.anchor_source, out.meta = res.anchor_ns, res.anchor_source, res.meta
    salvage = "; ".join(p.detail for p in res.problems if p.kind == "incomplete")
    if content_error:
        out.problems.append(
            Problem("incomplete", path, f"{content_error}; {salvage}" if salvage else content_error)
        )
    out.problems.extend(p for p in res.problems if not (p.kind == "incomplete" and content_error))
    if res.skip:
        out.skipped = True
        out.read = out.dropped = res.read - res.metadata
        say_skipped(out, path)
        return False
    f.res, f.events = res, res.events
    f.mapper = IdentityMapper(
        reader, res, ctx, task.host, task.owner_merged, task.owner_key, run.job.planned, task.fold_into_owner
    )
    return True


def without_lines(data: bytes, ranges: tuple[tuple[int, int], ...]) -> bytes:
    """``data`` less the byte ranges, each a run of whole lines (``MergeOptions.skip_lines``). A range
    that is not one (the file is not what the caller read: replaced, or not plain text) leaves
    ``data`` whole: skipping is only ever a saving, never a different answer."""
    keep, at = [], 0
    for start, end in sorted(ranges):
        if not (at <= start < end <= len(data)) or data[end - 1 : end] != b"\n":
            return data
        if start and data[start - 1 : start] != b"\n":
            return data
        keep.append(data[at:start])
        at = end
    keep.append(data[at:])
    return b"".join(keep)


def partner(task: Task) -> tuple[str, ReadResult] | None:
    """The file's partner in another job (a Torch trace's RL-Insight log), read here for its pairing
    events; None when it has none or it cannot be read (its own job says why)."""
    partner_kind = partner_of(format_for(task.kind))
    if task.partner is None or partner_kind is None:
        return None
    res = read_partner(task.partner, partner_kind)
    return (task.partner.url, res) if res is not None else None
