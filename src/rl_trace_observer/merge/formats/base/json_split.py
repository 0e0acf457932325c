"""Cut a Chrome-trace JSON document into its top-level values and its events, without recursion.

Why: msgspec (as any recursive parser) gives up on a value nested deeper than the interpreter's
recursion limit (~1,000 levels) with ``RecursionError`` — for the whole document, though only one
event holds it. This scanner only counts brackets (skipping strings), so the depth of one event's
``args`` costs that event alone: the caller decodes each event slice by itself and drops the one
that cannot be decoded. It runs only after the fast decodes failed on such a file (one token per
bracket or string: a few seconds per 100 MB), never on the common path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import msgspec

# a string (escapes included), or one bracket: everything else (numbers, literals, commas, colons)
# lies between tokens and only matters as part of the value slices cut here
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*(")?|[\[\]{}]', re.DOTALL)  # group 1: the string ends
_EVENTS_KEY = b'"traceEvents"'


@dataclass
class Split:
    """The document's top-level ``key -> value bytes`` and the bytes of each ``traceEvents`` element;
    ``complete`` is False when the document ends before its last bracket closes (a cut file)."""

    top: dict[str, bytes] = field(default_factory=dict)
    events: list[bytes] = field(default_factory=list)
    complete: bool = True


def split_document(data: bytes) -> Split | None:
    """The top-level values and events of ``data`` (a JSON object), or None when it is not one."""
    start = len(data) - len(data.lstrip())
    if data[start : start + 1] != b"{":
        return None
    out = Split()
    depth = 0
    key: bytes | None = None  # the top-level key whose value comes next
    value_at = -1  # where that value starts, when it is an array or object
    in_events = False
    event_at = -1  # where the current event starts (depth 2 inside traceEvents)
    last_end = start
    for m in _TOKEN.finditer(data, start):
        tok = m.group()
        first = tok[:1]
        if first == b'"':
            if m.group(1) is None:  # the document ends inside this string (a cut file)
                break
            if depth == 1:
                if key is None:
                    key = tok
                elif data[last_end : m.start()].strip() == b":":  # a string value
                    out.top[_name(key)] = tok
                    key = None
                else:  # a number or literal came first (between the tokens): this is the next key
                    _scalar(out, key, data[last_end : m.start()])
                    key = tok
            elif in_events and depth == 2 and event_at < 0:  # a bare string event: rejected later
                out.events.append(tok)
        elif first in b"[{":
            depth += 1
            if depth == 2 and key is not None:
                value_at = m.start()
                in_events = key == _EVENTS_KEY and first == b"["
            elif depth == 3 and in_events and event_at < 0:
                event_at = m.start()
        else:
            depth -= 1
            if depth < 0:
                return None
            if in_events and depth == 2 and event_at >= 0:
                out.events.append(data[event_at : m.end()])
                event_at = -1
            elif depth == 1 and key is not None and value_at >= 0:
                if not in_events:
                    out.top[_name(key)] = data[value_at : m.end()]
                key, value_at, in_events = None, -1, False
            elif depth == 0:
                if key is not None:
                    _scalar(out, key, data[last_end : m.start()])
                return out
        last_end = m.end()
    out.complete = False
    return out


def _scalar(out: Split, key: bytes, gap: bytes) -> None:
    """``: 1764000000000000000,`` after ``key``: its value."""
    value = gap.strip().lstrip(b":").rstrip(b",").strip()
    if value:
        out.top[_name(key)] = value


def _name(key: bytes) -> str:
    """A key as text, its escapes decoded (a string is never too deep to decode)."""
    try:
        return str(msgspec.json.decode(key))
    except msgspec.DecodeError:
        return key[1:-1].decode("utf-8", "replace")
