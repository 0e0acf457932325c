"""Hardware exporters as RL-Insight's hardware guide registers them: node_exporter as the host's
source of truth (psutil's twins not drawn), and Ascend's NPU exporter as one ``NPU <id>`` process
per device. Files in the sampler's wire format; the exporter pages these series come from are
node_exporter's (run for real in tests/integrations/test_vllm_real.py) and, for the NPU exporter, a stand-in
with the metric and label names of Ascend's npu-exporter documentation (no NPU here)."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trace_observer.capture.sampler.exposition import Series
from rl_trace_observer.capture.sampler.wire import SampleWriter, named
from rl_trace_observer.merge.formats.base import ReadContext
from rl_trace_observer.merge.formats.metric_samples import MetricSamples
from rl_trace_observer.merge.formats.metric_samples.decode import decode
from rl_trace_observer.merge.formats.metric_samples.hardware import cpu_busy_track
from rl_trace_observer.merge.formats.metric_samples.placement import places

from .test_metrics_tracks import T0, S, _file

MODES = ("idle", "iowait", "irq", "nice", "softirq", "steal", "system", "user")


def _cpu(cpu: int, mode: str) -> Series:
    return Series(
        "node_cpu_seconds", "counter", "node_cpu_seconds_total", (("cpu", str(cpu)), ("mode", mode))
    )


def _node_and_host(w: SampleWriter, busy: list[list[float]]) -> None:
    """A node_exporter (2 CPUs: ``busy`` seconds per interval of each, 1 s intervals) and psutil."""
    host = w.source("host")
    node = w.source("prometheus", job="node", address="127.0.0.1:9100", labels={})
    avail = Series("node_memory_MemAvailable_bytes", "gauge", "node_memory_MemAvailable_bytes", ())
    disk = Series(
        "node_disk_reads_completed", "counter", "node_disk_reads_completed_total", (("device", "vda"),)
    )
    rx = Series(
        "node_network_receive_bytes", "counter", "node_network_receive_bytes_total", (("device", "eth0"),)
    )
    lo = Series(
        "node_network_receive_bytes", "counter", "node_network_receive_bytes_total", (("device", "lo"),)
    )
    totals = {(c, m): 0.0 for c in range(2) for m in MODES}
    for t in range(len(busy) + 1):
        if t:
            for c in range(2):
                totals[(c, "user")] += busy[t - 1][c]
                totals[(c, "idle")] += 1.0 - busy[t - 1][c]
        rows = [(_cpu(c, m), v) for (c, m), v in totals.items()]
        rows += [(avail, 5e9 - t), (disk, 10.0 * t), (rx, 1000.0 * t), (lo, 10.0 * t)]
        w.sample(node, T0 + t * S, 0, rows)
        psutil = [
            (named("host_cpu_percent", "gauge"), 42.0),
            (named("host_memory_available_bytes", "gauge"), 5e9),
            (named("host_network_receive_bytes_total", "counter"), 1000.0 * t),
        ]
        w.sample(host, T0 + t * S, 0, psutil)


def _read(data: bytes) -> dict[tuple[Any, str], list[float]]:
    reader = MetricSamples()
    res = reader.read(data, ReadContext("f", "metrics-h-pid-7.samples.jsonl"))
    out: dict[tuple[Any, str], list[float]] = {}
    for e in res.events:
        where = reader.process_of(e.pid, res, None)  # type: ignore[arg-type]
        out.setdefault((where, e.name), []).append(orjson.loads(bytes(e.args))["value"])
    return out


def test_node_exporter_is_the_host_and_psutil_twins_are_not_drawn() -> None:
    data = _file(lambda w: _node_and_host(w, [[1.0, 0.0], [0.5, 0.5], [0.25, 0.25]]))
    assert places(decode(data)) == {1: ["Host"], 2: ["Host"]}
    tracks = _read(data)
    names = {name for (where, name) in tracks if where == "Host"}
    # CPU busy share from node_cpu_seconds_total over both CPUs, per interval: 50 %, 50 %, 25 %
    assert tracks[("Host", "host_cpu_percent")] == [50.0, 25.0]  # a point where the value changed
    assert (
        "node_memory_MemAvailable_bytes" in names and "node_network_receive_bytes /s {device=eth0}" in names
    )
    assert not any(n.startswith("node_disk") for n in names)  # the families the host tracks are not made of
    assert "host_memory_available_bytes" not in names and "host_network_receive_bytes /s" not in names
    assert 42.0 not in tracks[("Host", "host_cpu_percent")]  # psutil's CPU track is not drawn beside it


def test_without_node_exporter_psutil_draws_the_host() -> None:
    def build(w: SampleWriter) -> None:
        host = w.source("host")
        for t in range(3):
            w.sample(host, T0 + t * S, 0, [(named("host_cpu_percent", "gauge"), 42.0 + t)])

    assert _read(_file(build))[("Host", "host_cpu_percent")] == [42.0, 43.0, 44.0]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.floats(0.0, 1.0), min_size=2, max_size=2), min_size=1, max_size=8))
def test_cpu_busy_share_is_the_mean_busy_fraction(busy: list[list[float]]) -> None:
    file = decode(_file(lambda w: _node_and_host(w, busy)))
    track = cpu_busy_track(file, 2)
    assert track is not None
    expected = [100.0 * (a + b) / 2 for a, b in busy]
    got = dict(track.points)
    for t, want in enumerate(expected):
        if T0 + t * S in got:  # a point only where the value changed
            assert abs(got[T0 + t * S] - want) < 1e-6
        assert 0.0 <= want <= 100.0


NPU_LABELS = (("container_name", ""), ("model_name", "910B"), ("namespace", ""), ("pod_name", ""))


def _npu(name: str, device: int) -> Series:
    labels = (
        *NPU_LABELS,
        ("id", str(device)),
        ("pcie_bus_info", f"0000:{device:02x}:00.0"),
        ("vdie_id", f"V{device}"),
    )
    return Series(name, "gauge", name, tuple(sorted(labels)))


def test_npu_exporter_devices_become_npu_processes() -> None:
    def build(w: SampleWriter) -> None:
        npu = w.source("prometheus", job="npu", address="127.0.0.1:8082", labels={})
        nums = Series("machine_npu_nums", "gauge", "machine_npu_nums", ())
        for t in range(3):
            rows = [(nums, 2.0)]
            for d in (0, 1):
                rows += [(_npu("npu_chip_info_utilization", d), 10.0 * t + d),
                         (_npu("npu_chip_info_hbm_used_memory", d), 1000.0 + d),
                         (_npu("npu_chip_info_power", d), 80.0 + t)]  # fmt: skip
            w.sample(npu, T0 + t * S, 0, rows)

    data = _file(build)
    assert places(decode(data)) == {1: []}
    tracks = _read(data)
    assert sorted({where for where, _ in tracks}) == ["NPU 0", "NPU 1"]
    assert tracks[("NPU 1", "npu_chip_info_utilization")] == [1.0, 11.0, 21.0]
    assert tracks[("NPU 0", "npu_chip_info_hbm_used_memory")] == [1000.0]
    assert {name for _, name in tracks} == {
        "npu_chip_info_utilization",
        "npu_chip_info_hbm_used_memory",
        "npu_chip_info_power",
    }  # one group per device, its track names without the device's labels
