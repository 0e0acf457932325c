"""Decoding Chrome-trace JSON (object or array form) into events on the absolute ns timeline.

Shared by the Kineto, VizTracer and Proton readers, which differ only in where the anchor lives
and what their pids mean. Fast path: one typed ``msgspec`` decode of the whole file (GC off around
it: the collector slows bulk parsing 2-5×). Anything unusual — a wrong field type, ``NaN``, a
number out of range, non-UTF-8 bytes, a truncated file — falls back to a careful path that decodes
event by event, drops (and counts) only what is unusable and keeps everything else.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import msgspec
from msgspec import UNSET, Raw, UnsetType

from ...timeline.model import BAD_JSON, Event, Problem
from ...timeline.select import pick
from ...timeline.times import EARLIEST_NS, KNOWN_PHASES, MAX_TS_NS, to_ns
from . import ReadContext, ReadResult
from .json_split import split_document

_SALVAGE_ATTEMPTS = 64
_NON_FINITE = re.compile(rb"(?<=[:,\[])(\s*)-?(?:NaN|Infinity)")


class VizTracerMeta(msgspec.Struct, gc=False):
    baseTimeNanoseconds: int | float | UnsetType = UNSET
    version: str | UnsetType = UNSET


class Document(msgspec.Struct, gc=False):
    """The top-level keys any of our Chrome-JSON sources may carry; the rest is ignored."""

    traceEvents: list[Event] = []
    baseTimeNanoseconds: int | float | UnsetType = UNSET
    viztracer_metadata: VizTracerMeta | UnsetType = UNSET
    host_name: str | UnsetType = UNSET
    distributedInfo: Raw | UnsetType = UNSET
    schemaVersion: Raw | UnsetType = UNSET
    deviceProperties: Raw | UnsetType = UNSET
    displayTimeUnit: Raw | UnsetType = UNSET
    traceName: Raw | UnsetType = UNSET
    rl_trace_observer: Raw | UnsetType = UNSET


class _LooseDocument(msgspec.Struct, gc=False):
    traceEvents: list[Raw] = []


class _Times(msgspec.Struct, gc=False):
    ts: Decimal | UnsetType = UNSET
    dur: Decimal | UnsetType = UNSET


class _TimesDocument(msgspec.Struct, gc=False):
    traceEvents: list[_Times] = []


_DECODER = msgspec.json.Decoder(Document)
_EVENT_DECODER = msgspec.json.Decoder(Event)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Bulk decoding allocates millions of objects; generational GC passes over them are wasted."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@dataclass
class Decoded:
    doc: Document
    problems: list[Problem]
    dropped: int
    complete: bool
    dropped_why: dict[str, int] = field(default_factory=dict)  # reason -> events (see WHY_*)


# why the careful decode drops an event (manifest ``artifacts[].dropped_why``)
WHY_DEEP = "args nested deeper than the decoder's limit (~1,000 levels)"
WHY_FIELDS = "a field of the wrong type (a time, pid or id that is text, null, NaN or out of range)"


def decode(data: bytes, path: str) -> Decoded:
    """Decode a whole Chrome-JSON file; never raises for bad content (see module docstring)."""
    if data.lstrip()[:1] == b"[":
        data = b'{"traceEvents":' + data + (b"" if data.rstrip().endswith(b"]") else b"]") + b"}"
    with gc_paused():
        try:
            return Decoded(_DECODER.decode(data), [], 0, True)
        except BAD_JSON:
            return _decode_carefully(data, path)


def _decode_carefully(data: bytes, path: str) -> Decoded:
    problems: list[Problem] = []
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        data = data.decode("utf-8", "replace").encode("utf-8")
        problems.append(
            Problem("invalid_text", path, f"non-UTF-8 bytes (first at byte {exc.start}) replaced")
        )
    if b"NaN" in data or b"Infinity" in data:
        data = _NON_FINITE.sub(rb"\1null", data)
    complete, deep = True, False
    try:
        loose = _try_loose(data)
        if loose is None:
            loose, complete = _salvage(data)
    except RecursionError:  # a value nested too deep somewhere: cut the document without recursion
        loose, deep = None, True
    if loose is None and not deep and b'"traceEvents"' not in data:
        raise NotATrace("not valid JSON")
    if loose is None:
        split = split_document(data)
        if split is None or (not split.complete and not deep and not split.events):
            raise NotATrace("not valid JSON")
        complete = split.complete
        raws: list[Any] = split.events
        top = {k: Raw(v) for k, v in split.top.items()}
    else:
        raws, top = loose[0].traceEvents, loose[1]
    if not complete:
        problems.append(Problem("incomplete", path, f"JSON ends early, after {len(raws)} whole events"))
    events: list[Event] = []
    why: dict[str, int] = {}
    for raw in raws:
        try:
            events.append(_EVENT_DECODER.decode(raw))
        except RecursionError:
            why[WHY_DEEP] = why.get(WHY_DEEP, 0) + 1
        except msgspec.DecodeError:
            why[WHY_FIELDS] = why.get(WHY_FIELDS, 0) + 1
    doc = _top_fields(top)
    doc.traceEvents = events
    return Decoded(doc, problems, sum(why.values()), complete, why)


class NotATrace(ValueError):
    """The bytes are not a Chrome-trace JSON document at all."""


def _try_loose(data: bytes) -> tuple[_LooseDocument, dict[str, Raw]] | None:
    """The top-level values and each event undecoded; None when the JSON is invalid. RecursionError
    (a value nested too deep) is the caller's to handle: no cut would cure it."""
    try:
        top = msgspec.json.decode(data, type=dict[str, Raw])
        doc = msgspec.json.decode(data, type=_LooseDocument)
    except msgspec.DecodeError:
        return None
    return doc, top


def _salvage(data: bytes) -> tuple[tuple[_LooseDocument, dict[str, Raw]] | None, bool]:
    """Cut a truncated file after its last whole event and close the array and object."""
    start = data.find(b'"traceEvents"')
    if start < 0:
        return None, False
    end = len(data)
    for _ in range(_SALVAGE_ATTEMPTS):
        cut = data.rfind(b"}", start, end)
        if cut < 0:
            break
        loose = _try_loose(data[: cut + 1] + b"]}")
        if loose is not None:
            return loose, False
        end = cut
    empty = _try_loose(data[: data.find(b"[", start) + 1] + b"]}") if b"[" in data[start:] else None
    return empty, False


def _top_fields(top: dict[str, Raw]) -> Document:
    """Top-level keys one by one, so a malformed one is lost alone."""
    doc = Document()
    for key in ("baseTimeNanoseconds", "host_name", "viztracer_metadata", "distributedInfo"):
        raw = top.get(key)
        if raw is None:
            continue
        try:
            typed = msgspec.json.decode(b'{"%s":%s}' % (key.encode(), bytes(raw)), type=Document)
            setattr(doc, key, getattr(typed, key))
        except BAD_JSON:
            pass
    for key in ("schemaVersion", "deviceProperties", "traceName", "rl_trace_observer"):
        if key in top:
            setattr(doc, key, top[key])
    return doc


def exact_times(data: bytes) -> list[_Times] | None:
    """The ``ts``/``dur`` of every event as exact decimals (for files of absolute epoch µs)."""
    try:
        with gc_paused():
            return msgspec.json.decode(data, type=_TimesDocument).traceEvents
    except BAD_JSON:
        return None


def start(data: bytes, path: str) -> tuple[Document, ReadResult]:
    """Decode a Chrome-shaped file and open its result with the decode's problems and counts."""
    dec = decode(data, path)
    res = ReadResult(problems=dec.problems, dropped=dec.dropped, complete=dec.complete)
    res.dropped_why.update(dec.dropped_why)
    res.read = len(dec.doc.traceEvents) + dec.dropped
    return dec.doc, res


def anchor_or_skip(
    res: ReadResult,
    declared: tuple[int | float, str] | None,
    record_anchor_ns: int | None,
    path: str,
    unanchored_detail: str,
) -> int | None:
    """Place a file on the wall clock: its own anchor, else its process record's, else skip it as
    ``unanchored`` — never silently at time zero. Returns the anchor, or None when skipped."""
    if declared is not None:
        res.anchor_ns, res.anchor_source = int(declared[0]), declared[1]
    elif record_anchor_ns is not None:
        res.anchor_ns, res.anchor_source = record_anchor_ns, "process record"
    else:
        res.skip = True
        res.problems.append(Problem("unanchored", path, unanchored_detail))
        return None
    return res.anchor_ns


def read_anchored(
    data: bytes,
    ctx: ReadContext,
    declared: Callable[[Document], tuple[int | float, str] | None],
    missing: str,
) -> ReadResult:
    """The usual read: decode, place by the file's own anchor (``declared``) or its process record's
    (else ``unanchored`` with ``missing`` as the detail), then the events on the ns timeline."""
    doc, res = start(data, ctx.path)
    anchor = anchor_or_skip(res, declared(doc), ctx.anchor_ns, ctx.path, missing)
    if anchor is not None:
        finish(doc.traceEvents, anchor, res, ctx.defer_times)
    return res


def top_level_anchor(doc: Document) -> tuple[int | float, str] | None:
    """Kineto's and TokenSpeed Proton's ``baseTimeNanoseconds`` at the top of the document."""
    return None if doc.baseTimeNanoseconds is UNSET else (doc.baseTimeNanoseconds, "baseTimeNanoseconds")


def normalise(events: list[Event], anchor_ns: int, result: ReadResult) -> list[Event]:
    """Metadata events into ``result``'s names; the rest to absolute ns (dropping invalid ones)."""
    out, bad = to_ns(events, anchor_ns, lambda e: _metadata(e, result))
    result.dropped += bad
    return out


def read_names(events: list[Event], result: ReadResult) -> None:
    """The metadata events' names into ``result``, wherever the file put them (a thread's or device's
    name decides its merged track), leaving every event where it is."""
    for e in pick(events, "M"):
        _metadata(e, result)


def finish(events: list[Event], anchor_ns: int, result: ReadResult, defer: bool) -> None:
    """Hand the events over: on the ns timeline, or (``defer``) with their names read and their times
    still µs after ``anchor_ns``, for the fused fast path to convert (:mod:`...timeline.times`)."""
    if defer:
        read_names(events, result)
        result.events, result.deferred = events, True
    else:
        result.events = normalise(events, anchor_ns, result)


def normalise_exact(
    events: list[Event], times: list[_Times], anchor_ns: int, result: ReadResult
) -> list[Event]:
    """Like :func:`normalise`, with times from exact decimals (epoch µs floats are only 0.25 µs exact)."""
    out: list[Event] = []
    for e, t in zip(events, times, strict=False):
        if e.ph == "M":
            _metadata(e, result)
            continue
        try:
            if t.ts is UNSET or e.ph not in KNOWN_PHASES:
                raise ValueError
            e.ts = anchor_ns + int((t.ts * 1000).to_integral_value())
            if t.dur is not UNSET:
                e.dur = int((t.dur * 1000).to_integral_value())
                if not 0 <= e.dur < MAX_TS_NS:
                    raise ValueError
            if not EARLIEST_NS <= e.ts < MAX_TS_NS:
                raise ValueError
        except (ValueError, ArithmeticError):
            result.dropped += 1
            continue
        out.append(e)
    return out


def _metadata(e: Event, result: ReadResult) -> None:
    result.metadata += 1
    name = e.name
    if name not in ("process_name", "thread_name", "process_labels") or e.args is UNSET:
        return
    try:
        args = msgspec.json.decode(e.args)
    except BAD_JSON:
        return
    if not isinstance(args, dict):
        return
    pid = e.pid if e.pid is not UNSET else 0
    if name == "process_name" and isinstance(args.get("name"), str):
        result.process_names[pid] = args["name"]
    elif name == "process_labels" and isinstance(args.get("labels"), str):
        result.process_labels[pid] = args["labels"]
    elif name == "thread_name" and isinstance(args.get("name"), str):
        result.thread_names[(pid, e.tid if e.tid is not UNSET else 0)] = args["name"]


def decode_raw_args(e: Event) -> dict[str, Any]:
    """An event's ``args`` as a dict (empty when absent or not an object)."""
    if e.args is UNSET:
        return {}
    try:
        value = msgspec.json.decode(e.args)
    except BAD_JSON:
        return {}
    return value if isinstance(value, dict) else {}
