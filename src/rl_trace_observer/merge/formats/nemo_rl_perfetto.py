"""NeMo-RL's Perfetto workload tracer (NVIDIA-NeMo/RL PRs #3879 / #3887; the older ``nemo_rl.utils.trace``
writes the same shape): one Chrome-trace JSON ARRAY per run, written by the driver at the end.

What the file is, as that code writes it:

- ``ts`` are ``time.monotonic`` µs of the DRIVER — not the wall clock — and no anchor is written, so
  the file is placed only when its process record supplies one (``anchor_ns``), like the VizTracer
  CLI's; else it is ``unanchored`` (said, never put at time zero);
- the Ray actors' events (the trajectory collector, the sync rollout actor) were shifted onto the
  driver's clock before writing, by one round trip each (the midpoint of the driver's clock around
  the actor's reading). Neither the offset nor the round trip is written, so the bound of that
  alignment cannot be given from the file;
- pids are 31-bit hashes of ``host:pid:process name`` (virtual ones for the per-sample rollout lanes),
  named by ``process_name`` metadata (``driver``, ``trajectory_collector_actor``, ``sync_rollout_actor``,
  ``<algo>_<sync|async>_rollouts``): ``driver`` is the file's owner (the process that wrote it), each
  other one a sub-process of it, named so; a pid below the kernel's pid limit (the older tracer's
  ``os.getpid()``) is an OS process;
- driver spans are ``B``/``E`` pairs (an ``E`` carries no name), samples are ``X`` slices on named
  virtual lanes, steps are instants: ``<algo>_step_start`` … ``<algo>_step_complete`` (args ``step``,
  ``algorithm``, ``mode``). The reader joins each such pair into one ``rl.<algo>.step`` slice, the
  step-marker name NeMo-RL's OTLP spans use, so steps come from the same rule.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
from msgspec import UNSET

from ..files.sources import Head
from ..timeline.model import BAD_JSON, Event
from .base import Format, Hints, ProcessRef, ReadContext, ReadResult, SourcePid, chrome_json

PID_LIMIT = 1 << 22  # Linux's pid_max ceiling: above it a pid is the tracer's hash, not an OS pid
STEP_CAT = "nemo_rl.step"
_STEP = re.compile(r"^(?P<algo>[a-z][a-z0-9]*)_step_(?P<edge>start|complete)$")
_NAMES = ("nemo_rl_perfetto_trace.json", "nemorl_trace.json", "_perfetto.json")
_PROCESS = re.compile(
    rb'"args"\s*:\s*\{\s*"name"\s*:\s*"(?:driver|trajectory_collector_actor|sync_rollout_actor'
    rb'|[a-z]+_(?:sync|async)_rollouts)"'
)
_SIGNS = (b'"tracer_name"', b'_step_start"', b'_step_complete"')
UNANCHORED = (
    "NeMo-RL's Perfetto tracer writes the driver's time.monotonic µs and no wall-clock anchor: placed "
    "only with an anchor_ns from its process record"
)


def _args(raw: Any) -> dict[str, Any]:
    if raw is UNSET:
        return {}
    try:
        value = msgspec.json.decode(raw)
    except BAD_JSON:
        return {}
    return value if isinstance(value, dict) else {}


def step_spans(events: list[Event]) -> list[Event]:
    """``rl.<algo>.step`` slices from each ``<algo>_step_start`` and the next ``<algo>_step_complete``
    of the same process and algorithm (integer ns times); an unmatched start or end makes none."""
    open_: dict[tuple[Any, str], Event] = {}
    out = []
    for e in sorted((e for e in events if e.ph in ("i", "I") and isinstance(e.name, str)), key=_ts):
        m = _STEP.match(e.name)  # type: ignore[arg-type]
        if not m or type(e.ts) is not int:
            continue
        key = (e.pid, m.group("algo"))
        if m.group("edge") == "start":
            open_[key] = e
            continue
        start = open_.pop(key, None)
        if start is None or type(start.ts) is not int:
            continue
        args = {**_args(start.args), **_args(e.args)}
        out.append(
            Event(
                ph="X",
                name=f"rl.{m.group('algo')}.step",
                cat=STEP_CAT,
                pid=start.pid,
                tid=start.tid,
                ts=start.ts,
                dur=e.ts - start.ts,
                args=msgspec.Raw(msgspec.json.encode(args)),
            )
        )
    return out


def _ts(e: Event) -> int:
    return e.ts if type(e.ts) is int else 0


class NemoRLPerfetto(Format):
    kind = "nemo_rl_perfetto"
    stack = "nemo-rl"
    label = "NeMo-RL"
    order = 11

    def sniff(self, head: Head) -> int:
        data = head.data.lstrip()
        if data[:1] != b"[":
            return 0
        if _PROCESS.search(data) or any(sign in data for sign in _SIGNS):
            return 92
        return 90 if head.source.name.removesuffix(".gz").endswith(_NAMES) else 0

    def hints(self, head: Head) -> Hints:
        return Hints()  # hashed pids, no host, monotonic times: nothing to plan by

    def read(self, data: bytes, ctx: ReadContext) -> ReadResult:
        doc, res = chrome_json.start(data, ctx.path)
        anchor = chrome_json.anchor_or_skip(res, None, ctx.anchor_ns, ctx.path, UNANCHORED)
        if anchor is not None:
            chrome_json.finish(doc.traceEvents, anchor, res, defer=False)
            res.events.extend(step_spans(res.events))
        return res

    def process_of(self, pid: SourcePid, result: ReadResult, ctx: ReadContext) -> ProcessRef:
        if isinstance(pid, int) and 0 <= pid < PID_LIMIT:
            return pid
        name = result.process_names.get(pid)
        if name == "driver" and ctx.owner_pid is not None:  # the file's owner is the driver that wrote it
            return ctx.owner_pid
        return name or f"NeMo-RL process {pid}"

    def lane_of(self, pid: SourcePid, tid: Any, result: ReadResult) -> str:
        return (result.thread_names.get((pid, tid)) or f"thread {tid}").strip()
