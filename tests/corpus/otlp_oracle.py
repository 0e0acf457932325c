"""What OTLP protobuf files hold, read with the REAL ``opentelemetry-proto`` package: the independent
side the merge's own wire reader is checked against (ids, parents, buckets, expected goodput)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

BUCKETS = ("productive", "overhead", "idle", "wasted")


def value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@dataclass
class OSpan:
    role: str
    pid: int
    name: str
    trace_id: str
    span_id: str
    parent: str
    start: int
    end: int
    attrs: dict[str, Any] = field(default_factory=dict)
    links: list[str] = field(default_factory=list)


def read_spans(files: list[Path]) -> list[OSpan]:
    out = []
    for path in files:
        req = ExportTraceServiceRequest()
        req.ParseFromString(path.read_bytes())
        for rs in req.resource_spans:
            res = {kv.key: value(kv.value) for kv in rs.resource.attributes}
            role = res.get("rl.worker_group") or res["service.name"]
            for ss in rs.scope_spans:
                for s in ss.spans:
                    out.append(
                        OSpan(
                            role,
                            int(res["process.pid"]),
                            s.name,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            s.start_time_unix_nano,
                            s.end_time_unix_nano,
                            {kv.key: value(kv.value) for kv in s.attributes},
                            [f"{k.trace_id.hex()}:{k.span_id.hex()}" for k in s.links],
                        )
                    )
    return out


def _union(ints: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(i for i in ints if i[1] > i[0]):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _minus(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for lo, hi in a:
        cur = lo
        for blo, bhi in b:
            if bhi <= cur or blo >= hi:
                continue
            if blo > cur:
                out.append((cur, blo))
            cur = max(cur, bhi)
        if cur < hi:
            out.append((cur, hi))
    return out


def _len(ints: list[tuple[int, int]]) -> int:
    return sum(hi - lo for lo, hi in ints)


def expected_goodput(spans: list[OSpan]) -> dict[tuple[int, str], dict[str, int]]:
    """(step, role) -> bucket ns, by the report's rule: each moment once, productive first, then
    wasted, then overhead, idle the rest of the step (a span's own ``rl.bucket`` decides)."""
    steps = {int(s.attrs["rl.iteration"]): (s.start, s.end) for s in spans if s.name == "rl.grpo.step"}
    roles = sorted({s.role for s in spans if s.attrs.get("rl.bucket") in BUCKETS})
    out = {}
    for step, (lo, hi) in steps.items():
        for role in roles:

            def clip(bucket: str, role: str = role, lo: int = lo, hi: int = hi) -> list[tuple[int, int]]:
                return _union(
                    [
                        (max(s.start, lo), min(s.end, hi))
                        for s in spans
                        if s.role == role and s.attrs.get("rl.bucket") == bucket
                    ]
                )

            p = clip("productive")
            w = _minus(clip("wasted"), p)
            o = _minus(_minus(clip("overhead"), p), w)
            wall = hi - lo
            out[(step, role)] = {
                "productive_ns": _len(p),
                "wasted_ns": _len(w),
                "overhead_ns": _len(o),
                "idle_ns": wall - _len(p) - _len(w) - _len(o),
            }
    return out
