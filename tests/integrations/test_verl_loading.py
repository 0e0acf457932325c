"""Our backend in every VERL process, loaded by VERL's own extension points, on a real Ray cluster.

Each actor imports the real ``verl`` (CPU torch 2.13), and calls a method decorated with VERL's real
``DistProfiler.annotate``, which enters ``RLInsightLogger.trace_state`` — which lazily calls
``rl_insight.init()`` with no arguments, exactly as VERL's workers do.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..capture_helpers import wait_until
from ..conftest import clean_env, requires, run_python
from ..trace_files import event_logs, process_records, spans

pytestmark = [pytest.mark.slow, requires("verl")]

RAY_DRIVER = """
    import os, time, ray
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        @ray.remote(num_cpus=1)
        class Worker:
            def __init__(self, rank):
                import verl  # loads our plugin through VERL's extension point under test
                from verl.utils.profiler.profile import DistProfiler
                self.rank = rank
                self.profiler = DistProfiler(rank=rank)
                prefix = "rl_trace_observer.integrations.verl"
                self.plugins = sorted(k for k in __import__("sys").modules if k.startswith(prefix))

            from verl.utils.profiler.profile import DistProfiler as _DP

            @_DP.annotate(role="actor_update")
            def update(self, n):
                time.sleep(0.01)
                return (n * 2, time.time_ns())

            def info(self):
                import os
                return os.getpid(), self.plugins

        workers = [Worker.remote(r) for r in range(2)]
        results = ray.get([w.update.remote(21) for w in workers])
        assert [r[0] for r in results] == [42, 42], results
        infos = ray.get([w.info.remote() for w in workers])
        for pid, plugins in infos:
            print("worker", pid, ",".join(plugins))
    finally:
        ray.shutdown()
"""


@pytest.mark.parametrize("mechanism", ["external_modules", "entry_point"])
def test_every_verl_worker_writes_its_own_log(out_dir: Path, mechanism: str) -> None:
    env = clean_env(
        RL_TRACE_OUTPUT_DIR=str(out_dir),
        RL_INSIGHT_SERVER_URL="local://rl-trace-observer",
        VERL_RL_INSIGHT_ENABLE="1",
        RL_TRACE_RUN_ID=f"test-{mechanism}",
    )
    if mechanism == "external_modules":
        env["VERL_USE_EXTERNAL_MODULES"] = "rl_trace_observer.integrations.verl.register"
        env["VERL_USE_EXTERNAL_PLUGINS"] = "none"  # prove this path alone is enough
    proc = run_python(RAY_DRIVER, env, timeout=400)
    workers = {
        int(line.split()[1]): line.split()[2]
        for line in proc.stdout.splitlines()
        if line.startswith("worker ")
    }
    assert len(workers) == 2
    assert all("rl_trace_observer.integrations.verl.register" in p for p in workers.values())

    def written() -> bool:  # each worker's drain writes its files, possibly after the worker exited
        recs = process_records(out_dir)
        return all(recs.get(pid, {}).get("events", {}).get("written") == 2 for pid in workers)

    assert wait_until(written, 60), process_records(
        out_dir
    )  # a loaded machine: the detached drains finish late
    logs, records = event_logs(out_dir), process_records(out_dir)
    assert set(workers) <= set(logs), (workers, logs.keys())
    lanes = set()
    for pid in workers:
        (span,) = spans(logs[pid])
        assert span["name"] == "actor_update" and span["pid"] == pid
        assert span["dur_ns"] >= 10_000_000
        lanes.add(span["args"]["state_lane_id"])
        record = records[pid]
        assert record["run_id"] == f"test-{mechanism}"
        assert record["ray"]["actor_id"] and record["ray"]["job_id"]
        assert record["lanes"] == {span["args"]["state_lane_id"]: span["tid"]}
    assert lanes == {"rank_0", "rank_1"}


def test_import_leaves_distprofiler_untouched_without_viztracer(out_dir: Path) -> None:
    code = """
        from verl.utils.profiler import profile
        names = ("start", "stop", "annotate", "step", "__init__")
        before = [profile.DistProfiler.__dict__[n] for n in names]  # raw descriptors: identity is exact
        import rl_trace_observer.integrations.verl.register as reg
        after = [profile.DistProfiler.__dict__[n] for n in names]
        assert all(a is b for a, b in zip(before, after)), "DistProfiler changed"
        print(reg.INSTALLED)
    """
    proc = run_python(code, clean_env(RL_TRACE_OUTPUT_DIR=str(out_dir), VERL_USE_EXTERNAL_PLUGINS="none"))
    assert "'rl_insight_backend': True" in proc.stdout and "'viztracer': False" in proc.stdout
