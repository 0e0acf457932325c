"""AReaL's JSONL files, one JSON object a line, read so that no line can cost more than itself.

AReaL appends each batch of lines and fsyncs (``perf_tracer.save`` / ``SessionTracer.flush``), so a
process killed mid-write leaves a torn last line; a disk error or a hand edit can leave garbage
anywhere. Each bad line is counted under the reason it failed, with its 1-based number (the first
few), so the manifest can name it; a torn last line is told apart (the file is incomplete, not bad).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import msgspec

from ...timeline.model import BAD_JSON

NAMED_LINES = 5  # line numbers kept per reason: enough to find them, never a list of millions
NOT_JSON = "not JSON"
NOT_OBJECT = "not a JSON object"
INVALID = "fields of the wrong type"
T = TypeVar("T")


@dataclass
class LineCounts:
    """What the lines of one file turned out to be."""

    lines: int = 0  # non-blank lines, torn last line included
    bad: dict[str, int] = field(default_factory=dict)  # reason -> lines
    where: dict[str, list[int]] = field(default_factory=dict)  # reason -> first line numbers
    torn: bool = False  # the last line has no newline and does not decode: the writer was cut off

    def drop(self, reason: str, number: int) -> None:
        self.bad[reason] = self.bad.get(reason, 0) + 1
        seen = self.where.setdefault(reason, [])
        if len(seen) < NAMED_LINES:
            seen.append(number)

    @property
    def dropped(self) -> int:
        return sum(self.bad.values())

    def summary(self) -> str:
        """``3 lines not JSON (lines 4, 9, 12)``, one clause per reason."""
        parts = []
        for reason, n in sorted(self.bad.items()):
            at = ", ".join(str(i) for i in self.where.get(reason, []))
            more = ", ..." if n > len(self.where.get(reason, [])) else ""
            parts.append(f"{n} line{'s' if n > 1 else ''} {reason} (line{'s' if n > 1 else ''} {at}{more})")
        return "; ".join(parts)


def split_lines(data: bytes) -> Iterator[tuple[int, bytes, bool]]:
    """(1-based line number, line, is the unterminated last line) of every non-blank line."""
    number, start, size = 0, 0, len(data)
    while start < size:
        end = data.find(b"\n", start)
        last = end < 0
        if last:
            end = size
        number += 1
        line = data[start:end].strip()
        if line:
            yield number, line, last
        start = end + 1


def decode_lines(data: bytes, decoder: msgspec.json.Decoder[T]) -> tuple[list[tuple[int, T]], LineCounts]:
    """Every line ``decoder`` accepts, with its number; the others counted by reason."""
    counts = LineCounts()
    out: list[tuple[int, T]] = []
    for number, line, last in split_lines(data):
        counts.lines += 1
        try:
            out.append((number, decoder.decode(line)))
            continue
        except msgspec.ValidationError:
            reason = NOT_OBJECT if line[:1] != b"{" else INVALID
        except BAD_JSON:
            reason = NOT_JSON
        if last and reason == NOT_JSON:
            counts.torn = True
        counts.drop(reason, number)
    return out, counts
