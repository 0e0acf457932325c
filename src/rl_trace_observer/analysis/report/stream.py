"""Decode the events of a Chrome-trace JSON file a few MB at a time, whatever its layout.

Why not line by line: merged traces put several events on one line and keep Kineto's ``args`` with
their raw newlines, so lines are not events. Why not one decode of the whole file: a multi-GB trace
would need the whole text plus every event in memory at once.

How: after the ``"traceEvents": [`` (or a leading ``[``), cut the text at a ``}`` + ``,`` + ``{``
boundary past the chunk size and decode ``[`` + piece + ``]`` as a list of events. If the cut falls
inside an event (a nested array of objects, or a string), that text is not valid JSON and the next
boundary is tried — a prefix P of a valid array body makes ``[P]`` valid exactly when P ends between
two elements, so a successful decode is always a correct cut. Events decode into a small struct
whose ``args`` stay raw bytes; an event with odd field types is dropped and counted, not fatal.
Whatever surrounds the array (``displayTimeUnit``, ``rl_trace_observer``, …) is parsed at the end.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, BinaryIO

import msgspec
import orjson
from msgspec import UNSET, UnsetType

__all__ = ["Event", "EventStream", "NotStreamable", "decode_events"]

Number = int | float
BLOCK_BYTES = 8 << 20
CHUNK_BYTES = 4 << 20
HEAD_LIMIT = 64 << 20  # the events array must start within this many bytes
MAX_BUFFER = 512 << 20  # a single "event" larger than this is not a trace we stream
MAX_CUT_TRIES = 16
_ARRAY_START = re.compile(rb'"traceEvents"\s*:\s*\[')
_CUT = re.compile(rb"\}\s*,\s*(?=\{)")


class NotStreamable(Exception):
    """The layout defeats the chunker (no events array found early, or a gigantic element)."""


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: Any = ""
    cat: Any = None
    pid: Any = None
    tid: Any = None
    ts: Number | None = None
    dur: Number | None = None
    args: msgspec.Raw | UnsetType = UNSET


_TYPED = msgspec.json.Decoder(list[Event])
_ANY = msgspec.json.Decoder()


def decode_events(data: bytes) -> tuple[list[Event], int]:
    """``data`` is a JSON array of events: ``(events, dropped)``; raises ``msgspec.DecodeError`` if
    it is not valid JSON at all. Events whose fields have unexpected types are dropped and counted."""
    try:
        return _TYPED.decode(data), 0
    except msgspec.DecodeError:
        items = _ANY.decode(data)  # not JSON: let it raise (a wrong cut)
    if not isinstance(items, list):
        raise msgspec.DecodeError("not an array")
    out, dropped = [], 0
    one = msgspec.json.Decoder(Event, strict=False)  # "12.5" is accepted as a number here
    for item in items:
        try:
            out.append(one.decode(orjson.dumps(item)))  # rare path: re-encode so args stay raw
        except (msgspec.ValidationError, orjson.JSONEncodeError):
            dropped += 1
    return out, dropped


class EventStream:
    """Iterate :meth:`chunks`; then ``metadata`` holds the top-level keys other than the events."""

    def __init__(self, stream: BinaryIO, chunk_bytes: int = CHUNK_BYTES) -> None:
        self._stream = stream
        self._chunk = chunk_bytes
        self._buf = b""
        self._eof = False
        self._head = b""
        self.metadata: dict[str, Any] = {}
        self.dropped = 0

    def _more(self) -> bool:
        block = self._stream.read(BLOCK_BYTES)
        if not block:
            self._eof = True
            return False
        self._buf += block
        return True

    def _find_array(self) -> None:
        while True:
            body = self._buf.lstrip()
            if body.startswith(b"["):
                self._head, self._buf = b"[", body[1:]
                return
            m = _ARRAY_START.search(self._buf)
            if m:
                self._head, self._buf = self._buf[: m.end()], self._buf[m.end() :]
                return
            if len(self._buf) > HEAD_LIMIT or not self._more():
                raise NotStreamable("no traceEvents array near the start")

    def _take(self) -> list[Event] | None:
        """Decode a prefix of the buffer ending between two events; None if no cut worked yet."""
        for tries, m in enumerate(_CUT.finditer(self._buf, min(self._chunk, len(self._buf) // 2))):
            if tries >= MAX_CUT_TRIES:
                break
            try:
                events, dropped = decode_events(b"[" + self._buf[: m.start() + 1] + b"]")
            except msgspec.DecodeError:
                continue
            self.dropped += dropped
            self._buf = self._buf[m.end() :]
            return events
        return None

    def chunks(self) -> Iterator[list[Event]]:
        self._find_array()
        while True:
            while not self._eof and len(self._buf) < 2 * self._chunk:
                self._more()
            if self._eof:
                break
            events = self._take()
            if events is not None:
                yield events
            elif len(self._buf) > MAX_BUFFER:
                raise NotStreamable("an element larger than the streaming buffer")
            else:
                self._more()
        yield self._finish()

    def _finish(self) -> list[Event]:
        """The last events, the closing bracket and whatever follows it."""
        buf = self._buf
        ends = [m.start() for m in re.finditer(rb"\]", buf)][::-1][:MAX_CUT_TRIES]
        if self._head == b"[":
            ends.insert(0, len(buf))  # Perfetto accepts an array without its closing bracket
        for end in ends:
            body = buf[:end].rstrip().removesuffix(b",")
            try:
                events, dropped = decode_events(b"[" + body + b"]")
            except msgspec.DecodeError:
                continue
            self.dropped += dropped
            self.metadata = self._frame(buf[end + 1 :])
            return events
        raise NotStreamable("the events array does not end where expected")

    def _frame(self, tail: bytes) -> dict[str, Any]:
        if self._head == b"[":
            return {}
        try:
            top = orjson.loads(self._head + b"]" + tail)
        except orjson.JSONDecodeError:
            return {}
        return {k: v for k, v in top.items() if k != "traceEvents"} if isinstance(top, dict) else {}
