"""The one registry of source formats. Adding a format: one module, one line in ``READERS``."""

from __future__ import annotations

from ..files.sources import Head, with_tail
from .base import ReadContext, Reader, ReadResult
from .kineto import KinetoReader
from .process_record import OwnOutputReader, ProcessRecordReader
from .proton import ChromeJsonReader, ProtonReader
from .rl_insight.reader import RLInsightReader
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


DECISIVE = 90  # a score this high is the format's own key or name; below it the tail may decide


def sniff(head: Head) -> tuple[Reader | None, Head]:
    """The reader most sure the file is its format (None when none claims it), and the head it
    judged: when no reader is sure from the first bytes, the file's last bytes are read as well
    (formats put their identifying keys where they like: VizTracer's metadata and some Kineto
    exports' ``schemaVersion`` come after the events)."""
    best, score = _best(head)
    if score < DECISIVE:
        full = with_tail(head)
        if full is not head:
            head = full
            best, score = _best(head)
    return best, head


def _best(head: Head) -> tuple[Reader | None, int]:
    best, best_score = None, 0
    for reader in READERS:
        score = reader.sniff(head)
        if score > best_score:
            best, best_score = reader, score
    return best, best_score
