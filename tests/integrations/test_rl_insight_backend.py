"""The ``rl_trace_observer`` backend inside the real, released rl-insight (each case in a fresh process)."""

from __future__ import annotations

import json
from pathlib import Path

from ..conftest import clean_env, requires, run_python
from ..trace_files import event_logs, process_records, spans

pytestmark = requires("rl_insight")

LOCAL_URL = "local://rl-trace-observer"

EMIT_EVERYTHING = """
    import asyncio, time
    import rl_insight
    t0 = time.time_ns()
    with rl_insight.trace_state("actor_update", state_lane_id="rank_0", step=3):
        time.sleep(0.002)
    with rl_insight.trace_state("vllm_generate", state_lane_id="replica_1"):
        pass
    rl_insight.trace_span(name="weight_sync", start_time_ns=t0 + 123456789, end_time_ns=t0 + 223456790,
                          attributes={"phase": "broadcast"})
    @rl_insight.trace_op("reward_fn")
    def reward(x):
        return x + 1
    assert reward(1) == 2
    @rl_insight.trace_op()
    async def agen():
        return 5
    assert asyncio.run(agen()) == 5
    sess = rl_insight.agent_loop_session(experiment_name="e", sample=0, session=1)
    sess.finish(trajectories=[], status="ok")
    rl_insight.metric_gauge("reward_mean", 0.75, step="3")
    rl_insight.metric_count("samples", 8)
    rl_insight.metric_histogram("response_length", 120.0)
    print(t0)
"""


def _names(out_dir: Path) -> tuple[dict[int, list[dict]], list[dict]]:
    logs = event_logs(out_dir)
    assert len(logs) == 1, logs.keys()
    (events,) = logs.values()
    return logs, events


def _check_everything(out_dir: Path, t0: int) -> None:
    _, events = _names(out_dir)
    by_name = {e["name"]: e for e in spans(events)}
    assert {"actor_update", "vllm_generate", "weight_sync", "reward_fn", "agen", "agent_session"} <= set(
        by_name
    )
    update = by_name["actor_update"]
    assert update["args"]["state_lane_id"] == "rank_0" and update["args"]["step"] == 3
    assert update["args"]["monitor.trace_segment"] == "state_interval"
    assert update["dur_ns"] >= 2_000_000
    sync = by_name["weight_sync"]
    assert (sync["ts_ns"], sync["dur_ns"]) == (t0 + 123456789, 100000001)  # exact, to the ns
    threads = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    assert threads[update["tid"]] == "RL-Insight · rank_0"
    assert threads[by_name["vllm_generate"]["tid"]] == "RL-Insight · replica_1"
    counters = {e["name"]: e for e in events if e["ph"] == "C"}
    assert counters["reward_mean"]["args"] == {"value": 0.75}
    assert counters["reward_mean"]["labels"]["step"] == "3"
    assert counters["samples"]["cat"] == "rl_insight.counter"
    assert counters["response_length"]["cat"] == "rl_insight.histogram"
    assert "agent_loop_session_info" in counters
    (record,) = process_records(out_dir).values()
    assert record["events"]["dropped"] == 0 and record["events"]["written"] == len(events)


def test_lazy_init_without_arguments_writes_through_our_backend(out_dir: Path) -> None:
    """VERL's workers call ``rl_insight.init()`` with no arguments: the default backend must be us."""
    code = (
        "from rl_trace_observer.integrations.rl_insight import install\n"
        "assert install()\n"
        "import rl_insight\n"
        "rl_insight.init()\n" + EMIT_EVERYTHING.replace("\n    ", "\n")
    )
    proc = run_python(code, clean_env(RL_TRACE_OUTPUT_DIR=str(out_dir), RL_INSIGHT_SERVER_URL=LOCAL_URL))
    _check_everything(out_dir, int(proc.stdout.split()[-1]))


def test_explicit_backend_config(out_dir: Path) -> None:
    code = (
        "from rl_trace_observer.integrations.rl_insight import install\n"
        "install()\n"
        "import rl_insight\n"
        "rl_insight.init(project='p', experiment_name='x',\n"
        "                config={'server': {'backend': 'rl_trace_observer'}})\n"
        + EMIT_EVERYTHING.replace("\n    ", "\n")
    )
    proc = run_python(code, clean_env(RL_TRACE_OUTPUT_DIR=str(out_dir), RL_INSIGHT_SERVER_URL=LOCAL_URL))
    _check_everything(out_dir, int(proc.stdout.split()[-1]))
    _, events = _names(out_dir)
    assert all(e["args"].get("project") == "p" for e in spans(events) if e["name"] == "actor_update")


def test_forwarding_reaches_a_recording_delegate(out_dir: Path) -> None:
    code = """
        import rl_insight.client  # registers RL-Insight's own "ray" factory
        from rl_insight.client.base import register_monitor_client
        received = []
        class Recording:
            def apply_event(self, event):
                received.append(event)
        register_monitor_client("ray", lambda conf: Recording())  # stands for the original Ray client
        from rl_trace_observer.integrations.rl_insight import install
        install()
        import rl_insight
        rl_insight.init()
        with rl_insight.trace_state("actor_update", state_lane_id="rank_0"):
            pass
        rl_insight.metric_gauge("loss", 1.0)
        print(len(received), received[0]["kind"], received[1]["kind"])
    """
    env = clean_env(
        RL_TRACE_OUTPUT_DIR=str(out_dir), RL_INSIGHT_SERVER_URL=LOCAL_URL, RL_TRACE_FORWARD_TO_RL_INSIGHT="1"
    )
    proc = run_python(code, env)
    assert proc.stdout.split() == ["2", "trace", "gauge"]
    _, events = _names(out_dir)
    assert [e["name"] for e in spans(events)] == ["actor_update"]


def test_forwarding_through_the_real_ray_client(out_dir: Path) -> None:
    """Events reach RL-Insight's real hub actor over Ray, and a failing delegate never raises."""
    code = """
        import time, ray
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            from rl_trace_observer.integrations.rl_insight import install
            install()
            import rl_insight
            rl_insight.init()
            for i in range(5):
                with rl_insight.trace_state("actor_update", state_lane_id="rank_0"):
                    pass
            rl_insight.metric_gauge("loss", 1.0)
            from rl_insight.client.ray_monitor_client import _current_job_actor_name
            from rl_insight.utils.constants import MonitorRayActor
            hub = ray.get_actor(_current_job_actor_name(), namespace=MonitorRayActor.NAMESPACE)
            deadline = time.time() + 60
            while True:
                applied = ray.get(hub.get_status.remote())["events_applied"]
                if applied >= 6 or time.time() > deadline:
                    break
                time.sleep(0.2)
            print(applied)
        finally:
            ray.shutdown()
    """
    env = clean_env(
        RL_TRACE_OUTPUT_DIR=str(out_dir),
        RL_INSIGHT_SERVER_URL="http://127.0.0.1:9",  # nothing listens: the hub only logs errors
        RL_TRACE_FORWARD_TO_RL_INSIGHT="1",
    )
    proc = run_python(code, env, timeout=300)
    assert int(proc.stdout.split()[-1]) == 6
    # the driver's own log has the spans; the hub actor (not a traced process) writes nothing of ours
    logs = event_logs(out_dir)
    assert sum(len(spans(ev)) for ev in logs.values()) == 5


def test_installing_changes_nothing_while_capture_is_off(tmp_path: Path) -> None:
    code = """
        from rl_trace_observer.integrations.rl_insight import install
        import rl_insight.client
        from rl_insight.client.base import create_monitor_client
        from rl_insight.utils.monitor_config_loader import load_monitor_config
        install()
        client = create_monitor_client(load_monitor_config({"server": {"url": "http://x:1"}}))
        print(type(client).__name__)  # Ray is not initialised: RL-Insight's own factory says None
        import time
        rl_insight.init(config={"server": {"backend": "rl_trace_observer", "url": "local://rl-trace-observer"}})
        t = time.time_ns()
        rl_insight.trace_span(name="actor_update", start_time_ns=t, end_time_ns=t + 1, attributes={})
    """
    # capture is off (RL_TRACE_OUTPUT_DIR relative); the child runs in tmp_path with its temp dir there
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = clean_env(RL_TRACE_OUTPUT_DIR="trace-out", TMPDIR=str(tmp))
    proc = run_python(code, env, cwd=tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["tmp"] and not list(tmp.iterdir())  # nothing written
    assert proc.stdout.strip() == "NoneType"


def test_incompatible_rl_insight_is_one_clear_error() -> None:
    code = """
        import logging, sys
        logging.basicConfig(stream=sys.stderr)
        import rl_insight.client.base as base
        del base.register_monitor_client  # what an incompatible release would look like
        from rl_trace_observer.integrations.rl_insight import install
        print(install(), install())
    """
    proc = run_python(code, clean_env(RL_TRACE_OUTPUT_DIR="/tmp/unused-rl-trace"))
    assert proc.stdout.split() == ["False", "False"]
    errors = [line for line in proc.stderr.splitlines() if "rl-insight" in line]
    assert errors and "lacks rl_insight.client.base.register_monitor_client" in errors[0]
    assert "supports rl-insight>=0.2,<0.4" in errors[0]


def test_process_record_names_the_event_log(out_dir: Path) -> None:
    code = """
        from rl_trace_observer.integrations.rl_insight import install
        install()
        import rl_insight
        rl_insight.init()
        with rl_insight.trace_state("train_batch", state_lane_id="rank_0"):
            pass
    """
    run_python(code, clean_env(RL_TRACE_OUTPUT_DIR=str(out_dir), RL_INSIGHT_SERVER_URL=LOCAL_URL))
    (record,) = process_records(out_dir).values()
    assert (out_dir / record["event_log"]).exists()
    assert record["lanes"] == {"rank_0": 1}
    assert json.loads((out_dir / record["event_log"]).read_text().splitlines()[1])["name"] == "train_batch"


def test_counters_are_drawn_as_running_totals_as_rl_insight_counts_them(out_dir: Path) -> None:
    """``metric_count`` sends increments; the track must show what RL-Insight's own Prometheus
    registry (the hub's ``MetricRegistry``, fed here by the forwarding delegate) reads: 1, 2, 3, 4."""
    code = """
        import json
        import rl_insight.client
        from rl_insight.client.base import register_monitor_client
        from rl_insight.utils.prometheus_utils import MetricRegistry
        from prometheus_client import REGISTRY
        registry = MetricRegistry()
        class Hub:  # what RL-Insight's MonitorHubActor does with a counter event
            def apply_event(self, event):
                if event["kind"] == "counter":
                    registry.count(event["name"], "", float(event["value"]), {}, dict(event["labels"]))
        register_monitor_client("ray", lambda conf: Hub())
        from rl_trace_observer.integrations.rl_insight import install
        install()
        import rl_insight
        rl_insight.init(project="p")
        for _ in range(4):
            rl_insight.metric_count("train_step_total", amount=1)
        rl_insight.metric_count("tokens_total", amount=2.5, role="actor")
        rl_insight.metric_count("tokens_total", amount=0.5, role="rollout")
        rl_insight.metric_count("tokens_total", amount=2.5, role="actor")
        print(json.dumps({
            "train_step_total": REGISTRY.get_sample_value("train_step_total", {"project": "p"}),
            "actor": REGISTRY.get_sample_value("tokens_total", {"project": "p", "role": "actor"}),
        }))
    """
    env = clean_env(
        RL_TRACE_OUTPUT_DIR=str(out_dir), RL_INSIGHT_SERVER_URL=LOCAL_URL, RL_TRACE_FORWARD_TO_RL_INSIGHT="1"
    )
    theirs = json.loads(run_python(code, env).stdout.strip().splitlines()[-1])
    _, events = _names(out_dir)
    counters = [e for e in events if e["ph"] == "C"]
    steps = [e["args"]["value"] for e in counters if e["name"] == "train_step_total"]
    assert steps == [1.0, 2.0, 3.0, 4.0] and steps[-1] == theirs["train_step_total"]
    by_role = {}
    for e in counters:
        if e["name"] == "tokens_total":
            by_role.setdefault(e["labels"]["role"], []).append(e["args"]["value"])
    assert by_role == {"actor": [2.5, 5.0], "rollout": [0.5]}  # one running total per label set
    assert by_role["actor"][-1] == theirs["actor"]
