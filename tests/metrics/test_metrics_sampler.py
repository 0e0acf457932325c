"""The metric sampler's parts: page reading, scraping (dead / slow endpoints), NVML, host, the loop.

Real prometheus_client servers and parser, real psutil, real sockets. NVML is the stand-in module
``tests/nvml_standin.py`` (nvidia-ml-py's names and error types; no GPU here), and the real
nvidia-ml-py where a test says so (it must report the missing library as a reason, not an error).
"""

from __future__ import annotations

import http.server
import importlib.util
import itertools
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trace_observer import config as config_mod
from rl_trace_observer.capture.sampler import node
from rl_trace_observer.capture.sampler.exposition import PageReader
from rl_trace_observer.capture.sampler.gpu import Gpus
from rl_trace_observer.capture.sampler.host import Host
from rl_trace_observer.capture.sampler.loop import Sampler
from rl_trace_observer.capture.sampler.scrape import Target, split_address
from rl_trace_observer.merge.formats.metric_samples.decode import decode
from rl_trace_observer.testing.vllm_metrics import VllmMetrics

from .. import nvml_standin
from ..conftest import requires
from ..line_sink import ListSink


def _parsed(text: str) -> list[tuple[str, str, tuple[tuple[str, str], ...], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            out.append((fam.name, s.name, tuple(sorted(s.labels.items())), _num(float(s.value))))
    return out


def _num(v: float) -> float | str:
    return "NaN" if v != v else v  # NaN != NaN: compare it by name


def _flat(samples: list[Any]) -> list[tuple[str, str, tuple[tuple[str, str], ...], float]]:
    return [(s.family, s.name, s.labels, _num(v)) for s, v in samples]


def _vllm_page(metrics: VllmMetrics) -> str:
    from prometheus_client import generate_latest

    return generate_latest(metrics.registry).decode()


# ----------------------------------------------------------------------------------- pages
@requires("prometheus_client")
def test_page_reader_answers_what_the_parser_answers_and_caches_it() -> None:
    m = VllmMetrics(model_name="m", engine="0")
    m.iteration(running=3, waiting=2, kv_usage=0.5, prompt_tokens=10, new_tokens=4)
    m.finished(reason="stop", queue_s=0.1, prefill_s=0.2, decode_s=0.3, ttft_s=0.3, e2e_s=0.6,
               prompt_tokens=10, generation_tokens=4)  # fmt: skip
    reader = PageReader()
    first = reader.read(_vllm_page(m))
    assert _flat(first) == _parsed(_vllm_page(m))
    assert not any(s.name.endswith("_created") for s, _ in first)  # creation times are not values
    m.iteration(running=1, waiting=0, kv_usage=0.25, prompt_tokens=5, new_tokens=9)
    second = reader.read(_vllm_page(m))
    assert reader.full_parses == 1  # the second page went through the cache only
    assert _flat(second) == _parsed(_vllm_page(m))
    assert dict((s.name, v) for s, v in second)["vllm:generation_tokens_total"] == 13.0


@requires("prometheus_client")
def test_page_reader_parses_again_when_a_line_is_new() -> None:
    reader = PageReader()
    reader.read('# TYPE a gauge\na{x="1"} 1.0\n')
    out = reader.read('# TYPE a gauge\na{x="1"} 2.0\na{x="2"} 3.0\n')
    assert reader.full_parses == 2
    assert sorted((s.labels, v) for s, v in out) == [((("x", "1"),), 2.0), ((("x", "2"),), 3.0)]


@requires("prometheus_client")
def test_page_reader_rejects_what_is_not_the_text_format() -> None:
    with pytest.raises(ValueError):
        PageReader().read("<html>not metrics</html>\n")


_names = st.from_regex(r"[a-z][a-z_]{0,8}", fullmatch=True)
_label_values = st.text(alphabet=st.characters(codec="utf-8", exclude_characters='\\"\n'), max_size=6)


@requires("prometheus_client")
@settings(max_examples=60, deadline=None)
@given(
    gauges=st.dictionaries(
        _names, st.lists(st.tuples(_label_values, st.floats(allow_nan=False)), max_size=3), max_size=4
    ),
    updates=st.lists(st.floats(allow_nan=False, allow_infinity=True), min_size=1, max_size=3),
)
def test_page_reader_matches_the_parser_on_any_page(gauges: dict[str, Any], updates: list[float]) -> None:
    """Property: page after page (values moving, label sets fixed), the cache answers exactly what
    prometheus_client's parser answers."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    reg = CollectorRegistry()
    children = []
    for name, series in gauges.items():
        g = Gauge(f"m_{name}", "doc", ["l"], registry=reg)
        children += [(g.labels(label), value) for label, value in series]
    reader = PageReader()
    for step, delta in enumerate([0.0, *updates]):
        for child, value in children:
            child.set(value + delta if step else value)
        text = generate_latest(reg).decode()
        assert _flat(reader.read(text)) == _parsed(text)


# ---------------------------------------------------------------------------------- scrapes
def test_split_address_forms() -> None:
    assert split_address("10.0.0.1:8000") == ("10.0.0.1", 8000, "/metrics")
    assert split_address("[::1]:9090") == ("::1", 9090, "/metrics")
    assert split_address("http://h:1/custom") == ("h", 1, "/custom")
    with pytest.raises(ValueError):
        split_address("no-port")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_dead_endpoint_is_noted_once_and_retried_with_back_off() -> None:
    target = Target({"address": f"127.0.0.1:{_free_port()}", "job": "dead"}, timeout_s=0.2, retry_max_s=4.0)
    now, changes, waits = 100.0, [], []
    for _ in range(6):
        result = target.scrape()
        assert not result.ok and "Connection" in (result.error or "")
        changes.append(target.after(result, now, interval_s=1.0))
        waits.append(target.next_try - now)
    assert changes == ["down", None, None, None, None, None]  # noted once, not at every try
    assert waits == [2.0, 4.0, 4.0, 4.0, 4.0, 4.0]  # doubling, capped at retry_max_s
    assert not target.due(now + 3.9) and target.due(now + 4.0)


@requires("prometheus_client")
def test_recovered_endpoint_is_noted_up_and_scraped_at_every_tick_again() -> None:
    port = _free_port()
    target = Target({"address": f"127.0.0.1:{port}"}, timeout_s=0.5, retry_max_s=30)
    assert target.after(target.scrape(), 0.0, 1.0) == "down"
    m = VllmMetrics()
    m.serve("127.0.0.1", port)
    try:
        result = target.scrape()
        assert result.ok and result.samples
        assert target.after(result, 10.0, 1.0) == "up" and target.due(10.0)
    finally:
        m.close()


class _SlowHandler(http.server.BaseHTTPRequestHandler):
    delay_s = 2.0
    trickle = False

    def do_GET(self) -> None:
        body = b"# TYPE slow_gauge gauge\nslow_gauge 1.0\n"
        if not self.trickle:
            time.sleep(self.delay_s)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body) * 50))
        self.end_headers()
        try:
            for _ in range(50 if self.trickle else 1):
                self.wfile.write(body)
                self.wfile.flush()
                if self.trickle:
                    time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):  # the scraper gave up on us: as intended
            pass

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture
def slow_server() -> Any:
    servers = []

    def start(trickle: bool) -> str:
        handler = type("H", (_SlowHandler,), {"trickle": trickle})
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"127.0.0.1:{srv.server_address[1]}"

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("trickle", [False, True], ids=["silent", "trickling"])
def test_slow_endpoint_is_cut_off_at_the_deadline(slow_server: Any, trickle: bool) -> None:
    """The timeout bounds the whole scrape, not each recv: a server that sends 50 bytes every 50 ms
    for 2.5 s is cut off at 0.3 s like one that sends nothing."""
    target = Target({"address": slow_server(trickle)}, timeout_s=0.3, retry_max_s=30)
    t0 = time.monotonic()
    result = target.scrape()
    took = time.monotonic() - t0
    assert not result.ok and took < 1.0, (result, took)


# ------------------------------------------------------------------------------ NVML, psutil
def test_gpus_through_the_nvml_standin() -> None:
    nvml_standin.configure(
        [
            nvml_standin.FakeGpu(
                util=87,
                mem_util=40,
                used=3 << 30,
                power_mw=250_500,
                sm_clock=1755,
                gpm={
                    nvml_standin.NVML_GPM_METRIC_SM_UTIL: 61.5,
                    nvml_standin.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 12.0,
                },
            ),
            nvml_standin.FakeGpu(bus_id="00000000:0A:00.0", uuid="GPU-1", power_mw=None),
        ]
    )
    gpus = Gpus(nvml_standin)
    assert gpus.reason is None and [d.info["pci_bus_id"] for d in gpus.devices] == [
        "00000000:07:00.0",
        "00000000:0A:00.0",
    ]
    assert gpus.devices[0].info["gpm"] and not gpus.devices[1].info["gpm"]
    first = gpus.sample()
    assert first[0] == {
        "gpu_utilization_percent": 87.0,
        "gpu_memory_utilization_percent": 40.0,
        "gpu_memory_used_bytes": float(3 << 30),
        "gpu_power_watts": 250.5,
        "gpu_sm_clock_mhz": 1755.0,
        "gpu_sm_active_percent": 61.5,
        "gpu_tensor_active_percent": 12.0,
    }
    assert "gpu_power_watts" not in first[1]  # NotSupported: left out...
    gpus.sample()
    assert nvml_standin._devices[1].calls["power"] == 1  # ...and never asked again
    gpus.close()


def test_missing_nvml_is_a_reason_not_an_error() -> None:
    nvml_standin.configure([], missing_library=True)
    assert Gpus(nvml_standin).reason == "NVML unavailable: NVML Shared Library Not Found"
    nvml_standin.configure([])
    assert Gpus(nvml_standin).reason == "NVML found no GPU"


def test_the_real_nvml_on_a_gpu_less_machine_is_a_reason() -> None:
    """Without nvidia-ml-py (a light install) the reason names the extra that brings it."""
    real = Gpus()  # the real nvidia-ml-py, if installed, on this GPU-less machine
    assert not real.devices and real.reason
    if importlib.util.find_spec("pynvml") is None:
        assert "pip install 'rl-trace-observer[metrics]'" in real.reason, real.reason
    else:
        assert "NVML" in real.reason, real.reason


def test_host_through_psutil() -> None:
    host = Host()
    values = host.sample()
    assert host.available and 0.0 <= values["host_cpu_percent"] <= 100.0
    assert values["host_memory_available_bytes"] > 0 and values["host_network_receive_bytes_total"] >= 0


# ------------------------------------------------------------------------------------ loop
@requires("prometheus_client")
def test_a_slow_target_never_delays_the_others(tmp_path: Path, slow_server: Any) -> None:
    """Ticks every 0.1 s for 1.2 s: the healthy target and the host are sampled at every tick while
    a slow target's scrapes (each cut at 0.5 s) are in flight; the slow one is noted down once."""
    cfg = config_mod.load({"RL_TRACE_OUTPUT_DIR": str(tmp_path), "RL_TRACE_METRICS_TIMEOUT_S": "0.5"})
    m = VllmMetrics()
    address = m.serve()
    nvml_standin.configure([nvml_standin.FakeGpu(util=50)])
    sink = ListSink()
    sampler = Sampler(cfg, tmp_path, sink, host="h", nvml=nvml_standin)
    try:
        sampler._add({"job": "vllm", "address": address, "labels": {"replica": "0"}})
        sampler._add({"job": "slow", "address": slow_server(False), "labels": {}})
        for i in range(12):
            m.iteration(running=i, waiting=0, kv_usage=0.1, prompt_tokens=1, new_tokens=1)
            sampler.tick(0.1)
            time.sleep(0.1)
        sampler.close()
    finally:
        m.close()
    data = decode(b"".join(sink.lines))
    by_kind = {s.fields.get("job") or s.kind: s.src for s in data.sources.values()}
    counts = {name: sum(1 for s in data.samples if s.src == src) for name, src in by_kind.items()}
    # a healthy scrape still in flight at the next tick is skipped, not queued: on a loaded machine a
    # few are (9 of 12 seen); what shows the slow target holds nothing up is the gaps below
    assert counts["vllm"] >= 6 and counts["host"] == 12 and counts["gpu"] == 12 and counts["slow"] == 0
    downs = [e for e in data.events if e["k"] == "down"]
    assert [e["src"] for e in downs] == [by_kind["slow"]]
    for name in ("vllm", "host"):  # never held up by the slow target's 0.5 s scrapes
        times = [s.t for s in data.samples if s.src == by_kind[name]]
        gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(times)]
        assert max(gaps) < 0.55, (name, gaps)  # inline: every slow scrape adds >= 0.5 s + a tick


def test_profiling_flags_of_live_processes_only(tmp_path: Path) -> None:
    folder = node.node_dir(tmp_path)
    node._write_flag(folder, True)  # what a member's agent thread writes for mark_profiling(True)
    assert node.profiling_now(folder)
    (folder / node.PROFILING / "999999999").touch()  # a pid that does not exist
    node._write_flag(folder, False)
    assert not node.profiling_now(folder) and not (folder / node.PROFILING / "999999999").exists()


def test_a_member_hands_flags_and_targets_over_without_touching_a_file(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """``mark_profiling`` and ``publish_targets`` (called on training threads: VERL's step hooks, a
    registration) only hand work to the agent thread: with the agent held up, they return at once
    and nothing is on disk; once it runs, both are there."""
    started: list[Path] = []
    monkeypatch.setattr(node, "start_sampler", lambda folder, *a: started.append(folder))
    monkeypatch.setitem(node._state, "stay_out", False)  # conftest keeps pytest out; this test joins
    cfg = config_mod.Config(output_dir=tmp_path, metrics=True, metrics_node_dir=tmp_path / "nodes")
    folder = node.node_dir(tmp_path, cfg)
    node.join(cfg)
    try:
        agent = node._agent()
        assert agent is not None
        deadline = time.monotonic() + 10
        while not started and time.monotonic() < deadline:  # joined: listed, locked, sampler started
            time.sleep(0.01)
        assert started == [folder] and (folder / node.MEMBER_PIDS / str(os.getpid())).exists()
        with agent.io:  # the agent is busy (a slow temp dir, say)
            t0 = time.perf_counter()
            node.mark_profiling(True)
            node.publish_targets([{"job": "vllm", "address": "127.0.0.1:1", "labels": {}}])
            took = time.perf_counter() - t0
            time.sleep(0.2)
            assert not (folder / node.PROFILING).exists() and not (folder / node.TARGETS).exists()
        assert took < 0.05, took
        while not (folder / node.TARGETS).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (folder / node.PROFILING / str(os.getpid())).exists()
        assert [p.name for p in (folder / node.TARGETS).iterdir()] == [f"{os.getpid()}-1.json"]
    finally:
        node.leave()
    assert not (folder / node.MEMBER_PIDS / str(os.getpid())).exists()  # left: no longer listed


def test_the_sampler_samples_faster_while_a_profiled_step_runs(tmp_path: Path) -> None:
    from rl_trace_observer.capture.sampler import loop

    cfg = config_mod.load({"RL_TRACE_OUTPUT_DIR": str(tmp_path), "RL_TRACE_METRICS_INTERVAL_S": "1.0"})
    sampler = Sampler(cfg, tmp_path, ListSink(), host="h")
    assert loop.interval_now(sampler) == 1.0
    node._write_flag(node.node_dir(tmp_path), True)  # a member's agent marks a profiled step
    t0 = time.monotonic()
    loop._sleep_until(sampler, t0 + 1.0, 1.0)  # the flag is noticed within one fast slice
    assert time.monotonic() - t0 < 0.5 and loop.interval_now(sampler) == 0.1
    node._write_flag(node.node_dir(tmp_path), False)
    assert loop.interval_now(sampler) == 1.0
    sampler.close()


def test_without_prometheus_client_targets_are_recorded_not_scraped(tmp_path: Path, monkeypatch: Any) -> None:
    """The ``metrics`` extra missing: one reason in the meta line, no failing scrape per target."""
    import builtins

    real_import = builtins.__import__

    def no_prometheus(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("prometheus_client"):
            raise ImportError("No module named 'prometheus_client'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_prometheus)
    cfg = config_mod.load({"RL_TRACE_OUTPUT_DIR": str(tmp_path)})
    sink = ListSink()
    sampler = Sampler(cfg, tmp_path, sink, host="h")
    sampler._add({"job": "vllm", "address": f"127.0.0.1:{_free_port()}", "labels": {}})
    sampler.tick(0.1)
    sampler.close()
    data = decode(b"".join(sink.lines))
    assert data.meta["targets"] == {"scraped": False, "reason": data.meta["targets"]["reason"]}
    assert "prometheus_client" in data.meta["targets"]["reason"]
    assert not [e for e in data.events if e["k"] == "down"] and sampler.scrapes == 0
