"""The watch's GPU and staleness series on ``/metrics``, from REAL report rows: the hand-built Kineto
trace of the GPU tests (exact ns known) and the rollout section's consumed batches. The Prometheus
test's live run has neither (no Kineto trace, no consume spans), so these series are held here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl_trace_observer.analysis.live.figures import step_figures
from rl_trace_observer.analysis.live.metrics import FAMILIES, GPU_KINDS, exposition, step_samples
from rl_trace_observer.analysis.report.output import summarize
from rl_trace_observer.analysis.report.rollout import rollout_section

from ..conftest import need
from ..report.test_gpu import hand_built
from ..report.test_report_rollout import _trace

US = 1000


@pytest.fixture(scope="module")
def gpu_record(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("gpu") / "hand.json"
    path.write_text(json.dumps(hand_built()))
    return {"step": 1, "figures": json.loads(json.dumps(step_figures(summarize(path), 1)))}


def _by_labels(samples: list[tuple[dict[str, str], float]]) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(labels.items())): value for labels, value in samples}


def test_gpu_busy_share_and_seconds_per_stage_are_the_reports_rows(gpu_record: dict[str, Any]) -> None:
    got = step_samples(gpu_record)
    busy = _by_labels(got["rl_trace_step_gpu_busy_ratio"])
    who = {"role": "trainer", "device": "GPU 0"}
    # rank 0: busy 450 of the step's 1000 µs; rank 1: 460 (tests/report/test_gpu.py, exact ns)
    assert busy == {
        tuple(sorted({**who, "rank": "0"}.items())): 0.45,
        tuple(sorted({**who, "rank": "1"}.items())): 0.46,
    }
    secs = _by_labels(got["rl_trace_step_gpu_seconds"])

    def at(rank: int, stage: str, kind: str) -> float:
        return secs[tuple(sorted({**who, "rank": str(rank), "stage": stage, "kind": kind}.items()))]

    assert at(0, "update", "busy") == 340 * US / 1e9
    assert at(0, "update", "compute") == 190 * US / 1e9
    assert at(0, "update", "comm") == 100 * US / 1e9
    assert at(0, "log_prob", "idle") == 100 * US / 1e9
    assert at(0, "all", "idle") == 550 * US / 1e9
    assert at(1, "all", "comm") == 360 * US / 1e9
    rows = gpu_record["figures"]["gpu.rows"]
    assert len(secs) == len(GPU_KINDS) * len(rows)  # every row, every kind, nothing else


def test_gpu_series_are_served_with_bounded_labels(gpu_record: dict[str, Any]) -> None:
    need("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    page = exposition({"steps": [gpu_record]})
    families = {f.name: f for f in text_string_to_metric_families(page)}
    for name in ("rl_trace_step_gpu_busy_ratio", "rl_trace_step_gpu_seconds"):
        assert name in families and name in FAMILIES
        for s in families[name].samples:
            assert set(s.labels) <= {"role", "rank", "device", "stage", "kind"}
            assert "step" not in s.labels  # the step is a value, never a label


def test_staleness_series_are_the_consumed_batches_lags() -> None:
    spans, windows, training = _trace()
    ro = rollout_section(spans, windows, training)
    assert ro is not None
    (stale,) = ro["staleness"]
    assert stale["lag_steps"] == {"0": 9, "1": 1}
    got = step_samples({"step": stale["step"], "figures": {"rollout.staleness": ro["staleness"]}})
    assert got["rl_trace_step_staleness_samples"] == [({}, 10.0)]
    assert got["rl_trace_step_staleness_max_lag_steps"] == [({}, 1.0)]
    assert got["rl_trace_step_staleness_mean_lag_steps"] == [({}, 0.1)]


@given(
    st.lists(
        st.dictionaries(st.integers(0, 50).map(str), st.integers(0, 1000), max_size=6), min_size=1, max_size=4
    )
)
def test_staleness_over_several_batches_pools_their_samples(batches: list[dict[str, int]]) -> None:
    rows = [{"step": 3, "lag_steps": b} for b in batches]
    got = step_samples({"step": 3, "figures": {"rollout.staleness": rows}})
    pooled: dict[int, int] = {}
    for b in batches:
        for lag, n in b.items():
            pooled[int(lag)] = pooled.get(int(lag), 0) + n
    total = sum(pooled.values())
    if not total:
        assert not any(k.startswith("rl_trace_step_staleness") for k in got)
        return
    (_, top), (_, mean) = (
        got["rl_trace_step_staleness_max_lag_steps"][0],
        got["rl_trace_step_staleness_mean_lag_steps"][0],
    )
    assert top == max(k for k, n in pooled.items() if n)
    assert min(k for k, n in pooled.items() if n) <= mean <= top
    assert got["rl_trace_step_staleness_samples"] == [({}, float(total))]


def test_a_step_without_gpu_or_staleness_rows_serves_none_of_their_series(tmp_path: Path) -> None:
    got = step_samples({"step": 1, "figures": {"steps": [{"step": 1, "dur_ns": 10, "roles": []}]}})
    assert not any("gpu" in k or "staleness" in k for k in got)
