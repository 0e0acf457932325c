"""The protobuf wire format, read by hand: the merger depends on no protobuf runtime.

OTLP's messages use four wire types: varint (0), 64-bit (1), length-delimited (2) and 32-bit (5).
:func:`fields` walks one message's fields; a message that ends inside a field, or a wire type the
format never uses (3, 4: groups), raises :class:`WireError`, so a cut or foreign file is refused
instead of yielding half a field.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

VARINT, I64, LEN, I32 = 0, 1, 2, 5
_MAX_VARINT_BYTES = 10


class WireError(ValueError):
    """Bytes that are not a well-formed protobuf message."""


def varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """The unsigned varint at ``pos`` and the position after it."""
    value = shift = 0
    for i in range(pos, min(pos + _MAX_VARINT_BYTES, len(buf))):
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i + 1
        shift += 7
    raise WireError("varint cut or longer than 10 bytes")


def fields(buf: bytes | memoryview, cut_ok: bool = False) -> Iterator[tuple[int, int, int | memoryview]]:
    """(field number, wire type, value) of each field: an int for varint / 64-bit / 32-bit fields,
    a memoryview of the payload for length-delimited ones. ``cut_ok``: a length-delimited field the
    buffer cuts (a file's head) yields what there is of it, and ends the walk.

    One-byte keys and lengths (nearly all of OTLP's) are read inline: this loop is the reader's cost."""
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    pos, end = 0, len(view)
    while pos < end:
        key = view[pos]
        if key < 0x80:
            pos += 1
        else:
            key, pos = varint(view, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise WireError("field number 0")
        if wire == LEN:
            if pos >= end:
                raise WireError("length-delimited field cut")
            size = view[pos]
            if size < 0x80:
                pos += 1
            else:
                size, pos = varint(view, pos)
            if pos + size > end:
                if cut_ok:
                    yield number, wire, view[pos:end]
                    return
                raise WireError("length-delimited field runs past the message")
            yield number, wire, view[pos : pos + size]
            pos += size
        elif wire == VARINT:
            value, pos = varint(view, pos)
            yield number, wire, value
        elif wire == I64:
            if pos + 8 > end:
                raise WireError("64-bit field cut")
            yield number, wire, int.from_bytes(view[pos : pos + 8], "little")
            pos += 8
        elif wire == I32:
            if pos + 4 > end:
                raise WireError("32-bit field cut")
            yield number, wire, int.from_bytes(view[pos : pos + 4], "little")
            pos += 4
        else:
            raise WireError(f"wire type {wire} (groups) is not used by OTLP")


def as_double(bits: int) -> float:
    """A ``double`` field's 64 bits as the float they encode."""
    return float(struct.unpack("<d", bits.to_bytes(8, "little"))[0])


def as_int64(value: int) -> int:
    """A varint ``int64`` (two's complement in 64 bits) as a signed int."""
    return value - (1 << 64) if value >= 1 << 63 else value


def text(value: int | memoryview) -> str:
    if not isinstance(value, memoryview):
        raise WireError("a string field is not length-delimited")
    return bytes(value).decode("utf-8", "replace")


def blob(value: int | memoryview) -> bytes:
    if not isinstance(value, memoryview):
        raise WireError("a bytes field is not length-delimited")
    return bytes(value)


def number(value: int | memoryview) -> int:
    if isinstance(value, memoryview):
        raise WireError("a number field is length-delimited")
    return value
