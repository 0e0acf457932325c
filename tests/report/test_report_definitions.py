"""One definition per report figure, stated where it is shown (issue 29, item 4): the summary card's
straggler is the arrivals table's (the README's definition, not the duration table's); the weight-sync
table says what its total is and which step each sync belongs to; replica imbalance includes busy time.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from rl_trace_observer.analysis.report import html, terminal
from rl_trace_observer.analysis.report.output import summarize
from rl_trace_observer.analysis.report.rollout import rollout_section
from rl_trace_observer.analysis.report.style import fmt_ns

from .test_report import write_fixture
from .test_report_rollout import _trace


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return summarize(write_fixture(tmp_path_factory.mktemp("defs") / "merged.json.gz"))


def _cards(page: str) -> dict[str, str]:
    block = re.search(r'<div class="cards">(.*?)</div></div>', page, re.S)
    assert block
    return {k: v for v, k in re.findall(r"<b>(.*?)</b><span>(.*?)</span>", block.group(1))}


def test_the_cards_straggler_is_the_arrivals_tables_figure(summary: dict[str, Any]) -> None:
    by_duration = summary["stragglers"][0]["lag_ns"]
    worst = max(summary["arrivals"]["summary"], key=lambda r: r["median_lag_ns"])
    assert by_duration != worst["median_lag_ns"]  # the fixture tells the two apart
    cards = _cards(html.render(summary))
    (label,) = [k for k in cards if "straggler" in k]
    assert "by arrival" in label and worst["lane"] in label
    assert cards[label] == f"+{fmt_ns(worst['median_lag_ns'])}"
    # the duration table no longer calls itself "Stragglers"
    buf = io.StringIO()
    terminal.render(summary, Console(file=buf, width=200))
    text = buf.getvalue()
    assert "Slowest lane per stage, by duration" in text and "Stragglers (slowest" not in text


def test_weight_sync_rows_name_their_step_and_what_total_means() -> None:
    spans, windows, training = _trace()
    rollout = rollout_section(spans, windows, training)
    steps = [{"step": s, "start_ns": lo, "end_ns": hi} for s, lo, hi in windows]
    buf = io.StringIO()
    terminal._rollout(Console(file=buf, width=240), {"rollout": rollout, "steps": steps}, 10, compact=False)
    text = buf.getvalue()
    sync = text[text.index("Weight sync per version") :]
    header = next(line for line in sync.splitlines() if "version" in line and "total" in line)
    assert "step" in header
    row = next(line for line in sync.splitlines() if "100.0 ms" in line)  # the update_weights call
    assert re.search(r"│\s+1\s+│\s+1\s+│\s+100\.0 ms", row), row  # version 1, step 1, its total
    assert "total: the trainer's update_weights call, start to end" in " ".join(sync.split())


def test_replica_imbalance_counts_busy_time_and_says_so() -> None:
    spans, windows, training = _trace()
    rollout = rollout_section(spans, windows, training)
    assert rollout is not None
    (step,) = rollout["steps"]
    busy = [r["busy_ns"] for r in step["replicas"]]
    assert step["imbalance"]["busy_ns"] == round(max(busy) / (sum(busy) / len(busy)), 3)
    assert step["imbalance"]["busy_ns"] > step["imbalance"]["requests"]  # r9's 400 ms on replica 1
    buf = io.StringIO()
    terminal._rollout(Console(file=buf, width=240), {"rollout": rollout}, 10, compact=False)
    flat = " ".join(buf.getvalue().split())
    assert f"{step['imbalance']['busy_ns']:.3g}× busy" in flat
    assert "imbalance: max / mean over the step's replicas of requests, response tokens and busy time" in flat


def test_step_table_states_its_weight_sync_definition(summary: dict[str, Any], tmp_path: Path) -> None:
    buf = io.StringIO()
    terminal.render(summary, Console(file=buf, width=200))
    flat = " ".join(buf.getvalue().split())
    assert "weight sync = the lanes' own weight-sync stage spans" in flat
    assert "weight sync = the lanes" in " ".join(html.render(summary).split()).replace("&#x27;", "'")
