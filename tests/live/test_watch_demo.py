"""``rl-trace demo --watch``: a real ``rl-trace watch`` beside a real demo (real Ray, torch.profiler,
VizTracer, RL-Insight, the metric sampler): steps appear while the run goes, and at the end every step
equals the post-hoc ``merge --shards`` + ``report`` of the same run directory."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from rl_trace_observer.analysis.live.figures import step_figures
from rl_trace_observer.analysis.report.output import summarize
from rl_trace_observer.merge.options import MergeOptions
from rl_trace_observer.merge.pipeline.local import merge

from ..conftest import DEMO_STEPS, ROOT, clean_env, need_all


def _steps(url: str) -> list[dict[str, object]]:
    try:
        with urllib.request.urlopen(f"{url}api/steps", timeout=5) as resp:
            return list(json.loads(resp.read())["steps"])
    except OSError:
        return []


@pytest.mark.slow
def test_demo_watch_follows_the_run_while_it_trains(tmp_path: Path) -> None:
    """``rl-trace demo --watch``: the dashboard's URL on stderr before the first step, steps on it while
    the demo runs, every step answered by the end and equal to the post-hoc answer."""
    need_all("ray", "torch", "rl_insight", "pyarrow")
    out = tmp_path / "demo"
    cli = [sys.executable, "-m", "rl_trace_observer.cli.main"]
    env = clean_env(RAY_USAGE_STATS_ENABLED="0")
    demo = subprocess.Popen(
        [*cli, "demo", "--out", str(out), "--steps", str(DEMO_STEPS), "--watch", "--watch-port", "0"],
        env=env,
        cwd=ROOT,
        stdout=(tmp_path / "demo.out").open("w"),
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    url: list[str] = []

    def read_stderr() -> None:
        assert demo.stderr is not None
        for line in demo.stderr:
            lines.append(line)
            found = re.search(r"watching the run live: (http://127\.0\.0\.1:\d+/)", line)
            if found:
                url.append(found.group(1))

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    first_seen: dict[int, float] = {}
    try:
        while demo.poll() is None:
            if url:
                for s in _steps(url[0]):
                    first_seen.setdefault(int(s["step"]), time.monotonic())  # type: ignore[call-overload]
            time.sleep(0.2)
        demo_end = time.monotonic()
    finally:
        if demo.poll() is None:
            demo.kill()
        demo.wait()
    reader.join(30)
    log = "".join(lines)
    assert demo.returncode == 0, log + (tmp_path / "demo.out").read_text()
    assert url, log  # printed while the run went on
    assert first_seen and min(first_seen.values()) < demo_end, log  # steps appeared while it trained
    assert f"watch: {DEMO_STEPS} step(s) answered live (exit 0;" in log, log
    assert f"watch {out / 'run'} --out {out / 'watch'} --port 0" in log  # how to see it again
    _assert_equal_to_post_hoc(out / "run", out / "watch", tmp_path)


def _assert_equal_to_post_hoc(run_dir: Path, watch_dir: Path, tmp_path: Path) -> None:
    records = {
        int(p.stem.split("-")[1]): json.loads(p.read_text())
        for p in (watch_dir / "steps").glob("step-*.json")
    }
    assert sorted(records) == list(range(1, DEMO_STEPS + 1))
    shards = tmp_path / "post-shards"
    merge([str(run_dir)], str(tmp_path / "post.pftrace"), MergeOptions(shards=str(shards)))
    summary = summarize(shards)
    for step, record in records.items():
        post = json.loads(json.dumps(step_figures(summary, step)))
        mine = dict(record["figures"])
        # telemetry too: a gauge that last changed long before a step reaches it as a held sample
        assert "telemetry.host_cpu" in post and "telemetry.engines" in post
        assert post["rollout.weight_sync.syncs"] and all(  # the demo's syncs run inside its steps
            s["step"] == step for s in post["rollout.weight_sync.syncs"]
        )
        assert mine == post, step
        assert record["figures"]["steps"][0]["profiled"] == (step == 2)
        assert {r["role"] for r in record["figures"]["steps"][0]["roles"]} >= {"trainer", "rollout"}
    state = json.loads((watch_dir / "watch-state.json").read_text())
    assert state["seen"]["bad"] == {}
