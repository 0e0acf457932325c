"""Samples → counter tracks and their places: rates with counter resets, histogram quantiles,
CUDA device mapping, the samples reader. Pure functions on files in the sampler's wire format."""

from __future__ import annotations

import math
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trace_observer.capture.sampler.exposition import Series
from rl_trace_observer.capture.sampler.gpu import cuda_index
from rl_trace_observer.capture.sampler.wire import SampleWriter, named
from rl_trace_observer.merge.formats.metric_samples import MetricSamples
from rl_trace_observer.merge.formats.metric_samples.decode import decode, is_samples
from rl_trace_observer.merge.formats.metric_samples.placement import places
from rl_trace_observer.merge.formats.metric_samples.tracks import quantile, rate, source_tracks

from ..line_sink import ListSink

S = 1_000_000_000
T0 = 1_780_000_000 * S  # a wall-clock time: the reader refuses times before 2001 (a unit read wrong)


def _file(build: Any) -> bytes:
    sink = ListSink()
    w = SampleWriter(sink)
    w.line({"k": "meta", "schema": "rl-trace-samples/1", "host": "h", "pid": 7, "wall_ns": 0})
    build(w)
    return b"".join(sink.lines)


def _hist(family: str, le_counts: list[tuple[str, float]], total: float, sum_: float) -> list[Any]:
    rows = [(Series(family, "histogram", family + "_bucket", (("le", le),)), c) for le, c in le_counts]
    rows.append((Series(family, "histogram", family + "_count", ()), total))
    rows.append((Series(family, "histogram", family + "_sum", ()), sum_))
    return rows


def test_counter_rates_per_interval_and_a_reset() -> None:
    tokens = Series("vllm:generation_tokens", "counter", "vllm:generation_tokens_total", ())

    def build(w: SampleWriter) -> None:
        src = w.source("prometheus", job="vllm", address="127.0.0.1:1", labels={"replica": "0"})
        for t, v in [(0, 100.0), (1, 300.0), (2, 300.0), (3, 50.0), (5, 250.0)]:  # reset before t=3
            w.sample(src, t * S, 0, [(tokens, v)])

    file = decode(_file(build))
    (track,) = source_tracks(file, 1)
    assert track.name == "vllm:generation_tokens /s" and track.kind == "rate"
    # at each interval's start: 200/s, 0/s, then the reset counts 50 from zero, then 200 over 2 s;
    # closed at the last sample (nothing is known after it)
    assert track.points == [(0, 200.0), (1 * S, 0.0), (2 * S, 50.0), (3 * S, 100.0), (5 * S, 0.0)]


def test_gauges_as_sampled_with_only_changes_kept() -> None:
    running = Series("vllm:num_requests_running", "gauge", "vllm:num_requests_running", (("engine", "0"),))

    def build(w: SampleWriter) -> None:
        src = w.source("prometheus", job="vllm", address="a:1", labels={})
        for t, v in [(0, 1.0), (1, 1.0), (2, 4.0), (3, math.nan), (4, 2.0)]:
            w.sample(src, t * S, 0, [(running, v)])

    (track,) = source_tracks(decode(_file(build)), 1)
    assert track.name == "vllm:num_requests_running"  # a label with one value says nothing
    assert track.points == [(0, 1.0), (2 * S, 4.0), (4 * S, 2.0)]  # NaN is no point


def test_histogram_mean_and_quantiles_per_interval() -> None:
    fam = "vllm:time_to_first_token_seconds"

    def build(w: SampleWriter) -> None:
        src = w.source("prometheus", job="vllm", address="a:1", labels={})
        w.sample(src, 0, 0, _hist(fam, [("0.1", 0), ("1.0", 0), ("+Inf", 0)], 0, 0.0))
        # interval 1: 10 requests, all between 0.1 s and 1 s, summing to 5 s
        w.sample(src, S, 0, _hist(fam, [("0.1", 0), ("1.0", 10), ("+Inf", 10)], 10, 5.0))
        w.sample(src, 2 * S, 0, _hist(fam, [("0.1", 0), ("1.0", 10), ("+Inf", 10)], 10, 5.0))  # none new
        # interval 3: 4 fast ones (< 0.1 s)
        w.sample(src, 3 * S, 0, _hist(fam, [("0.1", 4), ("1.0", 14), ("+Inf", 14)], 14, 5.2))

    tracks = {t.kind: t for t in source_tracks(decode(_file(build)), 1)}
    assert [(t, round(v, 9)) for t, v in tracks["mean"].points] == [(0, 0.5), (2 * S, 0.05)]
    assert tracks["p50"].points == [(0, 0.1 + 0.9 * 0.5), (2 * S, 0.05)]
    assert tracks["p99"].points[0] == (0, 0.1 + 0.9 * 0.99)


def test_histogram_reset_counts_from_zero() -> None:
    fam = "h"

    def build(w: SampleWriter) -> None:
        src = w.source("prometheus", job="j", address="a:1", labels={})
        w.sample(src, 0, 0, _hist(fam, [("1", 50), ("+Inf", 50)], 50, 25.0))
        w.sample(src, S, 0, _hist(fam, [("1", 2), ("+Inf", 2)], 2, 3.0))  # the engine restarted

    tracks = {t.kind: t for t in source_tracks(decode(_file(build)), 1)}
    assert tracks["mean"].points == [(0, 1.5)]


def test_quantile_edges() -> None:
    assert math.isnan(quantile(0.5, []))
    assert quantile(0.5, [(1.0, 0), (math.inf, 10)]) == 1.0  # in +Inf: the highest finite bound
    assert quantile(0.5, [(2.0, 10), (math.inf, 10)]) == 1.0  # the first bucket starts at 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=8), st.floats(0.01, 0.99))
def test_quantile_lies_in_its_bucket_and_grows_with_q(increments: list[int], q: float) -> None:
    bounds = [0.5 * (i + 1) for i in range(len(increments))]
    cumulative, total = [], 0
    for le, inc in zip(bounds, increments, strict=True):
        total += inc
        cumulative.append((le, float(total)))
    cumulative.append((math.inf, float(total)))
    value = quantile(q, cumulative)
    if total == 0:
        assert math.isnan(value)
        return
    assert 0.0 <= value <= bounds[-1]
    assert quantile(min(q + 0.005, 1.0), cumulative) >= value


@given(st.floats(0, 1e12), st.floats(0, 1e12), st.floats(1e-3, 1e3))
def test_rate_is_never_negative(prev: float, cur: float, dt: float) -> None:
    assert rate(prev, cur, dt) >= 0


def test_cuda_index_through_visible_devices() -> None:
    assert cuda_index(None, 3, "GPU-a") == 3
    assert cuda_index("2,3", 3, "GPU-a") == 1
    assert cuda_index("2,3", 1, "GPU-a") is None
    assert cuda_index("GPU-8a1c,GPU-77", 5, "GPU-77b2-0000") == 1  # UUID prefixes, as CUDA takes them
    assert cuda_index("", 0, None) is None
    assert cuda_index("0,MIG-x,1", 1, None) is None  # CUDA stops at the first entry naming nothing


def test_places_and_the_reader() -> None:
    busy = named("gpu_utilization_percent", "gauge")
    cpu = named("host_cpu_percent", "gauge")
    qsize = Series("tq_partitions_total", "gauge", "tq_partitions_total", ())
    running = Series("vllm:num_requests_running", "gauge", "vllm:num_requests_running", ())

    def build(w: SampleWriter) -> None:
        gpu0 = w.source("gpu", index=0, pci_bus_id="00000000:07:00.0")
        gpu1 = w.source("gpu", index=1)
        host = w.source("host")
        tq = w.source("prometheus", job="transfer_queue", address="10.0.0.2:9000", labels={})
        eng = w.source("prometheus", job="vllm", address="127.0.0.1:8000", labels={"replica": "3"})
        far = w.source("prometheus", job="vllm", address="10.0.0.9:8000", labels={"replica": "4"})
        w.event("gpu_users", gpu0, 0, users=[[111, 0], [222, 1]])  # two processes share GPU 0
        w.event("server", eng, 0, pid=333, host="h")
        for t in range(3):
            w.sample(gpu0, T0 + t * S, 0, [(busy, 10.0 * t)])
            w.sample(gpu1, T0 + t * S, 0, [(busy, 1.0)])
            w.sample(host, T0 + t * S, 0, [(cpu, 50.0)])
            for src in (tq, eng, far):
                w.sample(src, T0 + t * S, 0, [(qsize if src == tq else running, float(t))])

    data = _file(build)
    assert is_samples(data) and not is_samples(b'{"ph":"X"}\n')
    assert places(decode(data)) == {
        1: [(111, "GPU 0"), (222, "GPU 1")],
        2: ["GPU 1"],
        3: ["Host"],
        4: ["TransferQueue"],
        5: [333],
        6: ["vllm replica 4"],
    }
    from rl_trace_observer.merge.formats.base import MANIFEST_ENTRY, ReadContext

    reader = MetricSamples()
    res = reader.read(data, ReadContext("f", "metrics-h-pid-7.samples.jsonl"))
    where = {(reader.process_of(e.pid, res, None), e.name) for e in res.events}  # type: ignore[arg-type]
    assert ((111, "GPU 0"), "gpu_utilization_percent") in where
    assert ((222, "GPU 1"), "gpu_utilization_percent") in where
    assert (333, "vllm:num_requests_running") in where and ("Host", "host_cpu_percent") in where
    values = [orjson.loads(bytes(e.args))["value"] for e in res.events if e.pid == "111/GPU 0"]
    assert values == [0.0, 10.0, 20.0]
    assert res.meta[MANIFEST_ENTRY]["metrics"]["samples"] == 18 and res.complete


def test_a_cut_last_line_and_a_bad_line() -> None:
    data = _file(lambda w: w.source("host"))
    data = data + b'{"k":"s","src":1,"t":5,"v":[[1,"not a number"]]}\n{"k":"s","src":1,"t'
    file = decode(data)
    assert not file.complete and file.bad_lines == 1 and file.sources


def test_report_telemetry_brackets_and_flags_a_disagreement() -> None:
    """A replica generating 100 tokens/s for 10 s, sampled every second; the step is [2.5 s, 7.5 s):
    the engine counted 500 tokens (400 in whole intervals, 600 in overlapping ones). Our spans say
    500 (ok), 300 (outside the bracket: DISAGREE)."""
    from rl_trace_observer.analysis.answers.model import StepWindow, WorkSpan
    from rl_trace_observer.analysis.report.load import Counter
    from rl_trace_observer.analysis.report.telemetry import bracket, telemetry_section, time_mean

    rate = [(t * S, 100.0) for t in range(10)] + [(10 * S, 0.0)]
    assert bracket(rate, int(2.5 * S), int(7.5 * S)) == (400.0, 500.0, 600.0)
    running = [(0, 2.0), (5 * S, 6.0)]
    assert time_mean(running, 0, 10 * S) == 4.0
    pid, host_pid = 0x300, 0x100 | 0x90
    counters = [Counter("vllm:generation_tokens /s", pid, t, v, {}, "metrics.rate") for t, v in rate]
    counters += [Counter("vllm:num_requests_running", pid, t, v, {}, "metrics.gauge") for t, v in running]
    counters += [Counter("host_cpu_percent", host_pid, 0, 50.0, {}, "metrics.gauge")]
    counters += [Counter("gpu_utilization_percent", pid | 1, 0, 80.0, {}, "metrics.gauge")]
    names = {
        pid: "h · pid 9 · rollout replica 3",
        host_pid: "h · pid 7 · sampler · Host",
        pid | 1: "h · pid 9 · GPU 0",
    }
    window = [StepWindow(1, int(2.5 * S), int(7.5 * S))]
    spans = [WorkSpan("rollout", "replica_3", "vllm_generate", "generation", 3 * S, 7 * S, pid, 1)]

    def section(span_tokens: int) -> dict[str, Any]:
        rollout = {"steps": [{"step": 1, "replicas": [{"replica": 3, "response_tokens": span_tokens}]}]}
        got = telemetry_section(counters, names, window, spans, rollout, [])
        assert got is not None
        return got

    ok = section(500)
    (row,) = ok["engines"]
    assert row["replica"] == 3 and row["generation_tokens"] == 500.0 and row["disagrees"] is False
    assert row["running_mean"] == 4.0 and row["running_max"] == 6.0
    assert section(300)["engines"][0]["disagrees"] is True
    gpu = {"step": 1, "role": "rollout", "stage": "generation", "mean": 80.0, "max": 80.0, "spans": 1}
    assert ok["gpus"] == [{**gpu, "memory_max_bytes": None}]
    assert ok["host_cpu"][0]["mean"] == 50.0 and ok["gpu_note"] is None


def _same(v: float) -> float | str:
    """A sample value as the file means it: NaN equals NaN, and -0.0 is 0.0 (the writer sends only
    changes, and -0.0 == 0.0 is no change)."""
    return "NaN" if math.isnan(v) else v + 0.0


@settings(max_examples=100, deadline=None)
@given(
    rows=st.lists(
        st.lists(st.tuples(st.integers(0, 3), st.floats(allow_nan=True, allow_infinity=True)), max_size=4),
        min_size=1,
        max_size=8,
    ),
    cut=st.integers(0, 10_000),
)
def test_samples_file_round_trips_and_survives_any_cut(rows: list[list[tuple[int, float]]], cut: int) -> None:
    """Property: what the writer wrote (only changes) decodes back to every series' value at every
    sample; a file cut at any byte decodes without raising, keeping the whole lines before the cut."""
    family = [Series(f"m{i}", "gauge", f"m{i}", ()) for i in range(4)]

    def build(w: SampleWriter) -> None:
        src = w.source("prometheus", job="j", address="a:1", labels={})
        for t, values in enumerate(rows):
            w.sample(src, t * S, 0, [(family[i], v) for i, v in dict(values).items()])

    data = _file(build)
    file = decode(data)
    assert file.complete and not file.bad_lines and len(file.samples) == len(rows)
    expect: dict[str, float] = {}
    from rl_trace_observer.merge.formats.metric_samples.tracks import snapshots

    for (_sample, now), values in zip(snapshots(file.samples), rows, strict=True):
        expect.update({f"m{i}": v for i, v in dict(values).items()})
        got = {file.series[sid].name: v for sid, v in now.items()}
        assert {k: _same(v) for k, v in got.items()} == {k: _same(v) for k, v in expect.items()}
    head = data[: cut % (len(data) + 1)]
    partial = decode(head)
    assert partial.bad_lines == 0 and len(partial.samples) <= len(rows)
    assert partial.complete == (head.endswith(b"\n") or not head)


def test_a_file_without_a_stop_line_says_how_it_ended() -> None:
    """Issue 34 item 3: a sampler writes its stop line however it leaves (also on SIGTERM); a file
    without one was ended by SIGKILL (or a crash), and the manifest says so instead of null."""
    from rl_trace_observer.merge.formats.metric_samples.format import NO_STOP, summary

    def killed(w: SampleWriter) -> None:
        src = w.source("host", cpus=2)
        w.event("down", src, T0, address="127.0.0.1:1", error="refused")
        w.line({"k": "stats", "t": T0 + S, "cpu_s": 0.1, "scrapes": 3, "failures": 1})

    def stopped(w: SampleWriter) -> None:
        killed(w)
        w.line({"k": "stop", "t": T0 + 2 * S, "reason": "SIGTERM"})

    assert summary(decode(_file(killed)))["stopped"] == NO_STOP
    assert summary(decode(_file(stopped)))["stopped"] == "SIGTERM"
