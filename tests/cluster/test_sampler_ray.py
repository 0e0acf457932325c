"""The metric sampler started by a real Ray actor that then exits (issue 34 item 3).

Measured on this local cluster (Ray 2.60, default settings): when a worker exits — its actor calls
``exit_actor`` or is ``ray.kill``-ed — the worker SIGKILLs its direct children within 6–18 ms, with
no SIGTERM first; a detached grandchild in its own session is left alone. The sampler used to be a
direct child of the member that started it: in the real-VERL test its file ended ``down, down,
stats`` with no ``stop`` line. Started detached, it outlives its starter and ends the normal way.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..conftest import need, requires
from ..ray_cluster import local_ray_cluster

ray = need("ray")

pytestmark = [pytest.mark.slow, requires("prometheus_client")]


@ray.remote(num_cpus=0)
class Member:
    """A Ray worker that captures with the metric sampler on, as every VERL worker does."""

    def start(self, out: str, nodes: str) -> int:
        from rl_trace_observer.capture import configure
        from rl_trace_observer.capture.sampler import node
        from rl_trace_observer.config import Config

        node._state["stay_out"] = False  # a worker that imported tests.conftest stays out: not this one
        configure(
            Config(output_dir=Path(out), metrics=True, metrics_interval_s=0.1, metrics_node_dir=Path(nodes))
        )
        deadline = time.monotonic() + 60
        while not list(Path(out).glob("metrics-*.samples.jsonl")) and time.monotonic() < deadline:
            time.sleep(0.05)
        return os.getpid()

    def leave(self, how: str) -> None:
        if how == "exit_actor":
            ray.actor.exit_actor()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with local_ray_cluster(["n0"], "/tmp/rts-") as started:
        yield started


def _kinds(path: Path) -> list[str]:
    return [json.loads(line)["k"] for line in path.read_bytes().splitlines()]


def _samplers(out: Path) -> list[Path]:
    return sorted(out.glob("metrics-*.samples.jsonl"))


def _wait_gone(out: Path, timeout_s: float) -> None:
    from rl_trace_observer.capture.sampler import node

    assert node.wait_for_sampler(out, timeout_s=timeout_s), "the sampler is still running"


@pytest.mark.parametrize("how", ["exit_actor", "kill"])
def test_a_sampler_outlives_the_actor_that_started_it_and_ends_with_its_stop_line(
    cluster: Any, tmp_path: Path, how: str
) -> None:
    out, nodes = tmp_path / "out", os.environ["RL_TRACE_METRICS_NODE_DIR"]
    starter, other = Member.remote(), Member.remote()
    ray.get(starter.start.remote(str(out), nodes))
    ray.get(other.start.remote(str(out), nodes))  # a second member: the sampler must stay for it
    (path,) = _samplers(out)
    if how == "kill":
        ray.kill(starter)
    else:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(starter.leave.remote(how))
    time.sleep(2.0)  # Ray's SIGKILL of the starter's direct children came within 20 ms
    samples_before = _kinds(path).count("s")
    time.sleep(1.0)
    assert _kinds(path).count("s") > samples_before, "the sampler died with the actor that started it"
    ray.kill(other)
    _wait_gone(out, 30)
    assert _samplers(out) == [path], "one sampler for the run, never replaced"
    kinds = _kinds(path)
    stop = next(json.loads(line) for line in path.read_bytes().splitlines() if b'"k":"stop"' in line)
    assert kinds[-2:] == ["stop", "stats"] and stop["reason"] == "no member holds members.lock", kinds[-5:]


def test_a_sampler_ended_by_sigterm_says_so(cluster: Any, tmp_path: Path) -> None:
    """``kill`` (or ``ray stop``) sends SIGTERM: the file ends with a stop line naming it."""
    import signal

    out, nodes = tmp_path / "out", os.environ["RL_TRACE_METRICS_NODE_DIR"]
    member = Member.remote()
    ray.get(member.start.remote(str(out), nodes))
    (path,) = _samplers(out)
    pid = int(path.name.split("-pid-")[1].split(".")[0])
    time.sleep(0.5)
    os.kill(pid, signal.SIGTERM)
    _wait_gone(out, 30)
    stop = next(json.loads(line) for line in path.read_bytes().splitlines() if b'"k":"stop"' in line)
    assert stop["reason"] == "SIGTERM" and _kinds(path)[-2:] == ["stop", "stats"]
    ray.kill(member)
