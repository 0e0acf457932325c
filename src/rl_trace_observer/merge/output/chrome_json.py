"""Chrome JSON output (``.json`` and ``.json.gz`` as ONE gzip member), written as a stream.

Workers turn each artifact's events into pieces of the ``traceEvents`` array (every piece ends with
a comma); the parent writes the header, the pieces in order and, last, the process/thread metadata
events, the final one without a comma. Perfetto applies metadata events wherever they appear.

Times: ``ts = (ts_ns - base_ns) / 1000`` and ``dur = dur_ns / 1000``: a double holds every ns below
2**53 exactly, and its shortest repr prints at most 3 decimals, so Perfetto reads back the exact ns.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, BinaryIO

import msgspec
import orjson
from msgspec import UNSET

from ...common import twins
from ..output.compress import GzipMember, deflate_piece, write_any_piece
from ..output.spill import Spilled
from ..timeline.model import Event

PIECE_EVENTS = 65536
_ENCODER = msgspec.json.Encoder()
NATIVE_TWIN = "rl_trace_observer.merge.output._chrome_json_native"

Piece = bytes | bytearray | tuple[bytes, int, int] | Spilled  # raw JSON; deflated, crc32, length; a part file


def encode_pieces(
    events: list[Event], base_ns: int, gzip: bool, convert: bool = True
) -> tuple[list[Piece], int, int]:
    """Events → comma-terminated JSON pieces (deflated when ``gzip``); also (min, max) of ts_ns.

    ``convert=False``: the times are already output µs (the fused fast path did it).
    """
    pieces: list[Piece] = []
    lo, hi = 1 << 63, -(1 << 63)
    native = twins.twin(NATIVE_TWIN)
    for start in range(0, len(events), PIECE_EVENTS):
        part = events[start : start + PIECE_EVENTS]
        for e in part if convert else ():
            t = e.ts
            if t < lo:  # type: ignore[operator]
                lo = t  # type: ignore[assignment]
            if t > hi:  # type: ignore[operator]
                hi = t  # type: ignore[assignment]
            e.ts = (t - base_ns) / 1000  # type: ignore[operator]
            d = e.dur
            if d is not UNSET:
                e.dur = d / 1000
        raw = native.encode_piece(part, _ENCODER.encode) if native is not None else encode_piece(part)
        pieces.append(deflate_piece(raw) if gzip else raw)
    return pieces, lo, hi


def encode_piece(events: list[Event]) -> bytearray:
    """``b" e1,e2,...,en,\\n"``: msgspec's ``[e1,e2]`` made a comma-terminated piece in place, no copy.
    The reference for the compiled twin (``_chrome_json_native.encode_piece``: the same bytes)."""
    raw = bytearray()
    _ENCODER.encode_into(events, raw)
    raw[0], raw[-1] = 0x20, 0x2C
    raw += b"\n"
    return raw


def metadata_events(
    processes: Iterable[tuple[int, str, int]], threads: Iterable[tuple[int, int, str, int]]
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for pid, name, sort in processes:
        out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        out.append(
            {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": sort}}
        )
    for pid, tid, name, sort in threads:
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        out.append(
            {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": sort}}
        )
    return out


class ChromeJsonWriter:
    """Parent side: header, pieces, metadata, closing brackets; gzip as one member when asked."""

    def __init__(self, out: BinaryIO, *, gzip: bool, header: dict[str, Any]) -> None:
        self._file = out
        self._gz = GzipMember(out) if gzip else None
        self.bytes_written = 0
        self.pieces = 0
        meta = orjson.dumps(header)
        self._write(b'{"rl_trace_observer":' + meta + b',"displayTimeUnit":"ms","traceEvents":[\n')

    def _write(self, data: bytes) -> None:
        if self._gz is not None:
            self._gz.write(data)
        else:
            self._file.write(data)
            self.bytes_written += len(data)

    def add(self, pieces: list[Piece]) -> None:
        for piece in pieces:
            self.pieces += 1
            self.bytes_written += write_any_piece(self._file, self._gz, piece)

    def close(self, metadata: list[dict[str, Any]]) -> None:
        if self.pieces and not metadata:
            raise AssertionError("events were written but no process was declared")
        body = b",\n".join(orjson.dumps(m) for m in metadata)
        self._write(body + b"\n]}\n")
        if self._gz is not None:
            self._gz.close()
            self.bytes_written = self._gz.compressed_bytes
