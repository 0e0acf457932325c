"""The one registry of input formats. Adding a format: one folder (or module) + one line in ``FORMATS``.

Every stage finds a format here by its kind, or by sniffing a file's head, and asks it what it needs
(:class:`.base.Format`: hints for planning, the read, its clock probe and partner rules, its manifest
counts). Outside this package no code compares a kind string:
``tests/project/test_package_hygiene.py`` checks.
"""

from __future__ import annotations

from ..files.sources import Head, with_tail
from .areal import FORMATS as AREAL_FORMATS
from .base import Format, Hints, ReadContext, ReadResult
from .base.chrome_json import NotATrace
from .chrome_trace import ChromeTrace
from .kineto import Kineto
from .merge_output import MergeOutput
from .metric_samples import MetricSamples
from .nemo_rl_perfetto import NemoRLPerfetto
from .otlp import Otlp
from .process_record import ProcessRecord
from .proton import Proton
from .rl_insight.format import RLInsight
from .viztracer import VizTracer

FORMATS: tuple[Format, ...] = (
    ProcessRecord(),
    MergeOutput(),
    RLInsight(),
    Kineto(),
    VizTracer(),
    Proton(),
    ChromeTrace(),
    MetricSamples(),
    *AREAL_FORMATS,
    Otlp(),
    NemoRLPerfetto(),
)
_BY_KIND = {f.kind: f for f in FORMATS}
UNKNOWN = "unknown"  # the kind of a file no format claims (or an empty one): reported, never read
EVENT_KINDS = frozenset(f.kind for f in FORMATS if f.events)  # files that hold timeline events

__all__ = [
    "EVENT_KINDS",
    "FORMATS",
    "UNKNOWN",
    "Format",
    "Hints",
    "NotATrace",
    "ReadContext",
    "ReadResult",
    "format_for",
    "format_of",
    "manifest_counts",
    "sniff",
]


def format_for(kind: str) -> Format:
    """The format of ``kind`` (KeyError for a kind no format has, such as :data:`UNKNOWN`)."""
    return _BY_KIND[kind]


def format_of(kind: str) -> Format | None:
    """The format of ``kind``, or None (an unknown file)."""
    return _BY_KIND.get(kind)


def manifest_counts() -> list[tuple[str, bool]]:
    """(stats key, always shown) of every format's own manifest counts: those every manifest has first."""
    keys = [c for f in FORMATS for c in f.counts]
    return sorted(keys, key=lambda c: not c[1])


DECISIVE = 90  # a score this high is the format's own key or name; below it the tail may decide


def sniff(head: Head) -> tuple[Format | None, Head]:
    """The format most sure the file is its own (None when none claims it), and the head it
    judged: when no format is sure from the first bytes, the file's last bytes are read as well
    (formats put their identifying keys where they like: VizTracer's metadata and some Kineto
    exports' ``schemaVersion`` come after the events)."""
    best, score = _best(head)
    if score < DECISIVE:
        full = with_tail(head)
        if full is not head:
            head = full
            best, score = _best(head)
    return best, head


def _best(head: Head) -> tuple[Format | None, int]:
    best, best_score = None, 0
    for fmt in FORMATS:
        score = fmt.sniff(head)
        if score > best_score:
            best, best_score = fmt, score
    return best, best_score
