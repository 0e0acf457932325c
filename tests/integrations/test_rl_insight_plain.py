"""A plain RL-Insight program outside VERL (issue 29, item 8): with RL_TRACE_OUTPUT_DIR and the
local:// URL it writes nothing by itself (RL-Insight has no plugin discovery), one import or the
``python -m`` runner makes it write, and an import after ``rl_insight.init()`` says why nothing is
written. Real rl-insight, fresh interpreters."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rl_trace_observer.integrations.rl_insight import LOCAL_URL

from ..conftest import ROOT, clean_env, need, run_python
from ..trace_files import event_logs, spans

need("rl_insight")

PROGRAM = """
import rl_insight
rl_insight.init()
with rl_insight.trace_state("actor_update", state_lane_id="rank_0"):
    pass
rl_insight.metric_gauge("reward_mean", 0.5)
"""


def _env(out: Path) -> dict[str, str]:
    return clean_env(RL_TRACE_OUTPUT_DIR=str(out), RL_INSIGHT_SERVER_URL=LOCAL_URL)


def _written(out: Path) -> list[str]:
    return [e["name"] for events in event_logs(out).values() for e in spans(events)]


def test_without_registration_nothing_is_written(out_dir: Path) -> None:
    """Why the docs tell a plain user to import the register module (VERL does it through its plugins)."""
    run_python(PROGRAM, _env(out_dir))
    assert _written(out_dir) == []


def test_importing_the_register_module_first_writes_the_spans(out_dir: Path) -> None:
    run_python("import rl_trace_observer.integrations.rl_insight.register\n" + PROGRAM, _env(out_dir))
    assert _written(out_dir) == ["actor_update"]


def test_the_runner_needs_no_change_to_the_program(out_dir: Path, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import sys\nassert sys.argv[1:] == ['--steps', '2'], sys.argv\n" + PROGRAM)
    proc = subprocess.run(
        [sys.executable, "-m", "rl_trace_observer.integrations.rl_insight", str(script), "--steps", "2"],
        capture_output=True,
        text=True,
        timeout=240,
        env=_env(out_dir),
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert _written(out_dir) == ["actor_update"]


def test_registering_after_init_says_why_nothing_is_written(out_dir: Path) -> None:
    code = PROGRAM + "import rl_trace_observer.integrations.rl_insight.register\n"
    proc = run_python(code, _env(out_dir))
    assert "rl_insight.init() ran before rl_trace_observer was registered" in proc.stderr
    assert _written(out_dir) == []


def test_a_relative_output_dir_is_refused_with_one_warning(tmp_path: Path) -> None:
    """Issue 34 4c: before, capture was off with exit 0 and the only message was RL-Insight's own
    "Ray is not initialized; monitoring is disabled". A relative path is refused (a Ray worker
    starts in another directory, so it would name another folder there), said once per process."""
    script = tmp_path / "train.py"
    script.write_text(PROGRAM + "rl_insight.metric_gauge('reward_mean', 0.7)\n")
    proc = subprocess.run(
        [sys.executable, "-m", "rl_trace_observer.integrations.rl_insight", str(script)],
        capture_output=True,
        text=True,
        timeout=240,
        env=clean_env(RL_TRACE_OUTPUT_DIR="rel-out", RL_INSIGHT_SERVER_URL=LOCAL_URL),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    said = [ln for ln in proc.stderr.splitlines() if "RL_TRACE_OUTPUT_DIR='rel-out'" in ln]
    assert len(said) == 1, proc.stderr
    assert (
        "not an absolute path" in said[0] and "capture is off" in said[0] and "[rl-trace-observer]" in said[0]
    )
    assert not (tmp_path / "rel-out").exists()
