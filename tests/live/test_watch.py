"""``rl-trace watch``: a run followed while the real capture layer writes it, step by step.

Every finished step is answered once (its piece of span shards, its Perfetto view, its report rows),
equal to ``rl-trace merge --shards`` + ``rl-trace report`` on the same directory afterwards; a
killed watch resumes without losing or repeating anything; a bad line is counted and named; a run cut
mid-step shows that step as unfinished.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rl_trace_observer as rto
from rl_trace_observer.analysis.live.figures import step_figures
from rl_trace_observer.analysis.live.follow import FileMark, Follower
from rl_trace_observer.analysis.live.options import WatchOptions
from rl_trace_observer.analysis.live.server import api_document
from rl_trace_observer.analysis.live.watch import Watch, load_state
from rl_trace_observer.merge.options import UsageError
from rl_trace_observer.merge.shards.dataset import Shards

from ..conftest import ROOT, clean_env, requires
from ..corpus.live_run import LiveRun

pytestmark = requires("pyarrow")
ROW_COLUMNS = ["step", "host", "pid", "role", "lane", "name", "ph", "ts_ns", "dur_ns", "args"]


def _plain(x: Any) -> Any:
    return json.loads(json.dumps(x))


def post_hoc(run_dir: Path, tmp: Path) -> tuple[dict[str, Any], Path]:
    """``rl-trace merge RUN --shards`` + ``rl-trace report`` on the whole directory."""
    shards = tmp / "post-shards"
    rto.merge([str(run_dir)], str(tmp / "post.pftrace"), rto.MergeOptions(shards=str(shards)))
    return rto.report(str(shards)), shards


def rows(shards: Path, step: int) -> list[tuple[Any, ...]]:
    table = Shards.open(shards).table(ROW_COLUMNS, steps=[step])
    return sorted(tuple(r[c] for c in ROW_COLUMNS) for r in table.to_pylist())


def assert_equal_to_post_hoc(out: Path, run_dir: Path, tmp: Path, steps: list[int]) -> None:
    summary, shards = post_hoc(run_dir, tmp)
    state = load_state(out)
    assert sorted(int(s) for s in state["steps"]) == steps
    for step in steps:
        record = json.loads((out / "steps" / f"step-{step}.json").read_text())
        assert record["figures"] == _plain(step_figures(summary, step)), step
        assert record["figures"]["steps"][0]["dur_ns"] > 0
        syncs = record["figures"]["rollout.weight_sync.syncs"]  # every corpus step syncs once
        assert [s["step"] for s in syncs] == [step] and syncs == _plain(step_figures(summary, step))[
            "rollout.weight_sync.syncs"
        ]
        assert rows(out / record["piece"], step) == rows(shards, step), step


def test_each_finished_step_is_answered_once_and_equals_the_post_hoc_report(tmp_path: Path) -> None:
    run = LiveRun(tmp_path / "run")
    run.add_sampler()  # a gauge held from long before every step (the sampler writes changes only)
    out = tmp_path / "watch"
    watch = Watch(WatchOptions(run.folder, out, settle_s=0))
    try:
        assert watch.look() == []  # nothing written yet
        for step in (1, 2, 3):
            run.step(step, slow=10 * step)
            assert watch.look() == [step]  # noticed as it finished, not before, not twice
            assert watch.look() == []
            assert (out / "views" / f"step-{step}.pftrace").stat().st_size > 0
        run.step(4, finish=False)  # the run stops mid-step
    finally:
        run.close()
    assert watch.look(final=True) == []
    status = watch.status()
    assert [s["step"] for s in status["steps"]] == [1, 2, 3]
    assert status["unfinished"] == {"after_step": 3, "last_event_ns": run.step_window(4)[0] + 95 * 10**6}
    assert status["bad_lines"]["total"] == 0
    stragglers = {(s["role"], s["stage"]): s for s in status["steps"][2]["figures"]["stragglers"]}
    assert stragglers[("trainer", "actor_update")]["slowest_lane"] == "rank_1"
    for record in status["steps"]:  # the held values reach every step's telemetry
        figures = record["figures"]
        assert {r["mean"] for r in figures["telemetry.host_cpu"]} == {100.0}, record["step"]
        engines = {e["replica"]: e for e in figures["telemetry.engines"]}
        step, engine = record["step"], engines[0]  # 3 running requests held until step 2 changed them to 1
        assert (engine["running_max"], engine["samples_in_step"]) == ((3.0, 0), (3.0, 1), (1.0, 0))[step - 1]
        assert engine["kv_cache_max"] == (0.25, 0.75, 0.75)[step - 1]  # the KV-cache use the step saw
        assert (engines[1]["running_max"], engines[1]["kv_cache_max"]) == (2.0, 0.5)  # held since before
        (sync,) = figures["rollout.weight_sync.syncs"]  # the step's own weight sync, by its start
        assert (sync["step"], sync["version"], sync["dur_ns"]) == (step, step, 10 * 10**6)
        assert sync["slowest_replica"] == 0 and sync["trainer_phases_ns"] == {"pause": 10**6}
    assert_equal_to_post_hoc(out, run.folder, tmp_path, [1, 2, 3])


@pytest.mark.parametrize(
    ("sync_ms", "growing"),
    [
        ((2, 4, 6, 8), [3, 4]),  # longer every step: said from step 3 (two steps before it to compare)
        ((8, 8.2, 7.9, 8.1), []),  # flat within jitter (under the 1 ms floor): never said
    ],
)
def test_the_one_line_answer_says_when_the_weight_sync_grows(
    tmp_path: Path, sync_ms: tuple[float, ...], growing: list[int]
) -> None:
    run = LiveRun(tmp_path / "run")
    out = tmp_path / "watch"
    try:
        for step, ms in enumerate(sync_ms, 1):
            run.step(step, sync_ms=ms)
    finally:
        run.close()
    watch = Watch(WatchOptions(run.folder, out, settle_s=0))
    assert watch.look(final=True) == [1, 2, 3, 4]
    doc = api_document(watch.status())
    said = [s["step"] for s in doc["steps"] if "weight sync growing" in s["answer"]]
    assert said == growing, [s["answer"] for s in doc["steps"]]
    for s in doc["steps"]:  # the figure it reads: the step's own sync, as the post-hoc report has it
        (sync,) = s["figures"]["rollout.weight_sync.syncs"]
        assert sync["dur_ns"] == round(sync_ms[s["step"] - 1] * 10**6)
    if growing:
        assert (
            "weight sync growing: 0.008 s, longer than in the 3 steps before (at most 0.006 s)"
            in (doc["steps"][3]["answer"])
        )
    assert_equal_to_post_hoc(out, run.folder, tmp_path, [1, 2, 3, 4])


def test_a_weight_sync_between_two_steps_is_the_next_steps_live_and_post_hoc(tmp_path: Path) -> None:
    """Step 2's sync starts 1 ms after step 2 ended, 50 ms before step 3 begins: wider than the
    watch's pad, so step 3's merge must reach back to step 2's end to hold it, as the whole run does."""
    run = LiveRun(tmp_path / "run")
    out = tmp_path / "watch"
    watch = Watch(WatchOptions(run.folder, out, settle_s=0, pad_s=0.01))
    try:
        run.step(1)
        assert watch.look() == [1]
        run.step(2, sync_at_ms=150)
        assert watch.look() == [2]
        run.step(3)
        assert watch.look() == [3]
    finally:
        run.close()
    summary, shards = post_hoc(run.folder, tmp_path)
    versions = {}
    for step in (1, 2, 3):
        record = json.loads((out / "steps" / f"step-{step}.json").read_text())
        assert record["figures"] == _plain(step_figures(summary, step)), step
        assert rows(out / record["piece"], step) == rows(shards, step), step
        syncs = record["figures"].get("rollout.weight_sync.syncs", [])
        versions[step] = sorted(s["version"] for s in syncs)
        assert all(s["step"] == step for s in syncs)
    assert versions == {1: [1], 2: [], 3: [2, 3]}  # step 2's sync feeds step 3: it shows there
    assert load_state(out)["steps"]["3"]["since_ns"] == run.step_window(2)[1]


def test_a_step_is_finished_only_settle_s_after_its_marker_was_read(tmp_path: Path) -> None:
    now = [0.0]
    run = LiveRun(tmp_path / "run")
    try:
        watch = Watch(WatchOptions(run.folder, tmp_path / "watch", settle_s=2.0), clock=lambda: now[0])
        run.step(1)
        assert watch.look() == []  # the marker was read just now
        now[0] = 1.0
        assert watch.look() == [] and watch.status()["pending"] == [1]
        now[0] = 3.5
        assert watch.look() == [1]
    finally:
        run.close()


def test_a_step_shown_before_better_clock_data_is_re_aligned_and_marked(tmp_path: Path) -> None:
    run = LiveRun(tmp_path / "run")
    run.add_remote_replica("h-b", 25 * 10**6)  # its clock reads 25 ms ahead; nobody knows yet
    out = tmp_path / "watch"
    watch = Watch(WatchOptions(run.folder, out, settle_s=0))
    try:
        run.step(1)
        assert watch.look() == [1]
        first = watch.steps[1]
        assert not first["corrected"] and '"unmeasured"' in first["clock_key"]
        run.measure_remote_clock(1)  # the offset arrives after step 1 was shown
        run.step(2)
        assert watch.look() == [2]
    finally:
        run.close()
    fixed = json.loads((out / "steps" / "step-1.json").read_text())
    assert fixed["corrected"] and fixed["revision"] == 2 and fixed["piece"] == "pieces/step-1.r2"
    assert fixed["previous"]["figures"] == _plain(first["figures"])  # what was shown, kept beside
    assert fixed["figures"] != fixed["previous"]["figures"]  # the replica's spans moved by 25 ms
    assert (out / "pieces" / "step-1").is_dir()  # the earlier piece is not rewritten
    assert watch.look(final=True) == []  # corrected once, not again
    assert load_state(out)["steps"]["1"]["corrected"]  # the state says so too (a restart keeps it)
    assert_equal_to_post_hoc(out, run.folder, tmp_path, [1, 2])


def _watch_cli(run: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "rl_trace_observer.cli.main", "watch", str(run), "--out", str(out), *extra]


def _wait(pred: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_kill_9_mid_run_and_a_restart_lose_and_repeat_nothing(tmp_path: Path) -> None:
    run = LiveRun(tmp_path / "run")
    out = tmp_path / "watch"
    cmd = _watch_cli(run.folder, out, "--port", "0", "--settle", "0", "--poll", "0.05")
    proc = subprocess.Popen(cmd, env=clean_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        run.step(1)
        run.step(2)
        _wait(lambda: (out / "steps" / "step-1.json").exists())
        run.step(3)
        time.sleep(0.2)  # mid-run: somewhere between looking, merging and recording
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
    seen_before = {int(s) for s in load_state(out).get("steps", {})}
    assert 1 in seen_before
    try:
        run.step(4)
        run.step(5, finish=False)
    finally:
        run.close()
    again = subprocess.run(
        [*cmd, "--once"], env=clean_env(), cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0, again.stderr
    assert "answered steps: 1, 2, 3, 4" in again.stdout
    answered_again = [
        int(x.split()[1].rstrip(":")) for x in again.stderr.splitlines() if x.startswith("step ")
    ]
    assert not set(answered_again) & seen_before  # a recorded step is never answered twice
    assert "unfinished" in again.stderr
    state = load_state(out)
    lines_on_disk = sum(
        p.read_bytes().count(b"\n") for p in run.folder.iterdir() if p.name.endswith(".jsonl")
    )
    assert state["seen"]["lines"] == lines_on_disk  # every line read exactly once across the kill
    assert_equal_to_post_hoc(out, run.folder, tmp_path, [1, 2, 3, 4])


def test_a_corrupt_line_is_counted_and_named_and_the_watch_goes_on(tmp_path: Path) -> None:
    run = LiveRun(tmp_path / "run")
    watch = Watch(WatchOptions(run.folder, tmp_path / "watch", settle_s=0))
    try:
        run.step(1)
        assert watch.look() == [1]
        log = next(p for p in run.folder.iterdir() if p.name.startswith("rl-insight-") and "7003" in p.name)
        number = log.read_bytes().count(b"\n") + 1
        with log.open("ab") as f:
            f.write(b'{"ph":"X","name":"vllm_generate","ts_ns":\x00garbage\n')
        run.step(2)
        assert watch.look() == [2]
    finally:
        run.close()
    bad = watch.status()["bad_lines"]
    assert bad == {"total": 1, "files": {log.name: {"count": 1, "lines": [number]}}}


def test_usage_errors(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    with pytest.raises(UsageError, match="inside the run directory"):
        Watch(WatchOptions(tmp_path / "run", tmp_path / "run" / "w"))
    with pytest.raises(UsageError, match="not a directory"):
        Watch(WatchOptions(tmp_path / "nope", tmp_path / "w"))
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "watch-state.json").write_text('{"schema": "other"}')
    with pytest.raises(UsageError, match="not a rl-trace-watch/1 state file"):
        Watch(WatchOptions(tmp_path / "run", tmp_path / "w"))
    proc = subprocess.run(
        _watch_cli(tmp_path / "nope", tmp_path / "w2", "--once"), capture_output=True, text=True
    )
    assert proc.returncode == 2 and "no such file or directory" in proc.stderr
    (tmp_path / "a-file").write_text("x")
    proc = subprocess.run(
        _watch_cli(tmp_path / "a-file", tmp_path / "w3", "--once"), capture_output=True, text=True
    )
    assert proc.returncode == 2 and "not a directory" in proc.stderr


# ------------------------------------------------------------------------------- the follower
def _collect(follower: Follower) -> list[tuple[str, int, bytes]]:
    got: list[tuple[str, int, bytes]] = []
    follower.poll(lambda rel, n, line, _at: got.append((rel, n, line)))
    return got


def test_follower_torn_lines_new_and_replaced_files(tmp_path: Path) -> None:
    a = tmp_path / "a.jsonl"
    a.write_bytes(b'{"x":1}\n{"x":')
    f = Follower(tmp_path)
    assert _collect(f) == [("a.jsonl", 1, b'{"x":1}')]  # the torn line waits
    assert _collect(f) == []
    with a.open("ab") as fh:
        fh.write(b"2}\n")
    assert _collect(f) == [("a.jsonl", 2, b'{"x":2}')]
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.jsonl").write_bytes(b"1\n")  # a file that appears later
    (tmp_path / "rec.json").write_bytes(b"{}")  # not a line file: noticed, not read line by line
    assert _collect(f) == [("sub/b.jsonl", 1, b"1")]
    a.rename(tmp_path / "a.old")  # the drain starts the log anew (a replaced directory)
    a.write_bytes(b'{"x":3}\n')
    assert ("a.jsonl", 1, b'{"x":3}') in _collect(f)
    assert f.marks["a.jsonl"].restarts == 1
    assert FileMark.from_json(f.marks["a.jsonl"].to_json()) == f.marks["a.jsonl"]


@settings(max_examples=60, deadline=None)
@given(
    lines=st.lists(
        st.binary(min_size=1, max_size=40).filter(lambda b: b"\n" not in b and b.strip()), max_size=30
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=8),
)
def test_follower_reads_each_complete_line_once_however_the_bytes_arrive(
    tmp_path_factory: pytest.TempPathFactory, lines: list[bytes], cuts: list[int]
) -> None:
    folder = tmp_path_factory.mktemp("follow")
    data = b"".join(line + b"\n" for line in lines) + b"torn"
    path = folder / "x.jsonl"
    path.write_bytes(b"")
    f = Follower(folder)
    got: list[bytes] = []
    written = 0
    for cut in sorted({min(c, len(data)) for c in cuts} | {len(data)}):
        with path.open("ab") as fh:
            fh.write(data[written:cut])
        written = cut
        f = Follower(folder, {k: FileMark.from_json(m.to_json()) for k, m in f.marks.items()})  # a restart
        got += [line for _, _, line in _collect(f)]
    assert got == lines
    assert f.marks["x.jsonl"].offset == len(data) - len(b"torn")


def test_a_step_that_cannot_be_merged_is_named_and_tried_again_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rl_trace_observer.analysis.live import answer

    now = [0.0]
    real = answer.answer_step
    calls: list[int] = []

    def failing_once(
        opts: Any, step: int, window: Any, revision: int = 1, skip: Any = None
    ) -> dict[str, Any]:
        calls.append(step)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        return real(opts, step, window, revision, skip)

    monkeypatch.setattr(answer, "answer_step", failing_once)
    run = LiveRun(tmp_path / "run")
    try:
        watch = Watch(WatchOptions(run.folder, tmp_path / "watch", settle_s=0), clock=lambda: now[0])
        run.step(1)
        assert watch.look() == [] and "No space left" in watch.status()["errors"][0]
        assert watch.look() == [] and calls == [1]  # not hammered on every look
        now[0] = 11.0
        assert watch.look() == [1] and watch.status()["errors"] == []
    finally:
        run.close()


def test_a_step_merge_leaves_lines_that_ended_long_before_it_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The follower knows where each event log's old lines lie: a step's merge is handed those byte runs
    to skip (``MergeOptions.skip_lines``), reads less, and answers exactly the same."""
    from rl_trace_observer.analysis.live import answer, seen

    monkeypatch.setattr(answer, "SKIP_MARGIN_NS", 0)  # the test's steps are 200 ms apart, not minutes
    monkeypatch.setattr(seen, "RUN_NS", 50 * 10**6)
    run = LiveRun(tmp_path / "run")
    run.add_sampler()
    out = tmp_path / "watch"
    watch = Watch(WatchOptions(run.folder, out, settle_s=0, pad_s=0.05))
    try:
        for step in (1, 2, 3, 4):
            run.step(step, slow=10 * step)
            assert watch.look() == [step]
    finally:
        run.close()
    runs = json.loads(json.dumps(watch.seen.runs))  # as saved (skip_lines below folds runs in memory)
    read = [
        json.loads((out / "views" / f"step-{s}.pftrace.manifest.json").read_text())["counts"]["events_read"]
        for s in (1, 2, 3, 4)
    ]
    assert read[3] < read[0] * 2, read  # step 4 read about one step's lines, not four steps'
    assert watch.seen.skip_lines(run.folder, run.step_window(4)[0])  # runs known for the event logs
    assert_equal_to_post_hoc(out, run.folder, tmp_path, [1, 2, 3, 4])
    # a restarted watch knows the runs too (they are in its state)
    again = Watch(WatchOptions(run.folder, out, settle_s=0, pad_s=0.05))
    assert json.loads(json.dumps(again.seen.runs)) == runs


def test_a_step_shown_before_a_process_record_changed_is_answered_again_and_marked(tmp_path: Path) -> None:
    """A process record rewritten after a step was shown (a worker that learns its rank late) changes
    that step's figures: it is merged again, marked ``corrected``, and equals the post-hoc answer."""
    run = LiveRun(tmp_path / "run")
    out = tmp_path / "watch"
    watch = Watch(WatchOptions(run.folder, out, settle_s=0))
    try:
        run.step(1)
        assert watch.look() == [1]
        run.recorders[7002].update_identity(role="trainer", rank=5, world_size=6)
        run.step(2)
        assert watch.look() == [2]
    finally:
        run.close()
    fixed = json.loads((out / "steps" / "step-1.json").read_text())
    assert fixed["corrected"] and fixed["revision"] == 2
    assert fixed["previous"]["identity"] != fixed["identity"]
    assert_equal_to_post_hoc(out, run.folder, tmp_path, [1, 2])
