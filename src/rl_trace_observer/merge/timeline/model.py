"""The merge's data model: one event type, and the identities of processes, threads and artifacts.

Why a ``msgspec.Struct`` and not a ``dict`` per event: a dict costs ~830 bytes and its keys are
re-hashed on every access; a struct with ``gc=False`` is a fraction of that and decodes straight
from the source bytes. ``args`` stays a ``msgspec.Raw`` slice of the input, so arguments are copied,
never parsed or re-encoded (the merger does not need them, and Kineto's are half of each event).

Time rule (docs/FORMATS.md §3). ``ts``/``dur`` are one pair of fields whose UNIT depends on the stage
an event is in — four of them, each named where it is produced:

1. decoded: the source's own numbers (Chrome JSON µs, int or float), only inside a reader;
2. after a reader returns: INTEGER absolute wall-clock ns (``anchor_ns + us_to_ns(ts_us)``, so no
   float of an epoch value ever exists) — or, when the reader was asked to defer
   (``ReadResult.deferred``), still the source µs after the anchor, converted once by the fused loop;
3. after the listed passes: integer absolute ns, corrected onto the reference clock;
4. after the fused loop (``transform.fastpath.to_output``): the OUTPUT's units relative to the job's
   base — float µs for Chrome JSON (``FileJob.unit_ns`` 1000, with the few µs values that do not give
   the ns back listed in ``FileJob.far``), integer ns for protobuf (``unit_ns`` 1).

Which of these an event list is in is carried by its holder (``ReadResult.deferred``,
``merge.job.file.FileJob.fast`` and ``unit_ns``), not by the event: a struct per event and stage would
cost the merge its speed. Writers derive µs from absolute ns exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
from msgspec import UNSET, Raw, UnsetType

__all__ = [
    "BAD_JSON",
    "FLOAT_US_EXACT_NS",
    "UNSET",
    "ArtifactInfo",
    "Event",
    "Problem",
    "ProcessInfo",
    "ProcessKey",
    "Rebase",
    "ThreadKey",
    "us_to_ns",
]


# What decoding hostile JSON raises: msgspec's error, and RecursionError for a value nested deeper
# than the interpreter's recursion limit (~1,000 levels: args nested 1,200 deep). Every reader catches
# both, so such a value costs its event (or line), never the file or the merge.
BAD_JSON: tuple[type[Exception], ...] = (msgspec.DecodeError, RecursionError)


# Every phase of the Chrome trace event format (and "" for none): decoding ``ph`` as a Literal returns
# one shared string instead of allocating (and later freeing) one per event. A phase outside this set
# fails the fast decode, and the careful decode then drops just that event — as the merge drops any
# phase it does not know (``timeline.times.KNOWN_PHASES``).
Phase = Literal[
    "B", "E", "X", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "N", "O", "D", "M",
    "V", "v", "R", "c", "(", ")", "S", "T", "p", "F", "=", "",
]  # fmt: skip


class Event(msgspec.Struct, omit_defaults=True, gc=False):
    """One Chrome-trace event. Field order is the output order; unknown source fields are dropped."""

    ph: Phase = ""
    name: str | UnsetType = UNSET
    cat: str | UnsetType = UNSET
    pid: int | str | UnsetType = UNSET
    tid: int | str | UnsetType = UNSET
    ts: int | float | UnsetType = UNSET
    dur: int | float | UnsetType = UNSET
    id: int | str | UnsetType = UNSET
    id2: Raw | UnsetType = UNSET
    bind_id: int | str | UnsetType = UNSET
    flow_in: bool | UnsetType = UNSET
    flow_out: bool | UnsetType = UNSET
    bp: str | UnsetType = UNSET
    s: str | UnsetType = UNSET
    scope: str | UnsetType = UNSET
    cname: str | UnsetType = UNSET
    args: Raw | UnsetType = UNSET


# Below this many ns from its origin, the double ns / 1000 is the exact 3-decimal µs (its shortest
# repr prints them) and us_to_ns gives the ns back: 2**43 µs, ~101.8 days. Farther out (a stale file
# in a run directory, traces of different months on one timeline) half of the values miss by a ns.
# Measured, 40,000 random values per band: 0 misses below; round(us * 1000) alone misses ~1 % of
# them between ~26 and ~80 days already.
FLOAT_US_EXACT_NS = 1000 << 43


def us_to_ns(us: float) -> int:
    """Exact ns from a µs float written with ≤3 decimals, for |us| < 2**43 (~101.8 days).

    ``round(us * 1000)`` can be 1 ns off near 5e12 µs (Kineto's relative times): the product is
    rounded to a double whose spacing is already 1 ns. Splitting off the integer part first keeps
    the fraction's error below 0.5 ns, so the decimal the source wrote is recovered exactly.
    """
    whole = int(us)
    return whole * 1000 + round((us - whole) * 1000)


@dataclass(frozen=True, order=True)
class ProcessKey:
    """An OS process: equal pids on different hosts are different processes."""

    host: str
    pid: int

    def __str__(self) -> str:
        return f"{self.host}/{self.pid}"


@dataclass(frozen=True, order=True)
class ThreadKey:
    """A track inside a merged process: one per (source, lane), so sources never share a track."""

    pid: int  # merged pid
    source: str  # "Torch", "VizTracer", "RL-Insight", "Proton", ...
    lane: str  # the source's own thread id or lane name, as text


@dataclass
class ProcessInfo:
    """What we know about one OS process (from its process record, else from its artifacts)."""

    key: ProcessKey
    role: str | None = None
    rank: int | None = None
    world_size: int | None = None
    run_id: str | None = None
    actor_name: str | None = None
    record_path: str | None = None
    replica: int | None = None
    merged_pid: int = 0
    sort_index: int = 0
    record: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def label(self) -> str:
        """``host · pid 1234 · actor rank 0 (actor name)``: what Perfetto shows as the process name."""
        parts = [self.key.host, f"pid {self.key.pid}" if self.key.pid >= 0 else "unknown pid"]
        who = self.role or ""
        if self.rank is not None:
            who = f"{who} rank {self.rank}".strip()
        elif self.replica is not None:
            who = f"{who} replica {self.replica}".strip()
        if self.actor_name:
            who = f"{who} ({self.actor_name})".strip()
        if who:
            parts.append(who)
        return " · ".join(parts)


class Rebase(Exception):
    """An event lies before the planned timeline base: the merge is redone from a lower base.

    Raised by whoever meets the event first — the parent for JSON outputs, the protobuf writer inside
    a worker (it writes ``ts - base`` as an unsigned varint) — and pickled back from worker processes.
    The base is planned from file heads, which need not hold a file's earliest event: a re-plan is the
    merger's own business, never a problem of the user's data.
    """

    def __init__(self, min_ns: int) -> None:
        super().__init__(min_ns)
        self.min_ns = min_ns


@dataclass
class Problem:
    """One manifest problem: ``kind`` from a fixed vocabulary, the file it concerns, one line of detail."""

    kind: str
    path: str
    detail: str

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "path": self.path, "detail": self.detail}

    def line(self) -> str:
        return f"{self.kind}: {self.path}: {self.detail}"


PROBLEM_KINDS = (
    "incomplete",  # truncated gzip, cut last JSONL line, empty file
    # not read at all: not a regular file (FIFO, socket, device), a symlink loop, a dangling symlink or
    # one to a directory, permission denied, a read error, a gzip stream that does not open
    "unreadable",
    "oversized",  # a run of whitespace or of one byte, or one event, over the bound: a decompression bomb
    "duplicate",  # the same bytes under two paths: the later copy is skipped
    "missing",  # registered in a process record but not among the inputs
    "unlinked",  # no owning record where the inputs have records (or no pid, or ranks on one pid)
    "mixed_runs",  # artifacts of several run ids and no --run
    "no_step_window",  # --step given but no step span/snapshot defines that step's time window
    "unanchored",  # no absolute time anchor (upstream Proton): skipped, never placed at time zero
    "dropped_events",  # events with invalid fields or out-of-range values were dropped
    "not_a_trace",  # JSON (or other bytes) that no reader recognises
    "outside_inputs",  # a process record names a path outside the inputs: never read
    "invalid_text",  # non-UTF-8 bytes, replaced so the rest of the file could be read
    "clock",  # clocks that cannot be aligned within the tolerance, or acausal cross-process pairs
    "node",  # a Ray node died, stalled or failed during `merge --ray`: its files are not (all) merged
)


@dataclass
class ArtifactInfo:
    """One input file as the manifest reports it; filled in while planning and reading."""

    path: str  # display path (URL or local path)
    rel: str  # path relative to its input root (used to link process-record entries)
    kind: str  # reader kind: torch, viztracer, proton, rl_insight, process_record, unknown
    size: int
    sha256: str | None = None
    owner: ProcessKey | None = None
    complete: bool = True
    step: int | None = None
    role: str | None = None
    rank: int | None = None
    selected: bool = True
    skip_reason: str | None = None
    anchor_ns: int | None = None
    anchor_source: str | None = None
    events_read: int = 0
    events_kept: int = 0
    events_dropped: int = 0
    group: str | None = None  # TokenSpeed rank group (VizTracer + Proton files of one scheduler)
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kind": self.kind,
            "size": self.size,
            "sha256": self.sha256,
            "owner": str(self.owner) if self.owner else None,
            "complete": self.complete,
            "step": self.step,
            "role": self.role,
            "rank": self.rank,
            "selected": self.selected,
            "skip_reason": self.skip_reason,
            "anchor": {"ns": self.anchor_ns, "source": self.anchor_source},
            "events": {"read": self.events_read, "kept": self.events_kept, "dropped": self.events_dropped},
            **({"group": self.group} if self.group else {}),
            **self.extra,
        }
