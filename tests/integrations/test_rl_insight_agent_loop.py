"""RL-Insight's agent-loop protocol (its docs/monitor/agent_loop_protocol.md), emitted with the real
rl_insight through our backend, merged into both formats and counted by the real Perfetto engine.

One ``agent_loop_session`` per session, explicit ``trace_span`` calls with given start and end ns
(``agent_task``, two ``gateway_generation`` turns, a zero-length ``agent_sandbox``), then
``session.finish`` (the ``agent_session`` span, from the session's creation to ``finish``). Half the
sessions finish after their given spans end (everything nests), half at once (``agent_task`` and
the second turn outlast ``agent_session`` on the same lane: slices that do not nest). Issue 34 item 2:
2 of the 20 spans (``agent_task`` among them) were missing from both outputs; all 20 must arrive, on
their session's lane (its track or the lane's "(overlap)" track beside it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rl_trace_observer.api import MergeOptions, merge

from ..conftest import clean_env, requires, run_python

pytestmark = [pytest.mark.perfetto, requires("rl_insight")]

PROGRAM = """
import time
import rl_trace_observer.integrations.rl_insight.register
import rl_insight
from rl_insight import agent_loop_session, trace_span
from rl_insight.agent_loop import agent_loop_lane_id

rl_insight.init(project="p", experiment_name="e")
MS = 1_000_000

class Trajectory:
    chain_id, reward_score, num_turns = 1, 1.0, 2

for n, (sample, sess) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
    session = agent_loop_session(project="p", experiment_name="e", sample=str(sample), session=str(sess),
                                 traj=0, uid=f"u{n}", global_steps=1, session_id=f"s{n}")
    ident = session.identity
    t = time.time_ns()
    trace_span(name="agent_task", start_time_ns=t, end_time_ns=t + 100 * MS,
               attributes={**ident, "monitor.trace_source": "task", "task_name": "t", "status": "success"})
    for turn, (a, b) in enumerate([(10, 40), (50, 90)], 1):
        trace_span(name="gateway_generation", start_time_ns=t + a * MS, end_time_ns=t + b * MS,
                   attributes={**ident, "monitor.trace_source": "gateway",
                               "state_lane_id": agent_loop_lane_id("e", str(sample), str(sess), 0),
                               "traj": 0, "chain_id": 1, "turn": turn, "status": "success"})
    trace_span(name="agent_sandbox", start_time_ns=t + 5 * MS, end_time_ns=t + 5 * MS,
               attributes={**ident, "monitor.trace_source": "sandbox", "lifecycle": "start",
                           "status": "success"})
    if n % 2 == 0:
        time.sleep(0.12)  # finished after its spans: they nest in agent_session
    session.finish(trajectories=[Trajectory()], status="success", runner_name="task",
                   reward_source="r", finished=True)
"""

LANES = [f"experiment=e/sample={s}/session={n}/traj=0" for s in (0, 1) for n in (0, 1)]
PER_LANE = ["agent_sandbox", "agent_session", "agent_task", "gateway_generation", "gateway_generation"]
BY_TRACK = (
    "select t.name as track, s.name as name from slice s join thread_track tt on s.track_id = tt.id "
    "join thread t using (utid) order by track, name"
)


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("agent-loop") / "out"
    run_python(
        PROGRAM, clean_env(RL_TRACE_OUTPUT_DIR=str(out), RL_INSIGHT_SERVER_URL="local://rl-trace-observer")
    )
    return out


@pytest.mark.parametrize("fmt", ["json.gz", "pftrace"])
def test_all_20_protocol_spans_arrive_on_their_lanes(engine: Any, captured: Path, fmt: str) -> None:
    res = merge([str(captured)], str(captured.parent / f"run.{fmt}"), MergeOptions())
    loaded = engine.load(res.output, [BY_TRACK])
    assert loaded.ok, loaded.summary()
    assert loaded.slices == 20, loaded.summary()
    by_lane: dict[str, list[str]] = {}
    for row in loaded.query(BY_TRACK).dicts():
        lane = next((lane for lane in LANES if lane in row["track"]), row["track"])
        by_lane.setdefault(lane, []).append(row["name"])
    assert {lane: sorted(names) for lane, names in by_lane.items()} == dict.fromkeys(LANES, PER_LANE)
