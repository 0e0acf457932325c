"""OTLP protobuf trace files: ``ExportTraceServiceRequest`` / ``TracesData`` (the same bytes on the wire:
field 1, repeated ``ResourceSpans``), read with :mod:`.wire`.

Three framings, tried in this order, the first that reads the WHOLE file as valid messages wins:

1. one bare message: an OTLP/HTTP request body saved as it came (``Content-Type:
   application/x-protobuf``), one per file;
2. varint-length-delimited messages: the OpenTelemetry file-exporter specification's framing
   (protobuf's ``writeDelimitedTo``);
3. 4-byte big-endian length-prefixed messages: the Collector's ``file`` exporter with ``format: proto``.

A file none of them reads whole (cut by a kill) keeps the resource blocks of its first message that
end before the cut and is reported incomplete.

Where ``opentelemetry-proto`` is installed (it comes with the SDK's OTLP exporters), a framing's
messages are parsed by protobuf's own C parser (~10x faster than the wire walk here, which stays the
reader of record: it runs without it, and wherever protobuf refuses a message).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from .model import Decoded, Link, ResourceSpans, Span, SpanEvent
from .wire import I32, I64, LEN, VARINT, WireError, as_double, as_int64, blob, fields, number, text, varint

WHY_SPAN = "spans that are not a valid OTLP Span message"
USE_RUNTIME = True  # parse with opentelemetry-proto when it is installed (tests turn it off to compare)
_RUNTIME: Any = None  # its ExportTraceServiceRequest class, False when it is not installed


def any_value(buf: memoryview, depth: int = 0) -> Any:
    """An ``AnyValue``: text, bool, int, float, a list, a dict, or hex text for bytes."""
    if depth > 32:
        raise WireError("attribute value nested deeper than 32 levels")
    out: Any = None
    for num, wire, value in fields(buf):
        if num == 1:
            out = text(value)
        elif num == 2 and wire == VARINT:
            out = bool(value)
        elif num == 3 and wire == VARINT:
            out = as_int64(number(value))
        elif num == 4 and wire == I64:
            out = as_double(number(value))
        elif num == 5 and isinstance(value, memoryview):  # ArrayValue: 1 = repeated AnyValue
            out = [
                any_value(v, depth + 1) for n, _, v in fields(value) if n == 1 and isinstance(v, memoryview)
            ]
        elif num == 6 and isinstance(value, memoryview):  # KeyValueList: 1 = repeated KeyValue
            out = attributes((v for n, _, v in fields(value) if n == 1), depth + 1)
        elif num == 7:
            out = blob(value).hex()
    return out


def attributes(items: Iterator[int | memoryview] | list[int | memoryview], depth: int = 0) -> dict[str, Any]:
    """``KeyValue`` messages (1 = key, 2 = AnyValue) as a dict."""
    out: dict[str, Any] = {}
    for item in items:
        if not isinstance(item, memoryview):
            raise WireError("an attribute is not a message")
        key, value = "", None
        for num, _, v in fields(item):
            if num == 1:
                key = text(v)
            elif num == 2 and isinstance(v, memoryview):
                value = any_value(v, depth)
        out[key] = value
    return out


def _span(buf: memoryview, scope: str) -> Span:
    s = Span("", "", "", "", 0, 0, 0, scope=scope)
    attrs: list[int | memoryview] = []
    for num, wire, v in fields(buf):
        if num == 1:
            s.trace_id = blob(v).hex()
        elif num == 2:
            s.span_id = blob(v).hex()
        elif num == 4:
            s.parent_span_id = blob(v).hex()
        elif num == 5:
            s.name = text(v)
        elif num == 6 and wire == VARINT:
            s.kind = number(v)
        elif num == 7 and wire == I64:
            s.start_ns = number(v)
        elif num == 8 and wire == I64:
            s.end_ns = number(v)
        elif num == 9:
            attrs.append(v)
        elif num == 11 and isinstance(v, memoryview):
            s.events.append(_event(v))
        elif num == 13 and isinstance(v, memoryview):
            s.links.append(_link(v))
        elif num == 15 and isinstance(v, memoryview):
            for n, _, sv in fields(v):
                if n == 2:
                    s.status_message = text(sv)
                elif n == 3:
                    s.status_code = number(sv)
        elif num == 16 and wire == I32:
            s.flags = number(v)
    s.attributes = attributes(attrs)
    return s


def _event(buf: memoryview) -> SpanEvent:
    e = SpanEvent("", 0)
    attrs: list[int | memoryview] = []
    for num, wire, v in fields(buf):
        if num == 1 and wire == I64:
            e.time_ns = number(v)
        elif num == 2:
            e.name = text(v)
        elif num == 3:
            attrs.append(v)
    e.attributes = attributes(attrs)
    return e


def _link(buf: memoryview) -> Link:
    link = Link("", "")
    attrs: list[int | memoryview] = []
    for num, _, v in fields(buf):
        if num == 1:
            link.trace_id = blob(v).hex()
        elif num == 2:
            link.span_id = blob(v).hex()
        elif num == 4:
            attrs.append(v)
    link.attributes = attributes(attrs)
    return link


def resource_spans(buf: memoryview, out: Decoded) -> ResourceSpans:
    """One ``ResourceSpans`` (1 = Resource, 2 = repeated ScopeSpans); a span that does not decode is
    dropped and counted, the block's other spans are kept."""
    block = ResourceSpans()
    for num, _, v in fields(buf):
        if num == 1 and isinstance(v, memoryview):
            block.attributes = attributes(av for n, _, av in fields(v) if n == 1)
        elif num == 2 and isinstance(v, memoryview):
            scope, spans = "", []
            for n, _, sv in fields(v):
                if n == 1 and isinstance(sv, memoryview):
                    scope = next((text(x) for m, _, x in fields(sv) if m == 1), "")
                elif n == 2 and isinstance(sv, memoryview):
                    spans.append(sv)
            for raw in spans:
                try:
                    block.spans.append(_span(raw, scope))
                except (WireError, RecursionError):
                    out.drop(WHY_SPAN)
    return block


def _messages_bare(data: memoryview) -> list[memoryview]:
    return [data]


def _messages_varint(data: memoryview) -> list[memoryview]:
    out, pos = [], 0
    while pos < len(data):
        size, pos = varint(data, pos)
        if size == 0 or pos + size > len(data):
            raise WireError("delimited message runs past the file")
        out.append(data[pos : pos + size])
        pos += size
    return out


def _messages_be32(data: memoryview) -> list[memoryview]:
    out, pos = [], 0
    while pos < len(data):
        if pos + 4 > len(data):
            raise WireError("length prefix cut")
        size = int.from_bytes(data[pos : pos + 4], "big")
        pos += 4
        if size == 0 or pos + size > len(data):
            raise WireError("length-prefixed message runs past the file")
        out.append(data[pos : pos + size])
        pos += size
    return out


FRAMINGS: tuple[tuple[str, Callable[[memoryview], list[memoryview]]], ...] = (
    ("one message", _messages_bare),
    ("varint-delimited", _messages_varint),
    ("4-byte length-prefixed", _messages_be32),
)


def _blocks(message: memoryview) -> list[memoryview]:
    """The ``ResourceSpans`` of one request; anything but field 1 (length-delimited) refuses it."""
    blocks = []
    for num, wire, v in fields(message):
        if num != 1 or wire != LEN or not isinstance(v, memoryview):
            raise WireError(f"field {num} (wire type {wire}) is not ExportTraceServiceRequest's")
        blocks.append(v)
    return blocks


def _runtime() -> Any:
    global _RUNTIME
    if _RUNTIME is None:
        try:
            from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
        except Exception:  # not installed (or broken): the wire walk reads every file
            _RUNTIME = False
        else:
            _RUNTIME = ExportTraceServiceRequest
    return _RUNTIME if USE_RUNTIME else False


def _from_runtime(messages: list[memoryview], out: Decoded) -> bool:
    """The messages parsed by protobuf itself into ``out``; False when it refuses one (or is absent)."""
    request = _runtime()
    if not request:
        return False
    try:
        parsed = [request.FromString(bytes(m)) for m in messages]
        for req in parsed:
            for rs in req.resource_spans:
                block = ResourceSpans(attributes=_pb_attrs(rs.resource.attributes))
                for ss in rs.scope_spans:
                    scope = ss.scope.name
                    block.spans.extend(_pb_span(sp, scope) for sp in ss.spans)
                out.resources.append(block)
    except Exception:  # protobuf's DecodeError, a nesting limit: the wire walk decides
        out.resources.clear()
        return False
    return True


def _pb_value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_pb_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return _pb_attrs(v.kvlist_value.values)
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind)


def _pb_attrs(items: Any) -> dict[str, Any]:
    return {kv.key: _pb_value(kv.value) for kv in items}


def _pb_span(sp: Any, scope: str) -> Span:
    return Span(
        trace_id=sp.trace_id.hex(),
        span_id=sp.span_id.hex(),
        parent_span_id=sp.parent_span_id.hex(),
        name=sp.name,
        kind=sp.kind,
        start_ns=sp.start_time_unix_nano,
        end_ns=sp.end_time_unix_nano,
        attributes=_pb_attrs(sp.attributes),
        events=[SpanEvent(e.name, e.time_unix_nano, _pb_attrs(e.attributes)) for e in sp.events],
        links=[Link(k.trace_id.hex(), k.span_id.hex(), _pb_attrs(k.attributes)) for k in sp.links],
        status_code=sp.status.code,
        status_message=sp.status.message,
        flags=sp.flags,
        scope=scope,
    )


def decode(data: bytes) -> tuple[Decoded, bool]:
    """The file's resource blocks, and whether the whole file was read (False: cut).

    A framing is taken when it reads the whole file with every span valid; else the first that
    reads it at all, its bad spans dropped and counted; else the file is cut (:func:`_salvage`)."""
    view = memoryview(data)
    fallback: Decoded | None = None
    for framing, split in FRAMINGS:
        try:
            messages = split(view)
            blocks = [b for m in messages for b in _blocks(m)]
        except WireError:
            continue
        out = Decoded(encoding=f"protobuf ({framing})")
        if _from_runtime(messages, out):
            return out, True
        for b in blocks:
            try:
                out.resources.append(resource_spans(b, out))
            except (WireError, RecursionError):
                out.drop("resource blocks that are not a valid ResourceSpans message")
        if not out.bad:
            return out, True
        fallback = fallback or out
    if fallback is not None:
        return fallback, True
    return _salvage(view), False


def _salvage(view: memoryview) -> Decoded:
    """A cut file: the whole resource blocks before the cut (first framing that yields any)."""
    out = Decoded(encoding="protobuf (cut)")
    for skip in (0, None, 4):  # one message; varint-delimited; 4-byte prefix
        pos = 0
        try:
            if skip is None:
                _, pos = varint(view, 0)
            else:
                pos = skip
            for num, wire, v in fields(view[pos:]):
                if num != 1 or wire != LEN or not isinstance(v, memoryview):
                    break
                out.resources.append(resource_spans(v, out))
        except (WireError, RecursionError):
            pass
        if out.resources:
            return out
    return out


def head_facts(data: bytes) -> tuple[dict[str, Any], int | None]:
    """The first resource's attributes and the first span's start, from a file's first bytes (the
    rest may be cut off): planning hints only."""
    view = memoryview(data)
    for skip in (0, None, 4):
        try:
            pos = varint(view, 0)[1] if skip is None else skip
            num, wire, block = next(iter(_lenient(view[pos:])))
            if num != 1 or wire != LEN or not isinstance(block, memoryview):
                continue
            attrs: dict[str, Any] = {}
            start = None
            for n, _, v in _lenient(block):
                if n == 1 and isinstance(v, memoryview):
                    attrs = attributes(av for m, _, av in fields(v) if m == 1)
                elif n == 2 and isinstance(v, memoryview) and start is None:
                    for m, _, sv in _lenient(v):
                        if m == 2 and isinstance(sv, memoryview):
                            start = next((number(x) for k, w, x in fields(sv) if k == 7 and w == I64), None)
                            break
            if attrs:
                return attrs, start
        except (WireError, StopIteration, RecursionError):
            continue
    return {}, None


def starts_like_otlp(data: bytes) -> bool:
    """The first bytes open a ``resource_spans`` field in one of the framings (the rest may be cut)."""
    view = memoryview(data)
    for skip in (0, None, 4):
        try:
            pos = varint(view, 0)[1] if skip is None else skip
            tag, after = varint(view, pos)
            if tag >> 3 == 1 and tag & 7 == LEN:
                varint(view, after)  # its length is whole
                return True
        except (WireError, IndexError):
            continue
    return False


def _lenient(buf: memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """:func:`.wire.fields` up to the first field the buffer cuts (a head's last bytes)."""
    try:
        yield from fields(buf, cut_ok=True)
    except WireError:
        return
