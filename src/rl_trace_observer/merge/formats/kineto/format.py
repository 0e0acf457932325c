"""PyTorch profiler (Kineto) traces: ``.json`` / ``.json.gz`` from ``export_chrome_trace``.

torch >= 2.4 writes a top-level ``baseTimeNanoseconds`` (wall clock floored to a ~3-month boundary)
and relative µs ``ts``; older versions write absolute epoch µs with no anchor, which a float can
only hold to 0.25 µs, so those files are re-read with exact decimals. GPU activity uses the device
index (0-7 on every host) as ``pid`` and the stream as ``tid``: those pids are sub-processes of the
process that ran the profiler, never OS processes.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import msgspec
from msgspec import UNSET

from ...files.sources import Head, Source
from ...timeline.model import BAD_JSON, Problem
from ..base import (
    REGIONS,
    AlignsOnPartner,
    ClockEvidence,
    Format,
    Hints,
    MarksSteps,
    ReadContext,
    ReadResult,
    SourcePid,
    chrome_json,
)
from ..base.chrome_hints import ABSOLUTE_US, chrome_hints
from .markers import read_markers
from .pairing import StageLinks

if TYPE_CHECKING:
    from ...clock.pairs import PairAlignment
    from ...timeline.model import Event
    from ...timeline.steps import Marker

_DEVICE_LABELS = ("GPU", "NPU", "XPU", "HPU", "MTIA", "Device", "device")
_OWN_KEYS = (b'"schemaVersion"', b'"deviceProperties"', b'"distributedInfo"')
# what only the PyTorch profiler writes in its events (torch 1.8's capitalised categories included)
_OWN_EVENTS = re.compile(
    rb'"cat"\s*:\s*"(?:cuda_runtime|cuda_driver|cpu_op|gpu_memcpy|gpu_memset|ac2g|gpu_user_annotation'
    rb'|Runtime|Operator|Kernel|Memcpy|Memset)"|"name"\s*:\s*"(?:ProfilerStep#\d|process_labels")'
)


class Kineto(Format, MarksSteps, ClockEvidence, AlignsOnPartner):
    kind = "torch"
    label = "Torch"
    order = 2
    probe_cat = "user_annotation"  # record_function regions on the CPU (GPU ones: device clock)
    causality = REGIONS  # a region sits inside its process's RL-Insight stage of the same name
    partner, partner_label = "rl_insight", "RL-Insight log"  # aligned on those stages (.pairing)
    markers_rank = 1  # ProfilerStep#N (or a global_step annotation): a run without RL-Insight logs

    def sniff(self, head: Head) -> int:
        """Its own top-level keys (torch writes them first; harnesses that re-save a trace, last; some
        files, HTA's test data among them, keep ``distributedInfo`` alone), else its events' content:
        Kineto's own categories, ``ProfilerStep#N``, device ``process_labels``."""
        data = head.ends
        if any(key in data for key in _OWN_KEYS):
            return 90
        if _OWN_EVENTS.search(head.data):
            return 75
        if head.source.name.endswith((".pt.trace.json", ".pt.trace.json.gz")):
            return 50
        return 0

    def hints(self, head: Head) -> Hints:
        return chrome_hints(head, pid_in_head=True, first_ts=True, absolute_us=True)

    def step_markers(self, src: Source) -> tuple[Marker, ...]:
        """Its CPU step-marker ranges, ``ProfilerStep#N`` mostly (:mod:`.markers`)."""
        return read_markers(src)

    def read(self, data: bytes, ctx: ReadContext) -> ReadResult:
        doc, res = chrome_json.start(data, ctx.path)
        decoded_cleanly = not res.problems
        if doc.host_name is not UNSET:
            res.meta["host_name"] = doc.host_name
        if doc.distributedInfo is not UNSET:
            info = _object(doc.distributedInfo)
            if isinstance(info.get("rank"), int):
                res.meta["rank"] = info["rank"]
        if doc.baseTimeNanoseconds is not UNSET:
            res.anchor_ns, res.anchor_source = int(doc.baseTimeNanoseconds), "baseTimeNanoseconds"
            chrome_json.finish(doc.traceEvents, res.anchor_ns, res, ctx.defer_times)
            return res
        if ctx.anchor_ns is not None:
            res.anchor_ns, res.anchor_source = ctx.anchor_ns, "process record"
            chrome_json.finish(doc.traceEvents, res.anchor_ns, res, ctx.defer_times)
            return res
        first: Any = next((e.ts for e in doc.traceEvents if e.ph != "M" and e.ts is not UNSET), None)
        if first is None or first < ABSOLUTE_US:
            res.skip = True
            res.problems.append(
                Problem(
                    "unanchored",
                    ctx.path,
                    "no baseTimeNanoseconds and relative timestamps: not placed (register its "
                    "anchor_ns in its process record, or export it with torch >= 2.4)",
                )
            )
            return res
        res.anchor_ns, res.anchor_source = 0, "absolute epoch µs (torch < 2.4)"
        times = chrome_json.exact_times(data) if decoded_cleanly else None
        if times is not None and len(times) == len(doc.traceEvents):
            res.events = chrome_json.normalise_exact(doc.traceEvents, times, 0, res)
        else:
            res.events = chrome_json.normalise(doc.traceEvents, 0, res)
        return res

    def align_on(
        self,
        partner: tuple[str, ReadResult],
        url: str,
        events: list[Event],
        res: ReadResult,
        tolerance_ns: int,
        apply: bool,
    ) -> PairAlignment | None:
        """On the RL-Insight stages of its process's event log (:mod:`.pairing`)."""
        links = StageLinks()
        links.add(partner[0], partner[1].events, partner[1])
        return links.align(url, events, res, tolerance_ns, apply)

    def process_of(self, pid: SourcePid, result: ReadResult, ctx: ReadContext) -> SourcePid:
        if isinstance(pid, str):
            return pid or "Kineto"
        labels = result.process_labels.get(pid, "")
        if labels.startswith(_DEVICE_LABELS):
            return labels
        if not labels and 0 <= pid < 64 and pid != ctx.owner_pid:
            return f"GPU {pid}"
        return pid

    def lane_of(self, pid: SourcePid, tid: Any, result: ReadResult) -> str:
        name = result.thread_names.get((pid, tid))
        if name:
            return name.strip()
        labels = result.process_labels.get(pid, "")
        if isinstance(tid, str) and tid.startswith("stream"):  # torch < 1.10 names its streams so
            return tid
        return f"stream {tid}" if labels.startswith(_DEVICE_LABELS) else f"thread {tid}"


def _object(raw: Any) -> dict[str, Any]:
    try:
        value = msgspec.json.decode(raw)
    except BAD_JSON:
        return {}
    return value if isinstance(value, dict) else {}
