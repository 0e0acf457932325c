"""The input-format contract, walked over the registry: every format in ``FORMATS`` has a fixture
here, recognises it, and reads it onto the timeline the way every later stage assumes.

Why: a new format is "one package plus one registry line"; this test is what makes that line enough.
A format added to ``FORMATS`` without a fixture fails here (add one to ``FIXTURES``).
"""

from __future__ import annotations

import gzip
import inspect
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from rl_trace_observer.capture.sampler.wire import SampleWriter
from rl_trace_observer.merge import formats as registry
from rl_trace_observer.merge.files.sources import discover, read_content, read_head
from rl_trace_observer.merge.formats import FORMATS, Format, ReadContext, sniff
from rl_trace_observer.merge.formats.base import CAPABILITIES
from rl_trace_observer.merge.options import MergeOptions
from rl_trace_observer.merge.pipeline.local import merge

from ..corpus.cluster_run import build_cluster_run
from ..line_sink import ListSink

PHASES = set("XBEiIsftfCMbenN")  # what a format may hand on (flows, counters, instants, async)


def _chrome(d: Path) -> list[Path]:
    path = d / "plain.json"
    path.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "name": "work", "pid": 1, "tid": 2, "ts": 10.5, "dur": 3.25},
        {"ph": "i", "name": "mark", "pid": 1, "tid": 2, "ts": 12, "s": "t"},
    ]}))  # fmt: skip
    return [path]


def _samples(d: Path) -> list[Path]:
    sink = ListSink()
    w = SampleWriter(sink)
    w.line({"k": "meta", "schema": "rl-trace-samples/1", "host": "h", "pid": 7, "wall_ns": 0})
    from rl_trace_observer.capture.sampler.exposition import Series

    src = w.source("host", labels={})
    cpu = Series("host_cpu_percent", "gauge", "host_cpu_percent", ())
    for t in range(3):
        w.sample(src, 1_780_000_000_000_000_000 + t * 10**9, 0, [(cpu, 10.0 * t)])
    path = d / "metrics-h-pid-7.samples.jsonl"
    path.write_bytes(b"".join(sink.lines))
    return [path]


def _areal(d: Path) -> list[Path]:
    """A rollout rank's two files as AReaL 1.0.4's perf_tracer writes them (layout, keys, units)."""
    trial = d / "areal" / "logs" / "u" / "exp" / "trial"
    perf = trial / "perf_tracer" / "rollout" / "traces-r0.jsonl"
    sessions = trial / "session_tracer" / "rollout" / "sessions-r0.jsonl"
    perf.parent.mkdir(parents=True)
    sessions.parent.mkdir(parents=True)
    args = {"rank": 0, "role": "rollout"}
    perf.write_text("".join(json.dumps(e) + "\n" for e in [
        {"name": "thread_name", "ph": "M", "pid": 41, "tid": 41, "args": {"name": "MainThread"}},
        {"name": "process_name", "ph": "M", "pid": 41, "args": {"name": "[rollout] Rank 0, Process"}},
        {"name": "workflow_executor.rollout_batch", "ph": "X", "ts": 250, "dur": 22000, "pid": 41, "tid": 41,
         "cat": "scheduler", "args": args},
        {"name": "rollout.step", "ph": "X", "ts": 200, "dur": 22100, "pid": 41, "tid": 41, "cat": "compute",
         "args": {"global_step": 0, **args}},
    ]))  # fmt: skip
    sessions.write_text(json.dumps({
        "task_id": 0, "session_id": 0, "rank": 0, "role": "rollout",
        "status": "rejected", "reason": "rejected",
        "submit_ts": 1_780_000_000.001, "finalized_ts": 1_780_000_000.015, "total_s": 0.014,
        "phases": {"generate": [{"start_ts": 1_780_000_000.002, "end_ts": 1_780_000_000.010}]},
    }) + "\n")  # fmt: skip
    return [perf, sessions]


def _otlp(d: Path) -> list[Path]:
    """Spans of the real OpenTelemetry SDK, encoded by the real OTLP exporter's encoder (the bytes its
    HTTP exporter posts), and their OTLP/JSON twin."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from ..corpus.otlp_collector import to_otlp_json

    memory = InMemorySpanExporter()
    tp = TracerProvider(resource=Resource.create({"service.name": "trainer", "process.pid": 4242}))
    tp.add_span_processor(SimpleSpanProcessor(memory))
    tracer = tp.get_tracer("contract")
    with (
        tracer.start_as_current_span("rl.grpo.step", attributes={"rl.iteration": 1}),
        tracer.start_as_current_span("rl.grpo.policy_update", attributes={"rl.bucket": "productive"}),
    ):
        pass
    tp.shutdown()
    body = encode_spans(memory.get_finished_spans()).SerializeToString()
    pb, js = d / "trainer.binpb", d / "trainer.otlp.json"
    pb.write_bytes(body)
    js.write_text(json.dumps(to_otlp_json(body)))
    return [pb, js]


def _nemo_rl(d: Path) -> Path:
    from ..corpus.nemo_rl_perfetto import write_trace

    path = d / "nemo_rl_perfetto_trace.json"
    write_trace(path)
    return path


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    """kind -> files of that kind: the generated three-host run, plus what it has not."""
    base = tmp_path_factory.mktemp("contract")
    build_cluster_run(base / "run", kernels=8)
    extra = base / "extra"
    extra.mkdir()
    files = (
        [Path(s.path) for s in discover([str(base / "run")])]
        + _chrome(extra)
        + _samples(extra)
        + _areal(extra)
        + _otlp(extra)
        + [_nemo_rl(extra)]
    )
    out = base / "merged.json.gz"
    assert merge([str(base / "run")], str(out), MergeOptions(workers=0)).exit_code == 0
    files.append(out)
    by_kind: dict[str, list[Path]] = {}
    for path in files:
        (src,) = discover([str(path)])
        fmt, _ = sniff(read_head(src))
        by_kind.setdefault(fmt.kind if fmt else "unknown", []).append(path)
    return by_kind


def test_every_registered_format_has_a_fixture_and_recognises_it(fixtures: dict[str, list[Path]]) -> None:
    missing = [f.kind for f in FORMATS if not fixtures.get(f.kind)]
    assert not missing, f"formats with no fixture in this contract test: {missing}"
    assert "unknown" not in fixtures, fixtures.get("unknown")


def test_every_format_class_is_registered_once() -> None:
    kinds = [f.kind for f in FORMATS]
    assert len(kinds) == len(set(kinds)) and all(kinds)
    defined = {
        cls
        for module in _format_modules()
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, Format) and cls is not Format and cls.__module__ == module.__name__
    }
    registered = {type(f) for f in FORMATS}
    assert len(defined) >= len(FORMATS) - 1, defined  # the walk finds the format classes
    assert defined <= registered, f"Format classes not in FORMATS: {defined - registered}"


def test_a_capability_is_asked_for_only_where_it_is_mixed_in() -> None:
    """A format that sets a capability's attribute or method without mixing the capability in would
    be silently never asked for it (the stages ask ``isinstance``): name the capability it lacks."""
    owned = {
        name: cap
        for cap in CAPABILITIES
        for name in vars(cap)
        if not name.startswith("__") and name not in vars(Format)
    }
    for f in FORMATS:
        for klass in type(f).__mro__:
            if klass in CAPABILITIES or klass is Format or klass is object:
                continue
            for name in vars(klass):
                cap = owned.get(name)
                assert cap is None or isinstance(f, cap), f"{type(f).__name__}.{name} needs {cap.__name__}"
    core = {n for n in vars(Format) if not n.startswith("__")}
    assert len(core) <= 14, f"the core Format interface grew: {sorted(core)}"


def _format_modules() -> list[Any]:
    import importlib
    import pkgutil

    names = [m.name for m in pkgutil.walk_packages(registry.__path__, registry.__name__ + ".")]
    return [importlib.import_module(n) for n in names if not n.rsplit(".", 1)[-1].startswith("_")]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.kind)
def test_a_format_reads_its_fixture_onto_the_timeline(fmt: Format, fixtures: dict[str, list[Path]]) -> None:
    """Hints are planning facts; the read gives integer-ns events (or deferred µs when asked), counts
    that add up, and phases later stages know; a format without events reads nothing."""
    for path in fixtures[fmt.kind]:
        (src,) = discover([str(path)])
        head = read_head(src)
        assert fmt.sniff(head) > 0
        hints = fmt.hints(head)
        assert hints.pid is None or isinstance(hints.pid, int)
        if not fmt.events:
            continue
        data = read_content(src).data
        res = fmt.read(data, ReadContext(str(path), path.name))
        if res.skip:  # e.g. a trace that needs its process record's anchor: said, not guessed
            assert res.problems, f"{path.name}: skipped without a problem saying why"
            continue
        assert res.events, f"{path.name}: no events read"
        assert res.read >= len(res.events) - res.metadata >= 0 or res.read >= res.metadata
        for e in res.events:
            assert e.ph in PHASES, (path.name, e.ph)
            assert isinstance(e.ts, int), (path.name, e.name, e.ts)
            if e.ph == "X":  # a complete slice: a whole, non-negative duration
                assert isinstance(e.dur, int) and e.dur >= 0, (path.name, e.name, e.dur)


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f.events], ids=lambda f: f.kind)
def test_a_cut_file_never_raises_out_of_its_format(fmt: Format, fixtures: dict[str, list[Path]]) -> None:
    """Half a file (a writer killed mid-line) is read as far as it goes or refused with NotATrace."""
    for path in fixtures[fmt.kind]:
        (src,) = discover([str(path)])
        data = read_content(src).data
        try:
            res = fmt.read(data[: len(data) // 2], ReadContext(str(path), path.name))
        except (registry.NotATrace, ValueError, orjson.JSONDecodeError):
            continue
        assert not res.events or all(isinstance(e.ts, int) for e in res.events)


def test_gzip_changes_nothing_a_format_sees(fixtures: dict[str, list[Path]], tmp_path: Path) -> None:
    for kind, paths in fixtures.items():
        path = paths[0]
        if path.suffix == ".gz":
            continue
        packed = tmp_path / (path.name + ".gz")
        packed.write_bytes(gzip.compress(path.read_bytes()))
        (src,) = discover([str(packed)])
        fmt, _ = sniff(read_head(src))
        assert fmt is not None and fmt.kind == kind, (path.name, fmt)
