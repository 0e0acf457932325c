"""Two "actor rank" processes produce a real run directory with the real tools:

- RL-Insight spans through the released ``rl_insight`` client and our backend (``install()``);
- a ``torch.profiler`` CPU trace (``.json.gz``, VERL's file naming) with ``record_function``;
- a VizTracer report from its Python API (``VizTracer.save()``);
- process records from the capture layer, with the artifacts registered and step snapshots.

Each rank runs ``actor_update`` as an RL-Insight state span AND a ``record_function`` of the same
region, so a merged timeline must show the region starting inside the span, no later than the time the
child measured between entering the one and being inside the other (its ``window``; under a loaded
machine that is tens of ms, on a quiet one well under a millisecond) plus a millisecond.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

CHILD = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    rank, out = int(sys.argv[1]), Path(sys.argv[2])
    from rl_trace_observer.integrations.rl_insight import install
    assert install()
    import rl_insight
    rl_insight.init(config={"server": {"backend": "rl_trace_observer", "url": "local://rl-trace-observer"}})
    from rl_trace_observer.capture import get_recorder
    rec = get_recorder()
    rec.update_identity(role="actor", rank=rank, world_size=2)
    import torch, viztracer
    from torch.profiler import profile, record_function, ProfilerActivity

    def work(n):
        x = torch.randn(48, 48)
        for _ in range(n):
            x = (x @ x) / 48.0
        return float(x.sum())

    rec.clock_snapshot("step_begin", step=1)
    viz_path = out / f"viztracer_actor_rank{rank}_pid{os.getpid()}.json"
    viz = viztracer.VizTracer(output_file=str(viz_path), verbose=0, max_stack_depth=6)
    viz.start()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        before = time.time_ns()
        with rl_insight.trace_state("actor_update", state_lane_id=f"rank_{rank}", step=1):
            with record_function("actor_update"):
                window = time.time_ns() - before
                work(4)
                time.sleep(0.02)
        with rl_insight.trace_state("forward_backward", state_lane_id=f"rank_{rank}"):
            work(2)
    viz.stop()
    viz.save()
    torch_path = out / f"verl_train_step1_rank{rank}_pid{os.getpid()}_20260101000000000.json.gz"
    prof.export_chrome_trace(str(torch_path))
    rec.register_artifact(torch_path, "torch", step=1, rank=rank)
    rec.register_artifact(viz_path, "viztracer", step=1, rank=rank)
    rl_insight.metric_gauge("reward_mean", 0.5 + rank, step="1")
    rec.clock_snapshot("step_end", step=1)
    print("window", window)
    print(os.getpid())
    """
)


def build_real_run(
    host_dir: Path, run_id: str = "run-1", ranks: int = 2, windows: dict[int, int] | None = None
) -> list[int]:
    """Run ``ranks`` child processes writing into ``host_dir``; returns their pids (and fills
    ``windows``: pid -> ns between entering the RL-Insight span and being inside the Torch region)."""
    from ..conftest import need_all

    need_all("torch", "rl_insight")  # the children's real tools: a skip naming the extra when missing
    host_dir.mkdir(parents=True, exist_ok=True)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RL_TRACE_", "RL_INSIGHT_", "VERL_")) and k != "PYTHONPATH"
    }
    env.update(RL_TRACE_OUTPUT_DIR=str(host_dir.resolve()), RL_TRACE_RUN_ID=run_id, RAY_AUTH_MODE="disabled")
    if os.environ.get("RL_TRACE_METRICS_NODE_DIR"):  # this session's node folder (conftest): see below
        env["RL_TRACE_METRICS_NODE_DIR"] = os.environ["RL_TRACE_METRICS_NODE_DIR"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(rank), str(host_dir)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(ranks)
    ]
    pids = []
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        if proc.returncode != 0:
            raise AssertionError(f"corpus child failed ({proc.returncode}):\n{out}\n{err}")
        lines = out.strip().splitlines()
        pids.append(int(lines[-1]))
        if windows is not None:
            windows[pids[-1]] = int(next(x for x in lines if x.startswith("window ")).split()[1])
    # The children's node sampler outlives them by up to a few ticks and writes its last samples then:
    # a run read before it left differs from one read after (two merges of this run once differed by
    # one memory sample, in CI). The run is over when its sampler is.
    from rl_trace_observer.capture.sampler import node

    node.wait_for_sampler(host_dir.resolve(), timeout_s=60)
    return pids
