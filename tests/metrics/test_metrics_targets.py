"""Targets registered through ``rl_insight.update_prometheus_config`` and the node's sampler process.

Real rl-insight 0.3 (its own function, called as VERL calls it), real processes, real locks, real
HTTP: a prometheus_client server with vLLM's names, and a local HTTP server standing in for the
RL-Insight server's ``/api/v1/prometheus/targets`` (it records the POSTs it gets).
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

from rl_trace_observer.capture.sampler import node
from rl_trace_observer.merge.formats.metric_samples.decode import decode

from ..conftest import clean_env, requires, run_python

REGISTER = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from rl_trace_observer.integrations.rl_insight import install
assert install()
import rl_insight
rl_insight.update_prometheus_config(["127.0.0.1:1", "127.0.0.1:2"], "vllm", [{"replica": 0}, {"replica": 1}])
from verl.utils.tracking import RLInsightLogger  # VERL's own call path, as LLMServerManager uses it
RLInsightLogger.register_rollout_metrics(["127.0.0.1:3"], "sglang", labels=[{"replica": 2}])
from rl_trace_observer.capture import get_recorder
rec = get_recorder()
print("RECORD", __import__("json").dumps(rec.record().get("metrics_targets") if rec else None))
"""


class _TargetsServer(http.server.BaseHTTPRequestHandler):
    posts: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).posts.append({"path": self.path, "json": json.loads(body)})
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture
def rl_insight_server() -> Any:
    handler = type("H", (_TargetsServer,), {"posts": []})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", handler.posts
    srv.shutdown()
    srv.server_close()


def _targets(stdout: str) -> Any:
    line = next(line for line in stdout.splitlines() if line.startswith("RECORD "))
    return json.loads(line.removeprefix("RECORD "))


@requires("rl_insight", "verl")  # REGISTER calls VERL's RLInsightLogger
def test_local_mode_records_every_target_and_posts_nothing(tmp_path: Path, rl_insight_server: Any) -> None:
    env = clean_env(
        RL_TRACE_OUTPUT_DIR=str(tmp_path),
        RL_INSIGHT_SERVER_URL="local://rl-trace-observer",
        VERL_RL_INSIGHT_ENABLE="1",
    )
    proc = run_python(REGISTER, env)
    assert "Failed to register" not in proc.stderr + proc.stdout
    assert "No connection adapters" not in proc.stderr + proc.stdout
    got = _targets(proc.stdout)
    assert [(t["job"], t["address"], t["labels"]) for t in got] == [
        ("vllm", "127.0.0.1:1", {"replica": "0"}),
        ("vllm", "127.0.0.1:2", {"replica": "1"}),
        ("sglang", "127.0.0.1:3", {"replica": "2"}),
    ]
    assert all(t["registered_by"]["pid"] > 0 for t in got)
    record = json.loads(next(tmp_path.glob("rl-trace-process-*.json")).read_text())
    assert [t["address"] for t in record["metrics_targets"]] == ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
    assert not rl_insight_server[1]


@requires("rl_insight", "verl")  # REGISTER calls VERL's RLInsightLogger
def test_forwarding_posts_as_rl_insight_does(tmp_path: Path, rl_insight_server: Any) -> None:
    url, posts = rl_insight_server
    env = clean_env(
        RL_TRACE_OUTPUT_DIR=str(tmp_path),
        RL_INSIGHT_SERVER_URL=url,
        RL_TRACE_FORWARD_TO_RL_INSIGHT="1",
        VERL_RL_INSIGHT_ENABLE="1",
    )
    proc = run_python(REGISTER, env)
    assert len(_targets(proc.stdout)) == 3  # recorded as well
    assert [p["path"] for p in posts] == ["/api/v1/prometheus/targets"] * 2
    assert posts[0]["json"] == {
        "job_name": "vllm",
        "targets": [
            {"target": "127.0.0.1:1", "labels": {"replica": "0"}},
            {"target": "127.0.0.1:2", "labels": {"replica": "1"}},
        ],
    }


@requires("rl_insight", "verl")  # REGISTER calls VERL's RLInsightLogger
def test_a_real_server_gets_the_posts_without_the_forward_flag(
    tmp_path: Path, rl_insight_server: Any
) -> None:
    """Issue 34 item 2: RL-Insight's own test of this function failed with capture on (the POST was
    skipped unless RL_TRACE_FORWARD_TO_RL_INSIGHT=1). Only ``local://`` skips it now."""
    url, posts = rl_insight_server
    env = clean_env(RL_TRACE_OUTPUT_DIR=str(tmp_path), RL_INSIGHT_SERVER_URL=url, VERL_RL_INSIGHT_ENABLE="1")
    proc = run_python(REGISTER, env)
    assert len(_targets(proc.stdout)) == 3  # recorded as well
    assert [p["json"]["job_name"] for p in posts] == ["vllm", "sglang"]
    assert posts[1]["json"]["targets"] == [{"target": "127.0.0.1:3", "labels": {"replica": "2"}}]


@requires("rl_insight", "verl")  # REGISTER calls VERL's RLInsightLogger
def test_capture_off_leaves_rl_insight_alone(tmp_path: Path, rl_insight_server: Any) -> None:
    url, posts = rl_insight_server
    proc = run_python(REGISTER, clean_env(RL_INSIGHT_SERVER_URL=url, VERL_RL_INSIGHT_ENABLE="1"))
    assert _targets(proc.stdout) is None
    assert len(posts) == 2  # RL-Insight's own function ran, unchanged


# ------------------------------------------------------------------------ the sampler process
MEMBER = """
import os, sys, time
from pathlib import Path
from rl_trace_observer.capture.sampler import node
node.RECHECK_S = 0.2
from rl_trace_observer.capture import get_recorder
from rl_trace_observer.capture.sampler import publish_targets
from rl_trace_observer.testing.vllm_metrics import VllmMetrics
rec = get_recorder()
m = VllmMetrics()
address = m.serve()
if os.environ.get("PUBLISH"):
    publish_targets([{"job": "vllm", "address": address, "labels": {"replica": "0"}}])
if os.environ.get("FORK_S"):  # a child that shares our members.lock and never records anything
    while node._agent().members_fd is None:
        time.sleep(0.01)
    child = os.fork()
    if child == 0:
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        time.sleep(float(os.environ["FORK_S"]))
        os._exit(0)
    print("CHILD", child, flush=True)
deadline = time.monotonic() + float(os.environ["LIVE_S"])
i = 0
while time.monotonic() < deadline:
    i += 1
    m.iteration(running=i % 4, waiting=0, kv_usage=0.1, prompt_tokens=3, new_tokens=7)
    time.sleep(0.05)
print("DONE", os.getpid())
"""


def _member(out: Path, live_s: float, publish: bool, fork_s: float | None = None) -> Any:
    import subprocess
    import sys
    import textwrap

    env = clean_env(
        RL_TRACE_OUTPUT_DIR=str(out),
        RL_TRACE_METRICS="1",
        RL_TRACE_METRICS_INTERVAL_S="0.1",
        LIVE_S=str(live_s),
    )
    if publish:
        env["PUBLISH"] = "1"
    if fork_s is not None:
        env["FORK_S"] = str(fork_s)
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(MEMBER)], env=env, stdout=subprocess.PIPE, text=True
    )


def _sampler_pids(tmp_path: Path) -> list[int]:
    return sorted(
        int(p.name.split("-pid-")[1].split(".")[0]) for p in tmp_path.glob("metrics-*.samples.jsonl")
    )


@pytest.mark.slow
@requires("prometheus_client", "pynvml")  # MEMBER serves vLLM's metrics
def test_one_sampler_per_node_that_outlives_its_starter_and_stops_with_the_last_member(
    tmp_path: Path,
) -> None:
    """Three processes join; exactly one sampler runs; it keeps sampling after the process that
    started it exits, scrapes the target one of them registered, and exits when the last one left."""
    first = _member(tmp_path, 1.0, publish=False)
    time.sleep(0.5)
    others = [_member(tmp_path, 3.5, publish=(i == 0)) for i in range(2)]
    for p in [first, *others]:
        assert p.wait(timeout=60) == 0
    assert node.wait_for_sampler(tmp_path, timeout_s=10)
    assert len(_sampler_pids(tmp_path)) == 1
    data = decode(next(tmp_path.glob("metrics-*.samples.jsonl")).read_bytes())
    assert data.complete and not data.bad_lines
    assert data.meta["gpus"]["found"] == 0 and "NVML" in data.meta["gpus"]["reason"]
    vllm = [s for s in data.sources.values() if s.fields.get("job") == "vllm"]
    assert len(vllm) == 1
    scraped = [s for s in data.samples if s.src == vllm[0].src]
    assert len(scraped) >= 10  # ~2.5 s at 0.1 s after the first member left
    record = json.loads(
        next(tmp_path.glob(f"rl-trace-process-*-pid-{_sampler_pids(tmp_path)[0]}.json")).read_text()
    )
    assert record["role"] == "sampler" and record["artifacts"][0]["kind"] == "metric_samples"
    # its node folder is in this session's folder (conftest), none in the shared temp dir
    key = node.node_dir(tmp_path).name
    assert (Path(os.environ["RL_TRACE_METRICS_NODE_DIR"]) / key / node.MEMBERS).exists()
    import tempfile

    assert not (Path(tempfile.gettempdir()) / f"rl-trace-observer-{os.getuid()}" / key).exists()


@pytest.mark.slow
@requires("prometheus_client")  # MEMBER serves vLLM's metrics
def test_a_killed_sampler_is_replaced_by_a_member(tmp_path: Path) -> None:
    member = _member(tmp_path, 4.0, publish=False)
    deadline = time.monotonic() + 20
    while not _sampler_pids(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    (pid,) = _sampler_pids(tmp_path)
    os.kill(pid, signal.SIGKILL)
    while len(_sampler_pids(tmp_path)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert member.wait(timeout=60) == 0
    assert len(_sampler_pids(tmp_path)) == 2 and node.wait_for_sampler(tmp_path, timeout_s=10)


@pytest.mark.slow
def test_the_sampler_records_the_run_of_the_process_that_started_it(tmp_path: Path) -> None:
    """A recorder configured in code (no RL_TRACE_* in the environment) with metrics asked for:
    the sampler it starts writes its samples there and carries the same run id."""
    code = f"""
    import time
    from pathlib import Path
    from rl_trace_observer.config import Config
    from rl_trace_observer.capture import configure
    from rl_trace_observer.capture.sampler import node
    out = Path({str(tmp_path)!r})
    nodes = Path({os.environ["RL_TRACE_METRICS_NODE_DIR"]!r})  # the test session's, not the temp dir's
    configure(Config(output_dir=out, run_id="from-code", metrics=True, metrics_node_dir=nodes))
    deadline = time.monotonic() + 30
    while not list(out.glob("metrics-*.samples.jsonl")) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    """
    run_python(code, clean_env())
    assert node.wait_for_sampler(tmp_path, timeout_s=10)
    (pid,) = _sampler_pids(tmp_path)
    record = json.loads(next(tmp_path.glob(f"rl-trace-process-*-pid-{pid}.json")).read_text())
    assert record["role"] == "sampler" and record["run_id"] == "from-code"


def test_the_node_folder_is_where_rl_trace_metrics_node_dir_says(tmp_path: Path) -> None:
    """Tests (and users with a small /tmp) put the node folders elsewhere; the sampler a member starts
    gets the same folder whatever its own environment says (start_sampler passes it on)."""
    import tempfile

    from rl_trace_observer.config import load

    cfg = load({"RL_TRACE_METRICS_NODE_DIR": str(tmp_path / "nodes")})
    assert node.node_dir(tmp_path / "out", cfg).parent == tmp_path / "nodes" and not cfg.problems
    bad = load({"RL_TRACE_METRICS_NODE_DIR": "relative/dir"})
    assert bad.metrics_node_dir is None and "not an absolute path" in bad.problems[0]
    default = Path(tempfile.gettempdir()) / f"rl-trace-observer-{os.getuid()}"
    assert node.node_dir(tmp_path, load({})).parent == default


def test_a_config_built_in_code_starts_no_sampler_unless_asked(tmp_path: Path) -> None:
    from rl_trace_observer.config import Config, load

    assert Config(output_dir=tmp_path).metrics is False and load({}).metrics is True


def _wait_for_samples(out: Path, timeout_s: float = 30) -> int:
    deadline = time.monotonic() + timeout_s
    while not _sampler_pids(out) and time.monotonic() < deadline:
        time.sleep(0.05)
    (pid,) = _sampler_pids(out)
    return pid


@pytest.mark.slow
@requires("prometheus_client")  # MEMBER serves vLLM's metrics
def test_a_sampler_leaves_when_no_process_it_samples_for_is_alive(tmp_path: Path) -> None:
    """What was seen once: a test's sampler still running 1.5 h after the test, the only process with
    its members.lock, writing into the test's removed directory — the lock outlived every process the
    sampler was started for. Here the lock outlives them in a forked child that never records (as a
    dataloader worker may): the sampler leaves within seconds of its last listed member, saying why."""
    member = _member(tmp_path, 1.5, publish=False, fork_s=120)
    child = int(member.stdout.readline().split()[1])
    try:
        sampler = _wait_for_samples(tmp_path)
        assert member.wait(timeout=60) == 0
        gone = time.monotonic()
        assert node.wait_for_sampler(tmp_path, timeout_s=15), (
            "the sampler stays while only a child holds the lock"
        )
        assert time.monotonic() - gone < 10
        assert Path(f"/proc/{child}").exists()  # the child still holds the lock: the old rule kept going
        data = decode(next(tmp_path.glob(f"metrics-*-pid-{sampler}.samples.jsonl")).read_bytes())
        (stop,) = [e for e in data.events if e["k"] == "stop"]
        assert stop["reason"].startswith("no process it was started for is alive"), stop
    finally:
        os.kill(child, signal.SIGKILL)


@pytest.mark.slow
@requires("prometheus_client")  # MEMBER serves vLLM's metrics
def test_a_sampler_leaves_when_its_output_directory_is_removed(tmp_path: Path) -> None:
    """The output directory moved away (as a test's temp dir is removed) while a member still runs:
    the sampler leaves within seconds instead of writing on for as long as the member lives, and the
    member (re-checking every 0.2 s) starts no other one into the directory its writers recreate.

    CI of 255c6ce: a sampler the member had launched while the first was still starting won the
    election only after the first left, and sampled on into the recreated directory. Such a late
    sampler (launched here by hand) now exits on the ``left`` note; a later run into the same
    path (its first member finds no other) removes the note and gets a sampler again."""
    import subprocess
    import sys

    out = tmp_path / "run"
    member = _member(out, 120, publish=False)
    try:
        sampler = _wait_for_samples(out)
        out.rename(tmp_path / "moved")
        assert node.wait_for_sampler(out, timeout_s=10), "the sampler writes on into a removed directory"
        time.sleep(1.0)
        assert not node.sampler_running(node.node_dir(out)), "a member started another sampler"
        assert member.poll() is None  # its member is still there: only the directory went
        log = (node.node_dir(out) / "sampler.log").read_text()
        assert f"sampler pid {sampler} leaves: {out} was re" in log, log
        assert (node.node_dir(out) / node.LEFT).read_text().startswith(f"{out} was re")
        late = subprocess.run(
            [sys.executable, "-m", node.SAMPLER_MODULE, str(out)],
            env=clean_env(RL_TRACE_OUTPUT_DIR=str(out), RL_TRACE_METRICS="1"),
            capture_output=True,
            timeout=60,
        )
        assert late.returncode == 0, late.stderr
        assert _sampler_pids(out) == [], "a sampler started after the note samples into the new directory"
    finally:
        member.kill()
        member.wait(timeout=30)
    again = _member(out, 1.0, publish=False)  # a later run into the same path
    assert again.wait(timeout=60) == 0
    assert node.wait_for_sampler(out, timeout_s=15)
    assert len(_sampler_pids(out)) == 1, "the earlier run's note kept a new run unsampled"
    assert not (node.node_dir(out) / node.LEFT).exists()


@pytest.mark.parametrize("capture", [False, True])
def test_arguments_a_later_rl_insight_adds_reach_its_own_function(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capture: bool
) -> None:
    """RL-Insight's main branch passes ``project=`` and ``experiment_name=`` too: our wrapper hands
    whatever it is given to RL-Insight's function (a stand-in with that newer signature), never a
    TypeError of its own."""
    from rl_trace_observer.integrations.rl_insight.targets import make_wrapper

    calls: list[tuple[Any, ...]] = []

    def newer(
        addresses: list[str],
        job_name: Any = None,
        labels: Any = None,
        *,
        project: str = "",
        experiment_name: str = "",
    ) -> None:
        calls.append((addresses, job_name, labels, project, experiment_name))

    monkeypatch.setenv("RL_INSIGHT_SERVER_URL", "http://127.0.0.1:1")
    if capture:
        monkeypatch.setenv("RL_TRACE_OUTPUT_DIR", str(tmp_path))
    else:
        monkeypatch.delenv("RL_TRACE_OUTPUT_DIR", raising=False)
    make_wrapper(newer)(["127.0.0.1:9"], "rollout", None, project="p", experiment_name="e")
    assert calls == [(["127.0.0.1:9"], "rollout", None, "p", "e")]
