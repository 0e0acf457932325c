"""One process of a small NeMo-RL-shaped run, traced with the REAL OpenTelemetry SDK and exported with
the REAL OTLP/HTTP protobuf exporter (run as a script: ``python otlp_sdk_proc.py ROLE ENDPOINT``), and
with the SDK's ``ConsoleSpanExporter`` to a file when ``OTLP_TEST_CONSOLE_DIR`` names a folder.

The driver starts a generation worker and a policy worker as child processes and, per step, sends each
a W3C ``traceparent`` on its stdin: the worker's span has its parent in the driver (a cross-process
parent edge). The policy worker's update links to the generation worker's batch span (a span link
across processes), whose context the driver relays. Leaf spans carry nemo-lens's ``rl.bucket``;
umbrellas (``rl.grpo.step``, ``rl.grpo.collect_rollouts``) carry none, as nemo-lens tags them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.propagate import extract, inject
from opentelemetry.sdk.resources import ProcessResourceDetector, Resource, get_aggregated_resources
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

STEPS = 2
MS = 0.004  # one unit of simulated work, seconds


def provider(role: str | None, rank: int | None, endpoint: str) -> TracerProvider:
    attrs: dict[str, object] = {"service.name": "nemo-rl", "host.name": socket.gethostname()}
    attrs["rl.algorithm"] = "grpo"
    if role:
        attrs["rl.worker_group"] = role
    if rank is not None:
        attrs["dl.rank"] = rank
    resource = get_aggregated_resources([ProcessResourceDetector()], Resource.create(attrs))
    tp = TracerProvider(resource=resource)
    tp.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint), schedule_delay_millis=5000))
    console_dir = os.environ.get("OTLP_TEST_CONSOLE_DIR")
    if console_dir:  # the SDK's own JSON file output too (its to_json(), not OTLP/JSON)
        out = open(os.path.join(console_dir, f"console-{role or 'driver'}-{os.getpid()}.json"), "w")  # noqa: SIM115
        tp.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter(out=out), schedule_delay_millis=5000))
    return tp


def work(units: float) -> None:
    time.sleep(units * MS)


def driver(endpoint: str) -> None:
    tp = provider(None, None, endpoint)
    tracer = tp.get_tracer("nemo_rl.algorithms.grpo")
    here = os.path.abspath(__file__)
    gen = subprocess.Popen(
        [sys.executable, here, "vllm_policy", endpoint],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    pol = subprocess.Popen(
        [sys.executable, here, "lm_policy", endpoint],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )

    def call(proc: subprocess.Popen[str], line: str) -> str:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
        return proc.stdout.readline().strip()

    for step in range(1, STEPS + 1):
        with tracer.start_as_current_span("rl.grpo.step", attributes={"rl.iteration": step}):
            with tracer.start_as_current_span(
                "rl.grpo.data_processing", attributes={"rl.bucket": "overhead"}
            ):
                work(2)
            with (
                tracer.start_as_current_span("rl.grpo.collect_rollouts"),
                tracer.start_as_current_span("rl.vllm.generate", attributes={"rl.bucket": "productive"}),
            ):
                carrier: dict[str, str] = {}
                inject(carrier)
                gen_ctx = call(gen, f"generate {carrier['traceparent']}")
            with tracer.start_as_current_span(
                "rl.grpo.compute_logprobs", attributes={"rl.bucket": "overhead"}
            ):
                carrier = {}
                inject(carrier)
                call(pol, f"logprob {carrier['traceparent']}")
            with tracer.start_as_current_span("rl.idle.buffer_starvation", attributes={"rl.bucket": "idle"}):
                work(2)
            with tracer.start_as_current_span(
                "rl.grpo.policy_update", attributes={"rl.bucket": "productive"}
            ):
                carrier = {}
                inject(carrier)
                call(pol, f"update {carrier['traceparent']} {gen_ctx}")
    for proc in (gen, pol):
        call(proc, "quit")
        proc.wait(timeout=60)
    tp.shutdown()


def worker(role: str, endpoint: str) -> None:
    tp = provider(role, 0, endpoint)
    tracer = tp.get_tracer(f"nemo_rl.{role}")
    for line in sys.stdin:
        what, *rest = line.split()
        if what == "quit":
            print("bye", flush=True)
            break
        parent = extract({"traceparent": rest[0]})
        reply = "ok"
        if what == "generate":
            # an umbrella (no rl.bucket, as nemo-lens leaves umbrellas untagged) over two tagged leaves
            with tracer.start_as_current_span(
                "generate_batch", context=parent, kind=trace.SpanKind.SERVER
            ) as span:
                with tracer.start_as_current_span(
                    "vllm.engine.step", attributes={"rl.bucket": "productive", "gen_ai.request.model": "tiny"}
                ):
                    work(3)
                with tracer.start_as_current_span(
                    "rl.wasted.failed_trajectory", attributes={"rl.bucket": "wasted"}
                ):
                    span.add_event("trajectory_dropped", {"reason": "timeout"})
                    work(1)
                sc = span.get_span_context()
                reply = f"{sc.trace_id:032x}:{sc.span_id:016x}"
        elif what == "logprob":
            with tracer.start_as_current_span(
                "policy.get_logprobs",
                context=parent,
                kind=trace.SpanKind.SERVER,
                attributes={"rl.bucket": "overhead"},
            ):
                work(2)
        elif what == "update":
            trace_hex, span_hex = rest[1].split(":")
            link = trace.Link(
                trace.SpanContext(
                    int(trace_hex, 16), int(span_hex, 16), is_remote=True, trace_flags=trace.TraceFlags(1)
                )
            )
            with tracer.start_as_current_span(
                "policy.train",
                context=parent,
                kind=trace.SpanKind.SERVER,
                links=[link],
                attributes={"rl.bucket": "productive"},
            ):
                with tracer.start_as_current_span("optimizer.step"):
                    work(2)
                work(1)
        print(reply, flush=True)
    tp.shutdown()


if __name__ == "__main__":
    if sys.argv[1] == "driver":
        driver(sys.argv[2])
    else:
        worker(sys.argv[1], sys.argv[2])
