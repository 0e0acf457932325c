"""Property tests of the OTLP readers: the hand-written protobuf wire reader and the OTLP/JSON reader
give back exactly what the REAL ``opentelemetry-proto`` messages hold (built by hypothesis, encoded by
protobuf itself), in every framing; any bytes at all are read or refused, never raised out of the
format; a cut file keeps its whole resource blocks and says it is incomplete."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.internal.encoder import _VarintBytes  # type: ignore[attr-defined]
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from rl_trace_observer.merge.files.sources import discover, read_head
from rl_trace_observer.merge.formats import ReadContext, sniff
from rl_trace_observer.merge.formats.otlp import Otlp, otlp_json, protobuf

from ..corpus.otlp_collector import to_otlp_json

T0 = 1_780_000_000_000_000_000
ids16 = st.binary(min_size=16, max_size=16).filter(any)
ids8 = st.binary(min_size=8, max_size=8).filter(any)
keys = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)
scalars = st.one_of(
    st.text(max_size=20).map(lambda v: ("string_value", v)),
    st.booleans().map(lambda v: ("bool_value", v)),
    st.integers(-(1 << 63), (1 << 63) - 1).map(lambda v: ("int_value", v)),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda v: ("double_value", v)),
)


def _any(kind_value: tuple[str, Any]) -> AnyValue:
    kind, value = kind_value
    return AnyValue(**{kind: value})


@st.composite
def spans(draw: st.DrawFn) -> Span:
    start = T0 + draw(st.integers(0, 10**12))
    attrs = draw(st.dictionaries(keys, scalars, max_size=4))
    s = Span(
        trace_id=draw(ids16),
        span_id=draw(ids8),
        parent_span_id=draw(st.one_of(st.just(b""), ids8)),
        name=draw(st.text(max_size=20)),
        kind=draw(st.integers(0, 5)),
        start_time_unix_nano=start,
        end_time_unix_nano=start + draw(st.integers(0, 10**10)),
        attributes=[KeyValue(key=k, value=_any(v)) for k, v in attrs.items()],
    )
    for _ in range(draw(st.integers(0, 2))):
        s.links.add(trace_id=draw(ids16), span_id=draw(ids8))
    if draw(st.booleans()):
        s.events.add(time_unix_nano=start, name=draw(st.text(max_size=8)))
    return s


@st.composite
def requests(draw: st.DrawFn) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(1, 3))):
        rs = ResourceSpans()
        rs.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value="svc")))
        rs.resource.attributes.append(
            KeyValue(key="process.pid", value=AnyValue(int_value=draw(st.integers(1, 1 << 22))))
        )
        ss = ScopeSpans()
        ss.scope.name = draw(st.text(max_size=8))
        ss.spans.extend(draw(st.lists(spans(), min_size=1, max_size=4)))
        rs.scope_spans.append(ss)
        req.resource_spans.append(rs)
    return req


def _expected(req: ExportTraceServiceRequest) -> list[tuple[Any, ...]]:
    def val(v: AnyValue) -> Any:
        return getattr(v, v.WhichOneof("value"))

    return [
        (
            s.trace_id.hex(),
            s.span_id.hex(),
            s.parent_span_id.hex(),
            s.name,
            s.kind,
            s.start_time_unix_nano,
            s.end_time_unix_nano,
            {kv.key: val(kv.value) for kv in s.attributes},
            [(k.trace_id.hex(), k.span_id.hex()) for k in s.links],
            [(e.name, e.time_unix_nano) for e in s.events],
        )
        for rs in req.resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
    ]


def _got(decoded: Any) -> list[tuple[Any, ...]]:
    return [
        (
            s.trace_id,
            s.span_id,
            s.parent_span_id,
            s.name,
            s.kind,
            s.start_ns,
            s.end_ns,
            s.attributes,
            [(k.trace_id, k.span_id) for k in s.links],
            [(e.name, e.time_ns) for e in s.events],
        )
        for block in decoded.resources
        for s in block.spans
    ]


@pytest.fixture(params=[False, True], ids=["wire walk", "protobuf runtime"])
def runtime(request: pytest.FixtureRequest) -> Iterator[bool]:
    """Both protobuf paths: the merger's own wire walk, and opentelemetry-proto's parser where installed."""
    was = protobuf.USE_RUNTIME
    protobuf.USE_RUNTIME = request.param
    try:
        yield request.param
    finally:
        protobuf.USE_RUNTIME = was


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(requests(), min_size=1, max_size=3), st.sampled_from(["bare", "varint", "be32"]))
def test_protobuf_reader_matches_protobuf_in_every_framing(
    runtime: bool, reqs: list[Any], framing: str
) -> None:
    bodies = [r.SerializeToString() for r in reqs]
    if framing == "bare":
        reqs, data = reqs[:1], bodies[0]
    elif framing == "varint":
        data = b"".join(_VarintBytes(len(b)) + b for b in bodies)
    else:
        data = b"".join(struct.pack(">I", len(b)) + b for b in bodies)
    decoded, whole = protobuf.decode(data)
    assert whole and decoded.bad == 0
    assert _got(decoded) == [x for r in reqs for x in _expected(r)]


@settings(max_examples=40, deadline=None)
@given(requests(), st.booleans())
def test_json_reader_matches_protobufs_json_mapping(req: Any, lines: bool) -> None:
    doc = to_otlp_json(req.SerializeToString())
    data = (json.dumps(doc) + "\n") * (2 if lines else 1)
    decoded, whole = otlp_json.decode(data.encode())
    assert whole and decoded.bad == 0
    want = _expected(req) * (2 if lines else 1)
    got = _got(decoded)
    # JSON doubles round-trip through text: compare them as floats
    assert [g[:7] + g[8:] for g in got] == [w[:7] + w[8:] for w in want]
    assert [sorted(g[7]) for g in got] == [sorted(w[7]) for w in want]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=400))
def test_any_bytes_are_read_or_refused(runtime: bool, data: bytes) -> None:
    res = Otlp().read(data, ReadContext("x.binpb", "x.binpb"))
    assert all(isinstance(e.ts, int) for e in res.events)
    res = Otlp().read(b"{" + data, ReadContext("x.otlp.json", "x.otlp.json"))
    assert all(isinstance(e.ts, int) for e in res.events)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests(), st.data())
def test_a_cut_protobuf_keeps_its_whole_blocks_and_says_so(
    runtime: bool, req: Any, data: st.DataObject
) -> None:
    body = req.SerializeToString()
    cut = data.draw(st.integers(1, len(body) - 1))
    res = Otlp().read(body[:cut], ReadContext("x.binpb", "x.binpb"))
    whole_blocks, ends = ExportTraceServiceRequest(), []
    for rs in req.resource_spans:
        whole_blocks.resource_spans.append(rs)
        ends.append(len(whole_blocks.SerializeToString()))
    whole_blocks = ExportTraceServiceRequest(
        resource_spans=[rs for rs, end in zip(req.resource_spans, ends, strict=True) if end <= cut]
    )
    if cut in ends:  # cut between two blocks: a valid request of fewer blocks, nothing to tell
        assert res.complete
    else:
        assert not res.complete and res.problems and res.problems[0].kind == "incomplete"
    names = sorted(e.name for e in res.events if e.ph == "X")
    assert names == sorted(
        s.name for rs in whole_blocks.resource_spans for ss in rs.scope_spans for s in ss.spans
    )


@st.composite
def readable_spans(draw: st.DrawFn) -> Any:
    """A span as the SDK holds it (``ReadableSpan``): its own ``to_json()`` writes the console format."""
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event as SdkEvent
    from opentelemetry.sdk.trace import ReadableSpan

    def ctx() -> Any:
        return trace.SpanContext(
            draw(st.integers(1, (1 << 128) - 1)), draw(st.integers(1, (1 << 64) - 1)), False
        )

    start = T0 + draw(st.integers(0, 10**15))
    attrs = draw(
        st.dictionaries(keys, st.one_of(st.text(max_size=10), st.integers(-(10**9), 10**9), st.booleans()))
    )
    return ReadableSpan(
        name=draw(st.text(max_size=20)),
        context=ctx(),
        parent=draw(st.one_of(st.none(), st.builds(ctx))),
        resource=Resource.create({"service.name": "svc", "process.pid": draw(st.integers(1, 1 << 22))}),
        attributes=attrs,
        events=[SdkEvent("ev", {}, timestamp=start)] if draw(st.booleans()) else [],
        links=[trace.Link(ctx())] if draw(st.booleans()) else [],
        kind=draw(st.sampled_from(list(trace.SpanKind))),
        start_time=start,
        end_time=start + draw(st.integers(0, 10**12)),
    )


@settings(max_examples=40, deadline=None)
@given(
    st.lists(readable_spans(), min_size=1, max_size=5, unique_by=lambda s: s.context.span_id), st.booleans()
)
def test_console_reader_matches_the_sdks_to_json(spans_: list[Any], compact: bool) -> None:
    from rl_trace_observer.merge.formats.otlp import console

    text = "".join(s.to_json(indent=None if compact else 4) + "\n" for s in spans_)
    decoded, whole = console.decode(text.encode())
    assert whole and decoded.bad == 0
    got = {s.span_id: s for block in decoded.resources for s in block.spans}
    assert len(got) == len({s.context.span_id for s in spans_})
    for s in spans_:
        mine = got[f"{s.context.span_id:016x}"]
        assert mine.name == s.name and mine.trace_id == f"{s.context.trace_id:032x}"
        assert mine.parent_span_id == (f"{s.parent.span_id:016x}" if s.parent else "")
        assert abs(mine.start_ns - s.start_time) <= 1000 and abs(mine.end_ns - s.end_time) <= 1000  # µs text
        assert mine.attributes == dict(s.attributes) and mine.kind == s.kind.value + 1
        assert [k.span_id for k in mine.links] == [f"{k.context.span_id:016x}" for k in s.links]


def test_a_protobuf_whose_first_resource_is_123_bytes_is_not_read_as_json(
    runtime: bool, tmp_path: Path
) -> None:
    """Its body starts ``0x0a 0x7b``: a newline and ``{`` to ``lstrip``. Seen by hypothesis on a cut
    request (the light check in CI): the file was read as JSON and every span dropped."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value="svc")))
    span = rs.scope_spans.add().spans.add(
        trace_id=b"\0" * 15 + b"\1", span_id=b"\0" * 7 + b"\1", name="s", kind=Span.SPAN_KIND_INTERNAL
    )
    span.start_time_unix_nano, span.end_time_unix_nano = 1_780_000_000_000_000_000, 1_780_000_000_000_001_000
    while len(rs.SerializeToString()) < 123:
        span.name += "x"
    assert len(rs.SerializeToString()) == 123
    body = req.SerializeToString()
    assert body[:2] == b"\x0a{"
    whole = Otlp().read(body, ReadContext("x.binpb", "x.binpb"))
    assert whole.complete and [e.name for e in whole.events if e.ph == "X"] == [span.name]
    cut = Otlp().read(body[:60], ReadContext("x.binpb", "x.binpb"))
    assert not cut.complete and cut.problems[0].kind == "incomplete"
    (tmp_path / "x.binpb").write_bytes(body)
    (src,) = discover([str(tmp_path / "x.binpb")])
    fmt, head = sniff(read_head(src))
    assert fmt is not None and fmt.kind == "otlp" and fmt.hints(head).process_role == "svc"
