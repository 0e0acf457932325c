"""A samples file (``*.samples.jsonl``, docs/FORMATS.md "Metric samples") as plain data.

Pure: bytes in, :class:`SamplesFile` out. A cut last line (the sampler was killed) is dropped and
the file marked incomplete; a bad line elsewhere is counted and skipped, never fatal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ...timeline.model import BAD_JSON

SCHEMA_PREFIX = "rl-trace-samples/"
_BAD_LINE: tuple[type[Exception], ...] = (*BAD_JSON, ValueError, TypeError, KeyError)
_SPECIAL = {"NaN": math.nan, "+Inf": math.inf, "-Inf": -math.inf, "Inf": math.inf}


@dataclass
class SeriesDef:
    id: int
    src: int
    family: str
    type: str
    name: str
    labels: dict[str, str]


@dataclass
class SourceDef:
    src: int
    kind: str  # prometheus, gpu, host
    fields: dict[str, Any]


@dataclass
class Sample:
    src: int
    t: int  # wall-clock ns (the request's midpoint)
    d: int  # how long sampling took, ns
    values: list[tuple[int, float]]  # (series id, value): the series that changed


@dataclass
class SamplesFile:
    meta: dict[str, Any] = field(default_factory=dict)
    sources: dict[int, SourceDef] = field(default_factory=dict)
    series: dict[int, SeriesDef] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)  # down / up / gpu_users / stats
    bad_lines: int = 0
    complete: bool = True

    def last_stats(self) -> dict[str, Any] | None:
        stats = [e for e in self.events if e.get("k") == "stats"]
        return stats[-1] if stats else None


def _number(v: Any) -> float:
    if isinstance(v, bool):
        raise ValueError("a boolean is not a sample value")
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str) and v in _SPECIAL:
        return _SPECIAL[v]
    raise ValueError(f"not a sample value: {v!r}")


def is_samples(head: bytes) -> bool:
    """Whether these first bytes are a samples file (its first line is the ``meta`` line)."""
    first = head.split(b"\n", 1)[0]
    return first.startswith(b'{"k":"meta"') and SCHEMA_PREFIX.encode() in first


def decode(data: bytes) -> SamplesFile:
    out = SamplesFile()
    end = data.rfind(b"\n") + 1
    if data[end:].strip():
        out.complete = False  # a cut last line: the lines before it are whole
    for line in data[:end].split(b"\n"):
        if not line.strip():
            continue
        try:
            _line(msgspec.json.decode(line), out)
        except _BAD_LINE:
            out.bad_lines += 1
    return out


def _line(obj: Any, out: SamplesFile) -> None:
    if not isinstance(obj, dict):
        raise ValueError("not an object")
    kind = obj["k"]
    if kind == "s":
        values = [(int(sid), _number(v)) for sid, v in obj["v"]]
        out.samples.append(Sample(int(obj["src"]), int(obj["t"]), int(obj.get("d") or 0), values))
    elif kind == "series":
        labels = {str(k): str(v) for k, v in (obj.get("labels") or {}).items()}
        sid = int(obj["id"])
        out.series[sid] = SeriesDef(
            sid, int(obj["src"]), str(obj["family"]), str(obj["type"]), str(obj["name"]), labels
        )
    elif kind == "source":
        src = int(obj["src"])
        fields = {k: v for k, v in obj.items() if k not in ("k", "src", "kind")}
        out.sources[src] = SourceDef(src, str(obj["kind"]), fields)
    elif kind == "meta":
        out.meta = obj
    else:
        out.events.append(obj)
