"""Protobuf wire format by hand: the few encoders the ``.pftrace`` writer needs, and a small reader.

Why by hand: a protobuf runtime plus Perfetto's generated classes would be a heavy dependency for ~15
field types, and building message objects per event is several times slower than joining bytes. The
reader (:func:`iter_fields`) exists so tests can check the encoding without a browser.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator

MASK64 = (1 << 64) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

# Varints come from tables, 14 bits at a time: a bit-by-bit loop is the writer's hottest code.
SMALL_VARINTS = [bytes((i,)) for i in range(0x80)] + [
    bytes(((i & 0x7F) | 0x80, i >> 7)) for i in range(0x80, 0x4000)
]
_CONT = [bytes(((i & 0x7F) | 0x80, (i >> 7) | 0x80)) for i in range(0x4000)]  # 14 bits, more follow


def varint(value: int) -> bytes:
    """Base-128 varint; negative numbers are sign-extended to 64 bits (ten bytes), as protobuf does."""
    if 0 <= value < 0x4000:
        return SMALL_VARINTS[value]
    value &= MASK64
    if value < 0x10000000:
        return _CONT[value & 0x3FFF] + SMALL_VARINTS[value >> 14]
    if value < 0x40000000000:  # up to 42 bits: ns timestamps up to ~73 minutes after the base
        return _CONT[value & 0x3FFF] + _CONT[(value >> 14) & 0x3FFF] + SMALL_VARINTS[value >> 28]
    out = b""
    while value >= 0x4000:
        out += _CONT[value & 0x3FFF]
        value >>= 14
    return out + SMALL_VARINTS[value]


def key(field_no: int, wire: int) -> bytes:
    """A field's tag: field number and wire type (0 varint, 1 fixed64, 2 length-delimited)."""
    return varint(field_no << 3 | wire)


def ld(field_no: int, payload: bytes) -> bytes:
    """A length-delimited field: string, bytes or sub-message."""
    return key(field_no, 2) + varint(len(payload)) + payload


def uint(field_no: int, value: int) -> bytes:
    return key(field_no, 0) + varint(value)


def text(field_no: int, value: str) -> bytes:
    return ld(field_no, value.encode("utf-8", "replace"))


pack_double = struct.Struct("<d").pack
pack_fixed64 = struct.Struct("<Q").pack


def stable_id(*parts: object) -> int:
    """Deterministic non-zero 63-bit id (track uuids, flow ids): same input, same id, in any process.

    The type name is part of the key, so flow id ``1`` and ``"1"`` stay distinct.
    """
    raw = "\x1f".join(f"{type(p).__name__}:{p}" for p in parts).encode("utf-8", "replace")
    value = int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little") >> 1
    return value or 1


def fan_id(flow_id: int, seq: int) -> int:
    """The id of the ``seq``-th extra link of a flow with several ends (seq 0 is the flow's own id)."""
    return stable_id("fan", flow_id, seq) if seq else flow_id


# ----------------------------------------------------------------------------------- reading
def read_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """(value, next position)."""
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def iter_fields(data: bytes | memoryview) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) for each field of one message: varints and fixed64 as ints
    (fixed64 unsigned), length-delimited fields as bytes. Raises ValueError on other wire types."""
    pos, end = 0, len(data)
    while pos < end:
        tag, pos = read_varint(data, pos)
        field_no, wire = tag >> 3, tag & 7
        value: int | bytes
        if wire == 0:
            value, pos = read_varint(data, pos)
        elif wire == 1:
            value = int.from_bytes(data[pos : pos + 8], "little")
            pos += 8
        elif wire == 2:
            size, pos = read_varint(data, pos)
            value = bytes(data[pos : pos + size])
            pos += size
        elif wire == 5:
            value = int.from_bytes(data[pos : pos + 4], "little")
            pos += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire} at byte {pos}")
        yield field_no, wire, value
