"""What an OTLP trace file holds, read from either encoding (protobuf or OTLP/JSON) into one shape.

Ids are lower-case hex text in both (OTLP/JSON writes them so; protobuf's bytes are turned into it),
so a parent or a link written in one encoding finds its span in the other. Times are unix ns, as the
SDK read them from its host's wall clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Span.kind (OTLP's SpanKind enum)
KINDS = ("unspecified", "internal", "server", "client", "producer", "consumer")
# Span.status.code (OTLP's StatusCode enum)
STATUS = ("unset", "ok", "error")
# Span.flags: bit 8 says whether bit 9 is known; bit 9 says the parent span is in another process
HAS_IS_REMOTE, IS_REMOTE = 0x100, 0x200


@dataclass
class Link:
    trace_id: str
    span_id: str
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass
class SpanEvent:
    name: str
    time_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass
class Span:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    events: list[SpanEvent] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    status_code: int = 0
    status_message: str = ""
    flags: int = 0
    scope: str = ""


@dataclass
class ResourceSpans:
    """One process's spans (a resource) as one export carried them."""

    attributes: dict[str, Any] = field(default_factory=dict)
    spans: list[Span] = field(default_factory=list)


@dataclass
class Decoded:
    resources: list[ResourceSpans] = field(default_factory=list)
    bad: int = 0  # spans (or JSON lines) that could not be read
    why: dict[str, int] = field(default_factory=dict)
    encoding: str = ""  # "protobuf (<framing>)" or "json"

    def drop(self, why: str, n: int = 1) -> None:
        self.bad += n
        self.why[why] = self.why.get(why, 0) + n


def kind_name(kind: int) -> str:
    return KINDS[kind] if 0 <= kind < len(KINDS) else f"kind {kind}"
