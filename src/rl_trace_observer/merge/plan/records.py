"""Process records → process identities, and the artifacts each record registered.

A record names its artifacts by path relative to its own directory. Those paths are resolved
against the files we were given and nothing else: a path that leaves the record's directory
(``../../etc/passwd``) or is absent is reported (``outside_inputs`` / ``missing``), never opened.
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING, Any

from ...capture.recorder import expected_event_log
from ..timeline.model import Problem, ProcessInfo, ProcessKey

if TYPE_CHECKING:
    from .plan import Plan, PlannedArtifact


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def process_from_record(record: dict[str, Any], path: str) -> ProcessInfo:
    raw_ray = record.get("ray")
    ray: dict[str, Any] = raw_ray if isinstance(raw_ray, dict) else {}
    return ProcessInfo(
        key=ProcessKey(str(record["hostname"]), int(record["pid"])),
        role=_opt_str(record.get("role")),
        rank=_opt_int(record.get("rank")),
        world_size=_opt_int(record.get("world_size")),
        run_id=_opt_str(record.get("run_id")),
        actor_name=_opt_str(ray.get("actor_name")),
        replica=_opt_int(record.get("replica")),
        record_path=path,
        record=record,
    )


def _entries(record: dict[str, Any]) -> list[dict[str, Any]]:
    out = [e for e in record.get("artifacts") or [] if isinstance(e, dict) and isinstance(e.get("path"), str)]
    log = record.get("event_log")
    if isinstance(log, str) and log:
        # A record that wrote no event names a log that was never created: link it if it is
        # there (the record may predate its first event), never report it missing.
        optional = expected_event_log(record) is None
        out.append({"path": log, "kind": "rl_insight", **({"optional": True} if optional else {})})
    return out


def link_records(plan: Plan) -> None:
    by_path = {(a.source.protocol, a.source.path): a for a in plan.artifacts}
    for rec_art in plan.artifacts:
        record = rec_art.record_entry
        if rec_art.info.kind != "process_record" or record is None or rec_art.info.owner is None:
            continue
        owner = plan.processes[rec_art.info.owner]
        folder = posixpath.dirname(rec_art.source.path)
        for entry in _entries(record):
            raw = str(entry["path"])
            target = posixpath.normpath(raw if raw.startswith("/") else posixpath.join(folder, raw))
            art = by_path.get((rec_art.source.protocol, target))
            if art is None:
                if not entry.get("optional"):
                    _report_absent(plan, rec_art.info.path, raw, folder, target, entry)
                continue
            if art.info.kind == "process_record":
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
