"""A run whose only step markers are torch.profiler's ``ProfilerStep#N`` (no event log): the watch
answers each step as its trace appears, equal to ``merge --shards`` + ``report`` afterwards.

Real ``torch.profiler`` (CPU), one trace file per profiling cycle as ``on_trace_ready`` writes it.
Before, such a run got no live step at all (the watch read step markers from event logs only).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rl_trace_observer.analysis.live.figures import step_figures
from rl_trace_observer.analysis.live.node_follow import fold, follow_node
from rl_trace_observer.analysis.live.options import WatchOptions
from rl_trace_observer.analysis.live.seen import Seen
from rl_trace_observer.analysis.live.watch import Watch, load_state

from ..conftest import requires
from .test_watch import _plain, post_hoc, rows

pytestmark = [requires("pyarrow", "torch"), pytest.mark.filterwarnings("ignore:Profiler:UserWarning")]


def _profiled_steps(run: Path, steps: int, after_each: Any) -> None:
    """``steps`` profiled training steps, each cycle's trace written whole, then ``after_each(i)``."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    written: list[int] = []

    def ready(prof: Any) -> None:
        written.append(len(written))
        prof.export_chrome_trace(str(run / f"trainer.rank0.{len(written)}.pt.trace.json"))

    x = torch.ones(64, 64)
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=0, active=1, repeat=steps),
        on_trace_ready=ready,
    ) as prof:
        for i in range(steps):
            for _ in range(3):
                x = torch.tanh(x @ x)
            prof.step()
            after_each(i)


def test_profiler_only_steps_are_answered_as_their_traces_appear(tmp_path: Path) -> None:
    run, out = tmp_path / "run", tmp_path / "watch"
    run.mkdir()
    watch = Watch(WatchOptions(run, out, settle_s=0))
    answered: list[list[int]] = []
    try:
        assert watch.look() == []
        _profiled_steps(run, 3, lambda i: answered.append(watch.look()))
        assert watch.look(final=True) == []
    finally:
        watch.close()
    assert [len(a) for a in answered] == [1, 1, 1], answered  # each step as its own trace appeared
    steps = [s for a in answered for s in a]
    state = load_state(out)
    assert sorted(int(s) for s in state["steps"]) == steps and not state["seen"]["logs"]
    summary, shards = post_hoc(run, tmp_path)
    assert [s["step"] for s in summary["steps"]] == steps  # the planner's steps, from the same markers
    for step in steps:
        record = json.loads((out / "steps" / f"step-{step}.json").read_text())
        assert record["figures"] == _plain(step_figures(summary, step)), step
        assert rows(out / record["piece"], step) == rows(shards, step), step


def test_a_run_with_an_event_log_keeps_its_own_steps(tmp_path: Path) -> None:
    """As the planner ranks them: where an event log is among the run's files, a profiler's markers
    are not steps (its ``global_step`` spans are), live and on a node of a Ray watch alike."""
    run = tmp_path / "run"
    run.mkdir()
    _profiled_steps(run, 2, lambda i: None)
    node = follow_node(str(run), {}, {}, profiles=True)
    known = Seen()
    assert fold(known, node) and len(known.profiled) == 2 and [w.step for w in known.windows()]
    line = {"ph": "X", "name": "update_actor", "ts_ns": 1, "dur_ns": 1, "pid": 1, "tid": 1}
    (run / "rl-insight-h-pid-1.chrome.jsonl").write_text(json.dumps(line) + "\n")
    node = follow_node(str(run), node["marks"], {}, profiles=not known.logs)
    fold(known, node)
    assert known.logs and known.windows() == []  # the event log states no step: none
    back = Seen.from_json(json.loads(json.dumps(known.to_json())))
    assert back.logs and back.profiled == known.profiled and back.windows() == []
