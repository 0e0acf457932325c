"""The wire format between a training process and its drain process (one pipe, one direction).

A frame is a fixed 29-byte header — kind, stream id, two signed 64-bit fields, one 32-bit field and
the payload length — followed by the payload. Frames are only ever appended whole to the sender's
outbox and the pipe is a byte stream, so a reader that keeps the unparsed tail between reads sees
every frame whole and in order. Field meanings per kind:

==========  ===================  ============  ==========  ==========================================
kind        a                    b             c           payload
==========  ===================  ============  ==========  ==========================================
OPEN        —                    —             —           JSON ``{"path", "record", "resume"}``
LINES       emitted (cumulative) line count    —           whole lines, each ending in ``\\n``
HEADER      —                    line count    —           lines to replay at the top of a new file
RECORD      emitted (cumulative) sequence      —           the record document (JSON object)
SYNC        token                —             —           —
CLOSE       —                    —             —           —
==========  ===================  ============  ==========  ==========================================

``emitted`` counts every line the process ever handed to that stream (also those it had to drop
itself), so the writer can always state ``dropped = emitted − on disk`` without any other message.
"""

from __future__ import annotations

import itertools
import os
import select
import struct
from collections import deque
from typing import NamedTuple

OPEN, LINES, HEADER, RECORD, SYNC, CLOSE = 1, 2, 3, 4, 5, 6
KINDS = frozenset((OPEN, LINES, HEADER, RECORD, SYNC, CLOSE))

_HEADER = struct.Struct("<BIqqII")
HEADER_SIZE = _HEADER.size
MAX_PAYLOAD = 1 << 30  # a length beyond this means the stream is corrupt, not a real frame


class Frame(NamedTuple):
    kind: int
    sid: int
    a: int
    b: int
    c: int
    payload: bytes


def encode(kind: int, sid: int, payload: bytes = b"", a: int = 0, b: int = 0, c: int = 0) -> bytes:
    """One frame, header and payload, ready to append to an outbox."""
    return _HEADER.pack(kind, sid, a, b, c, len(payload)) + payload


class Outbox:
    """Frames waiting for the pipe, kept as chunks (header, payload) and written with ``writev``:
    a line batch is copied once in the process (when joined), then once into the kernel."""

    IOV_MAX = 1024

    def __init__(self) -> None:
        self._chunks: deque[bytes | memoryview] = deque()
        self._size = 0

    def add(self, kind: int, sid: int, payload: bytes = b"", a: int = 0, b: int = 0, c: int = 0) -> None:
        self._chunks.append(_HEADER.pack(kind, sid, a, b, c, len(payload)))
        if payload:
            self._chunks.append(payload)
        self._size += HEADER_SIZE + len(payload)

    def __len__(self) -> int:
        return self._size

    def clear(self) -> None:
        self._chunks.clear()
        self._size = 0

    def write_to(self, fd: int) -> None:
        """Write what ``fd`` takes (raises ``BlockingIOError`` when it takes nothing, ``OSError``)."""
        chunks = self._chunks
        while chunks:  # islice, not chunks[i]: indexing a deque is O(i), ~30 µs for 1024 of a backlog
            n = os.writev(fd, list(itertools.islice(chunks, self.IOV_MAX)))
            self._size -= n
            while n:
                first = chunks[0]
                if n >= len(first):
                    n -= len(first)
                    chunks.popleft()
                else:
                    chunks[0] = memoryview(first)[n:]
                    n = 0

    def take_all(self) -> bytes:
        data = b"".join(self._chunks)
        self.clear()
        return data


class PipeOut:
    """The write end of a non-blocking pipe. Once a write found it full, later writes first ask
    ``poll`` (~1 µs) whether it has room again: a pump whose drain is stopped or starved then
    spends no time building write vectors over its backlog every cycle while holding the GIL."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.full = False
        self._ready = select.poll()
        self._ready.register(fd, select.POLLOUT)  # POLLERR (reader gone) wakes it too: EPIPE follows

    def write(self, outbox: Outbox) -> None:
        """What the pipe takes now (raises ``OSError`` such as ``EPIPE``, never ``BlockingIOError``)."""
        if self.full and not self._ready.poll(0):
            return
        try:
            outbox.write_to(self.fd)
            self.full = False
        except BlockingIOError:
            self.full = True


class CorruptStream(ValueError):
    """The bytes do not frame: the sender and the reader disagree; nothing after this is usable."""


class Parser:
    """Turns arbitrary chunks of the byte stream back into whole frames, in order."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> list[Frame]:
        buf = self._buf
        buf += chunk
        out: list[Frame] = []
        pos = 0
        end = len(buf)
        with memoryview(buf) as view:  # one copy per payload (bytes of a view), none to slice
            while end - pos >= HEADER_SIZE:
                kind, sid, a, b, c, length = _HEADER.unpack_from(buf, pos)
                if kind not in KINDS or length > MAX_PAYLOAD:
                    raise CorruptStream(f"bad frame header at byte {pos}: kind {kind}, length {length}")
                stop = pos + HEADER_SIZE + length
                if stop > end:
                    break
                out.append(Frame(kind, sid, a, b, c, bytes(view[pos + HEADER_SIZE : stop])))
                pos = stop
        del buf[:pos]
        return out

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame kept for the next chunk."""
        return len(self._buf)
