"""The Python SDK's own JSON span output: ``ConsoleSpanExporter`` (to stdout or a file), which writes each
span's ``to_json()`` — NOT OTLP/JSON — one object after another (indented, or one per line with a
compact formatter).

Its fields: ``name``, ``context {trace_id, span_id}`` (``0x`` hex), ``kind`` (``SpanKind.SERVER``),
``parent_id`` (``0x`` hex or null), ``start_time`` / ``end_time`` / event ``timestamp`` as ISO-8601 UTC
text with MICROSECONDS (the SDK formats ``ns / 1e9`` as a float, so a time may be 1 µs off the ns
the span had), ``status {status_code, description}``, ``attributes`` (plain JSON values), ``events``,
``links [{context, attributes}]``, ``resource {attributes}`` (repeated on every span). Spans of one
resource are grouped into one block, as OTLP's are.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from .model import KINDS, STATUS, Decoded, Link, ResourceSpans, Span, SpanEvent

WHY_OBJECT = "objects that are not one span of the SDK's console output"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


def looks_like(head: bytes) -> bool:
    """A head of ``to_json()`` spans: a ``context`` with ``0x`` ids."""
    return b'"context"' in head and (b'"trace_id": "0x' in head or b'"trace_id":"0x' in head)


def iso_ns(text: Any) -> int:
    """ISO-8601 UTC text (µs) as unix ns, exactly (no float)."""
    if not isinstance(text, str):
        raise ValueError("a time is not text")
    dt = datetime.fromisoformat(text)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return ((dt - _EPOCH) // _US) * 1000


def _hex(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or not value.startswith("0x"):
        raise ValueError("an id is not 0x hex")
    int(value, 16)
    return value[2:].lower()


def _name_index(value: Any, names: tuple[str, ...]) -> int:
    if isinstance(value, str):
        name = value.rsplit(".", 1)[-1].lower()
        if name in names:
            return names.index(name)
    return 0


def _span(obj: Any) -> tuple[dict[str, Any], Span]:
    if not isinstance(obj, dict) or not isinstance(obj.get("context"), dict):
        raise ValueError("not a span")
    ctx, status, resource, attrs = (
        obj["context"],
        _obj(obj, "status"),
        _obj(obj, "resource"),
        _obj(obj, "attributes"),
    )
    span = Span(
        trace_id=_hex(ctx.get("trace_id")),
        span_id=_hex(ctx.get("span_id")),
        parent_span_id=_hex(obj.get("parent_id")),
        name=str(obj.get("name") or ""),
        kind=_name_index(obj.get("kind"), KINDS),
        start_ns=iso_ns(obj.get("start_time")),
        end_ns=iso_ns(obj.get("end_time")),
        attributes=dict(attrs),
        events=[
            SpanEvent(str(e.get("name") or ""), iso_ns(e.get("timestamp")), dict(e.get("attributes") or {}))
            for e in obj.get("events") or ()
            if isinstance(e, dict)
        ],
        links=[
            Link(
                _hex(k["context"].get("trace_id")),
                _hex(k["context"].get("span_id")),
                dict(k.get("attributes") or {}),
            )
            for k in obj.get("links") or ()
            if isinstance(k, dict) and isinstance(k.get("context"), dict)
        ],
        status_code=_name_index(status.get("status_code"), STATUS),
        status_message=str(status.get("description") or ""),
    )
    return _obj(resource, "attributes"), span


def _obj(parent: dict[str, Any], key: str) -> dict[str, Any]:
    """``parent[key]`` when it is an object, else an empty one."""
    value = parent.get(key)
    return value if isinstance(value, dict) else {}


def decode(data: bytes) -> tuple[Decoded, bool]:
    """Every span object in the stream; a cut last object makes the file incomplete."""
    out = Decoded(encoding="SDK console JSON")
    text = data.decode("utf-8", "replace")
    decoder = json.JSONDecoder()
    blocks: dict[str, ResourceSpans] = {}
    pos, end = 0, len(text)
    while True:
        while pos < end and text[pos] in " \t\r\n":
            pos += 1
        if pos >= end:
            return out, True
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except (json.JSONDecodeError, RecursionError):
            nxt = text.find("\n{", pos)
            if nxt < 0:  # nothing after it: the last object was cut
                return out, False
            out.drop(WHY_OBJECT)
            pos = nxt + 1
            continue
        try:
            res_attrs, span = _span(obj)
        except (ValueError, TypeError, AttributeError, KeyError):
            out.drop(WHY_OBJECT)
            continue
        key = json.dumps(res_attrs, sort_keys=True, default=str)
        block = blocks.get(key)
        if block is None:
            block = blocks[key] = ResourceSpans(attributes=res_attrs)
            out.resources.append(block)
        block.spans.append(span)
