"""The one registry of source formats. Adding a format: one module, one line in ``READERS``."""

from __future__ import annotations

from ..sources import Head
from .base import ReadContext, Reader, ReadResult
from .kineto import KinetoReader
from .process_record import OwnOutputReader, ProcessRecordReader
from .proton import ChromeJsonReader, ProtonReader
from .rl_insight import RLInsightReader
from .viztracer import VizTracerReader

READERS: tuple[Reader, ...] = (
    ProcessRecordReader(),
    OwnOutputReader(),
    RLInsightReader(),
    KinetoReader(),
    VizTracerReader(),
    ProtonReader(),
    ChromeJsonReader(),
)
_BY_KIND = {r.kind: r for r in READERS}

__all__ = ["READERS", "ReadContext", "ReadResult", "Reader", "reader_for", "sniff"]


def reader_for(kind: str) -> Reader:
    return _BY_KIND[kind]


def sniff(head: Head) -> Reader | None:
    """The reader most sure the file is its format, or None when none claims it."""
    best, best_score = None, 0
    for reader in READERS:
        score = reader.sniff(head)
        if score > best_score:
            best, best_score = reader, score
    return best
