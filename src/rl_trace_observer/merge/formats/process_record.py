"""Process records (docs/FORMATS.md §2): what the capture layer writes about each process.

A record carries identity (host, pid, role, rank, Ray actor), the artifacts the process registered
and its clock snapshots; it holds no events. The planner reads every record (they are small) before
any trace file, and links the artifacts to the process through :meth:`ProcessRecord.registered`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from ...capture.file_names import PROCESS_RECORD_PREFIX
from ...capture.recorder import expected_event_log
from ..files.sources import Head
from ..timeline.model import BAD_JSON, Problem, ProcessInfo, ProcessKey
from .base import Format, ProcessRecords, ReadContext, ReadResult

RECORD_SCHEMA_PREFIX = "rl-trace-process/"


class ProcessRecord(Format, ProcessRecords):
    kind = "process_record"
    label = "Process"
    order = 0
    events = False  # identity, registered artifacts and clock snapshots: read in planning

    def sniff(self, head: Head) -> int:
        # Records are written with sorted keys: "schema" comes after the clock data, which grows
        # with every measurement and snapshot (tens of KB in a long run), so look at the whole head,
        # and past it trust the name the capture layer gives records (``read`` validates anyway).
        if b'"schema": "rl-trace-process/' in head.data:
            return 100
        name = head.source.name
        if (
            name.startswith(PROCESS_RECORD_PREFIX)
            and name.endswith(".json")
            and head.data.lstrip()[:1] == b"{"
        ):
            return 90
        return 0

    def read(self, data: bytes, ctx: ReadContext) -> ReadResult:
        res = ReadResult()
        try:
            record = msgspec.json.decode(data)
        except BAD_JSON as exc:
            res.skip, res.complete = True, False
            res.problems.append(Problem("incomplete", ctx.path, f"process record is not valid JSON ({exc})"))
            return res
        if not isinstance(record, dict) or not _valid(record):
            res.skip = True
            res.problems.append(Problem("not_a_trace", ctx.path, "process record without hostname/pid"))
            return res
        res.meta["record"] = record
        return res

    def identity(self, record: dict[str, Any], path: str) -> ProcessInfo:
        """The process a (valid) record describes."""
        raw_ray = record.get("ray")
        ray: dict[str, Any] = raw_ray if isinstance(raw_ray, dict) else {}
        return ProcessInfo(
            key=ProcessKey(str(record["hostname"]), int(record["pid"])),
            role=_opt_str(record.get("role")) or program_role(record),
            rank=_opt_int(record.get("rank")),
            world_size=_opt_int(record.get("world_size")),
            run_id=_opt_str(record.get("run_id")),
            actor_name=_opt_str(ray.get("actor_name")),
            replica=_opt_int(record.get("replica")),
            record_path=path,
            record=record,
        )

    def registered(self, record: dict[str, Any]) -> list[dict[str, Any]]:
        """Its artifacts (``path`` relative to the record's folder), and its event log."""
        out = [
            e for e in record.get("artifacts") or [] if isinstance(e, dict) and isinstance(e.get("path"), str)
        ]
        log = record.get("event_log")
        if isinstance(log, str) and log:
            # A record that wrote no event names a log that was never created: link it if it is
            # there (the record may predate its first event), never report it missing.
            optional = expected_event_log(record) is None
            out.append({"path": log, "kind": "rl_insight", **({"optional": True} if optional else {})})
        return out


def program_role(record: dict[str, Any]) -> str | None:
    """The role of a process nothing named (no ``RL_TRACE_ROLE``, no integration, not a Ray worker):
    its program's name, ``train`` for ``python train.py`` or ``python -m pkg.train`` (issue 34, item
    5h). Without it Perfetto's label is ``host · pid N`` and the report took the host for the role."""
    if record.get("ray"):  # a Ray worker's program is Ray's default_worker.py: its actor names it
        return None
    argv = record.get("argv")
    program = argv[0] if isinstance(argv, list) and argv and isinstance(argv[0], str) else ""
    if program in ("", "-", "-c"):  # python -c, stdin, a REPL: no program to name
        return None
    path = Path(program)
    name = path.parent.name if path.stem == "__main__" else path.stem  # python -m pkg: pkg/__main__.py
    return name or None


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _valid(record: dict[str, Any]) -> bool:
    return (
        str(record.get("schema", "")).startswith(RECORD_SCHEMA_PREFIX)
        and isinstance(record.get("hostname"), str)
        and isinstance(record.get("pid"), int)
        and not isinstance(record.get("pid"), bool)
    )
