"""Process records → process identities, and the artifacts each record registered.

A record names its artifacts by path relative to its own directory. Those paths are resolved
against the files we were given and nothing else: a path that leaves the record's directory
(``../../etc/passwd``) or is absent is reported (``outside_inputs`` / ``missing``), never opened.
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING, Any

from ..formats import format_for, format_of
from ..formats.base import ProcessRecords
from ..timeline.model import Problem, ProcessInfo

if TYPE_CHECKING:
    from .plan import Plan, PlannedArtifact


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def is_record(kind: str) -> bool:
    """A process record (its format says so), read while planning."""
    fmt = format_of(kind)
    return isinstance(fmt, ProcessRecords)


def link_records(plan: Plan) -> None:
    by_path = {(a.source.protocol, a.source.path): a for a in plan.artifacts}
    for rec_art in plan.artifacts:
        record = rec_art.record_entry
        if not is_record(rec_art.info.kind) or record is None or rec_art.info.owner is None:
            continue
        owner = plan.processes[rec_art.info.owner]
        folder = posixpath.dirname(rec_art.source.path)
        fmt = format_for(rec_art.info.kind)
        assert isinstance(fmt, ProcessRecords)
        for entry in fmt.registered(record):
            raw = str(entry["path"])
            target = posixpath.normpath(raw if raw.startswith("/") else posixpath.join(folder, raw))
            art = by_path.get((rec_art.source.protocol, target))
            if art is None:
                # an optional file may not be written yet; one outside the output dir is still named
                # (AReaL's fileroot elsewhere): the user must pass its folder as an input
                if not entry.get("optional") or entry.get("outside_output_dir"):
                    _report_absent(plan, rec_art.info.path, raw, folder, target, entry)
                continue
            if is_record(art.info.kind):
                continue
            art.info.owner = owner.key
            art.record_entry = entry
            _apply_entry(art, entry, owner)


def _report_absent(
    plan: Plan, record_path: str, raw: str, folder: str, target: str, entry: dict[str, Any]
) -> None:
    escapes = raw.startswith("/") or not (target + "/").startswith(folder.rstrip("/") + "/")
    if escapes and not entry.get("outside_output_dir"):
        plan.problems.append(
            Problem("outside_inputs", record_path, f"registers {raw!r}, outside its directory: not read")
        )
    elif escapes:
        plan.problems.append(
            Problem(
                "outside_inputs",
                record_path,
                f"registers {raw!r} outside the output dir: pass it as an input",
            )
        )
    else:
        plan.problems.append(
            Problem("missing", record_path, f"registers {raw!r}, which is not among the inputs")
        )


def _apply_entry(art: PlannedArtifact, entry: dict[str, Any], owner: ProcessInfo) -> None:
    info = art.info
    step = _opt_int(entry.get("step"))
    info.step = step if step is not None else info.step
    info.role = _opt_str(entry.get("role")) or info.role or owner.role
    rank = _opt_int(entry.get("rank"))
    info.rank = rank if rank is not None else (info.rank if info.rank is not None else owner.rank)
    anchor = _opt_int(entry.get("anchor_ns"))
    if anchor is not None:
        info.anchor_ns, info.anchor_source = anchor, "process record"


def apply_record(art: PlannedArtifact, owner: ProcessInfo) -> None:
    """For a file linked by (host, pid) only: take role and rank from its process."""
    if art.info.role is None:
        art.info.role = owner.role
    if art.info.rank is None:
        art.info.rank = owner.rank
