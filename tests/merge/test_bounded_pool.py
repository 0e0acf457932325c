"""The one bounded pool both executors use: order, the byte budget, heartbeats (real processes)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trace_observer.merge.job.pool import BoundedPool, start_method


def _slow_square(item: tuple[int, int, float]) -> tuple[int, int]:
    index, _, delay = item
    time.sleep(delay)
    return index * index, os.getpid()


def _weight(item: tuple[int, int, float]) -> int:
    return item[1]


def test_ordered_results_come_back_in_item_order_from_worker_processes() -> None:
    items = [(i, 1, 0.05 if i % 2 == 0 else 0.0) for i in range(8)]  # the even ones finish last
    pool = BoundedPool(_slow_square, _weight, 2, start_method("fork"), ordered=True)
    got = [g for g in pool.run(items) if g is not None]
    assert [item[0] for item, _ in got] == list(range(8))
    assert [res[0] for _, res in got] == [i * i for i in range(8)]
    assert os.getpid() not in {res[1] for _, res in got}


def test_unordered_results_and_heartbeats_while_a_long_job_runs() -> None:
    items = [(0, 1, 0.6), (1, 1, 0.0)]
    pool = BoundedPool(_slow_square, _weight, 2, start_method("fork"), ordered=False, heartbeat_s=0.1)
    got = list(pool.run(items))
    done = [g[0][0] for g in got if g is not None]
    assert done == [1, 0]  # the quick one first
    assert got.count(None) >= 2  # the node's driver hears from it while the long job runs


def _logged(item: tuple[int, int, float, str]) -> int:
    index, weight, delay, log = item
    with open(log, "a") as f:
        f.write(f"+{weight}\n")
    time.sleep(delay)
    with open(log, "a") as f:
        f.write(f"-{weight}\n")
    return index


def _logged_weight(item: tuple[int, int, float, str]) -> int:
    return item[1]


@settings(max_examples=10, deadline=None)
@given(st.lists(st.integers(1, 100), min_size=2, max_size=7), st.integers(50, 150))
def test_never_more_than_the_budget_runs_at_once_unless_one_job_alone(
    tmp_path_factory: Any, weights: list[int], budget: int
) -> None:
    log = str(tmp_path_factory.mktemp("pool") / "log")
    items = [(i, w, 0.02, log) for i, w in enumerate(weights)]
    pool = BoundedPool(_logged, _logged_weight, 3, start_method("fork"), ordered=True, budget=budget)
    assert [g[1] for g in pool.run(items) if g is not None] == list(range(len(items)))
    running = peak = 0
    for line in Path(log).read_text().split():
        running += int(line)
        peak = max(peak, running)
    assert peak <= max(budget, max(weights))
