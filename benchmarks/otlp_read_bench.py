"""Read cost of OTLP span files (protobuf and OTLP/JSON), per span, next to RL-Insight's event log of
the same spans read in the same run (the merge's fastest JSON reader: the baseline of the ratio).

    python benchmarks/otlp_read_bench.py [--spans 100_000] [--repeat 3]

The spans are made by the real OpenTelemetry SDK (a step span over two tagged leaves and a child,
NeMo-RL's shape) and encoded by the real OTLP exporter's encoder; the JSON twin is protobuf's JSON
mapping with hex ids (tests/corpus/otlp_collector.py). Protobuf is read twice: with
opentelemetry-proto's parser (the default where installed) and with the merger's own wire walk (what
runs without it). Prints the median seconds and µs per span of each reader and the ratio to the
baseline. The machine is shared: compare the ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "corpus"))


def _spans(n: int) -> bytes:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    tp = TracerProvider(resource=Resource.create({"service.name": "nemo-rl", "process.pid": 4242}))
    tp.add_span_processor(SimpleSpanProcessor(memory))
    tracer = tp.get_tracer("bench")
    for step in range(n // 4):
        with tracer.start_as_current_span("rl.grpo.step", attributes={"rl.iteration": step}):
            with (
                tracer.start_as_current_span("rl.vllm.generate", attributes={"rl.bucket": "productive"}),
                tracer.start_as_current_span("vllm.engine.step", attributes={"gen_ai.request.model": "m"}),
            ):
                pass
            with tracer.start_as_current_span(
                "rl.grpo.compute_logprobs", attributes={"rl.bucket": "overhead"}
            ):
                pass
    return bytes(encode_spans(memory.get_finished_spans()).SerializeToString())


def _event_log(pb: bytes) -> bytes:
    """The same spans as an RL-Insight event log (one JSON line per span, exact ns)."""
    from rl_trace_observer.merge.formats.otlp import protobuf

    decoded, _ = protobuf.decode(pb)
    lines = []
    for block in decoded.resources:
        for s in block.spans:
            lines.append(
                orjson.dumps(
                    {
                        "ph": "X",
                        "name": s.name,
                        "cat": "rl_insight",
                        "pid": 4242,
                        "tid": 1,
                        "ts_ns": s.start_ns,
                        "dur_ns": s.end_ns - s.start_ns,
                        "args": s.attributes,
                    }
                )
            )
    return b"\n".join(lines) + b"\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=lambda v: int(v.replace("_", "")), default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from otlp_collector import to_otlp_json

    from rl_trace_observer.merge.formats import ReadContext
    from rl_trace_observer.merge.formats.otlp import Otlp
    from rl_trace_observer.merge.formats.rl_insight.format import RLInsight

    pb = _spans(args.spans)
    from rl_trace_observer.merge.formats.otlp import protobuf

    inputs = {
        "rl_insight (baseline)": (RLInsight(), _event_log(pb)),
        "otlp protobuf": (Otlp(), pb),
        "otlp protobuf, wire walk": (Otlp(), pb),
        "otlp json": (Otlp(), json.dumps(to_otlp_json(pb)).encode()),
    }
    base = None
    print(f"{'reader':24} {'MB':>7} {'events':>9} {'s':>7} {'µs/span':>8} {'× baseline':>10}")
    for name, (fmt, data) in inputs.items():
        protobuf.USE_RUNTIME = "wire walk" not in name  # opentelemetry-proto's parser, or our own walk
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            res = fmt.read(data, ReadContext("bench", "bench"))
            times.append(time.perf_counter() - t)
        s = statistics.median(times)
        base = base or s
        spans = sum(1 for e in res.events if e.ph == "X")
        mb, per_span = len(data) / 1e6, s / spans * 1e6
        print(f"{name:24} {mb:7.1f} {len(res.events):9} {s:7.2f} {per_span:8.1f} {s / base:10.1f}")


if __name__ == "__main__":
    main()
