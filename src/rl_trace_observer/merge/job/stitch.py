"""The output, stitched from the jobs' pieces in job order — the same way whoever ran the jobs.

Each job parses, rewrites and serialises (and, for ``.json.gz``, deflates) its files where it runs (a
local worker process, a Ray node), so stitching only concatenates bytes: the JSON header or nothing,
every job's piece in sequence order (deflate pieces joined into ONE gzip member, CRC combined), the
process/thread names or the clock packet last. The output is completed under an owned temp name
(:mod:`..output.owned`) and left there, ``RunState.pending``: only the merge's end knows whether it
succeeded, and then commits output and manifest together (:mod:`..manifest.pair`). A merge that keeps
no event (:class:`NothingUsable`) or fails leaves an earlier output as it was.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..output import owned
from ..output.chrome_json import ChromeJsonWriter, metadata_events
from ..output.compress import GzipMember, write_any_piece
from ..output.writeback import WritebackFile
from ..timeline.identity import ProcessDecl, ThreadDecl, process_title
from ..timeline.model import Rebase
from .spec import JobResult, Outcome

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
    written: bool = False  # complete, in ``pending`` until the merge commits it
    pending: Path | None = None
    writer_stats: dict[str, Any] = field(default_factory=dict)
    shard_parts: list[dict[str, Any]] = field(default_factory=list)  # span shard parts (..shards)
    header: dict[str, Any] = field(default_factory=dict)  # the JSON output's header (trace_header)


class AddResult(Protocol):
    def __call__(self, res: JobResult, pieces: list[Any]) -> None: ...


class Stitcher:
    """One merge attempt's output: ``with stitcher.output() as add: add(result, pieces)`` per job, in
    job order. ``titles`` name the planned processes; ``tail`` is the ``.pftrace``'s last packet (the
    clock statement)."""

    def __init__(
        self, out: Path, fmt: str, base: int, header: dict[str, Any], titles: dict[int, str], tail: bytes
    ) -> None:
        self.out, self.fmt, self.base, self.tail = out, fmt, base, tail
        self.state = RunState(base, titles=titles, header=header)

    @contextmanager
    def output(self) -> Iterator[AddResult]:
        state, out = self.state, self.out
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = owned.temp_path(out)
        try:
            with tmp.open("wb") as raw:
                f = WritebackFile(raw)  # written back as it goes: the final fsync has little left
                writer = _writer(f, self.fmt, state.header)
                kept = 0

                def add(res: JobResult, pieces: list[Any]) -> None:
                    nonlocal kept
                    lows = [o.min_ts for o in res.outcomes if o.min_ts is not None]
                    if lows and min(lows) < self.base:
                        raise Rebase(min(lows))
                    fold(state, res)
                    kept += sum(o.kept for o in res.outcomes)
                    writer.add(pieces)

                yield add
                if not kept:
                    raise NothingUsable(state)
                close_output(writer, state, self.tail)
                f.flush()
                os.fsync(raw.fileno())  # on disk before the commit renames it
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        state.output_size, state.written, state.pending = tmp.stat().st_size, True, tmp


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


def trace_header(base: int, clock_mode: str, alignment: dict[str, Any]) -> dict[str, Any]:
    """The Chrome JSON output's ``rl_trace_observer`` header (also kept with span shards)."""
    return {
        "schema": TRACE_SCHEMA,
        "base_ns": base,
        "clock": clock_mode,
        "clock_alignment": alignment,  # method, worst uncertainty, reference
    }


def close_output(writer: ChromeJsonWriter | PacketsOut, state: RunState, tail: bytes) -> None:
    """The output's last bytes: process/thread names (JSON), the clock statement (protobuf)."""
    if isinstance(writer, ChromeJsonWriter):
        writer.close(_metadata(state))
    else:  # packets are self-contained; the clock statement is one more
        writer.close(tail)


def fold(state: RunState, res: JobResult) -> None:
    """A finished job's identities, outcomes, shard parts and writer counts into the run's state."""
    _collect(state, res)
    state.shard_parts.extend(res.shards)
    _add_stats(state.writer_stats, res.writer_stats)  # the protobuf writer's counts


def _writer(f: Any, fmt: str, header: dict[str, Any]) -> ChromeJsonWriter | PacketsOut:
    """The writer that stitches job pieces into the output (its header first)."""
    if fmt.startswith("pftrace"):
        return PacketsOut(f, gzip=fmt.endswith(".gz"))
    return ChromeJsonWriter(f, gzip=fmt == "json.gz", header=header)


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
