"""Clock offsets measured over a real local Ray cluster, against injected clocks with known truth.

Each simulated "host" is a Ray actor whose Recorder reads a ``ShiftedClock`` (+37 ms, −120 ms, and
one drifting 50 ppm). The exchange runs through real Ray calls; results land in the actors' real
process records, which the merge-side plan then turns into corrections.
"""

from __future__ import annotations

import glob
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..conftest import need

ray = need("ray")

from rl_trace_observer.capture.clock import SYSTEM_CLOCK, ShiftedClock  # noqa: E402
from rl_trace_observer.capture.recorder import Recorder  # noqa: E402
from rl_trace_observer.config import Config  # noqa: E402
from rl_trace_observer.integrations.ray import clock_sync as rcs  # noqa: E402
from rl_trace_observer.merge.clock.hosts import plan  # noqa: E402

from ..conftest import clean_env, run_python  # noqa: E402

pytestmark = pytest.mark.slow

TRUTH = {"host-a": (37_000_000, 0.0), "host-b": (-120_000_000, 0.0), "host-c": (5_000_000, 50.0)}
# The budget given to every measurement that a test needs to succeed: what the test calls a hang. A
# measurement ends as soon as its rounds are done, so this costs nothing on a healthy machine, and on
# a loaded one (a Ray round trip of 30-200 ms beside a CPU burner) the outcome does not depend on the
# latency; how fast a measurement is, is a figure of benchmarks/clock_handshake.py.
HANG_MS = 20_000.0


class TracedProcess(rcs.ClockResponderMixin):
    """A traced process with its own (shifted) clock that answers exchanges itself."""

    def __init__(self, out_dir: str, host: str, offset_ns: int, drift_ppm: float) -> None:
        self.clock = ShiftedClock(offset_ns, drift_ppm)
        self.rec = Recorder(Config(output_dir=Path(out_dir)), self.clock, host=host)

    def rl_trace_clock_recorder(self) -> Recorder:
        return self.rec

    def truth(self, real_wall_ns: int) -> int:
        return self.clock.offset_at(real_wall_ns)

    def jump(self, delta_ns: int) -> None:
        self.clock.jump(delta_ns)

    def busy_until(self, release: str, limit_s: float) -> None:
        """Hold the actor (its methods run one at a time) until the file ``release`` exists."""
        deadline = time.monotonic() + limit_s
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.01)

    def region(self, name: str, at_real_ns: int, dur_ns: int) -> tuple[int, int]:
        """Record a span starting when the REAL clock reaches ``at_real_ns``; return the real clock read
        right before and right after the span's start stamp (the truth lies between them)."""
        while time.time_ns() < at_real_ns:
            time.sleep(0.0002)
        before, start, after = time.time_ns(), self.clock.wall_ns(), time.time_ns()
        time.sleep(dur_ns / 1e9)
        self.rec.span(name, start, start + dur_ns, lane="rank_0")
        self.rec.close()
        return before, after


class ReleasingProcess(TracedProcess):
    """Answers exchanges like any traced process, and touches ``release`` first: the sign that a
    sequential measurement has moved on to it."""

    def __init__(self, out_dir: str, host: str, release: str) -> None:
        super().__init__(out_dir, host, 0, 0.0)
        self.release = release

    def rl_trace_clock_ping(self) -> tuple[int, int, int, str, int]:
        Path(self.release).touch()
        return super().rl_trace_clock_ping()


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)  # our own cluster
    try:
        yield
    finally:
        ray.shutdown()


def _records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(Path(p).read_text()) for p in sorted(glob.glob(str(out / "rl-trace-process-*.json")))]


def _check_truth(measurements: list[dict[str, Any]], truth_of: dict[str, Any]) -> None:
    for m in measurements:
        truth = truth_of[m["host"]](m["reference_wall_ns"])
        err = m["offset_ns"] - truth
        assert abs(err) <= m["uncertainty_ns"], (m["host"], err, m["uncertainty_ns"])
        assert m["uncertainty_ns"] * 2 >= m["round_trip_ns"] and m["rounds"] >= 1


def test_offsets_over_ray_match_truth_and_align_the_timeline(ray_cluster: None, tmp_path: Path) -> None:
    out = tmp_path / "trace"
    out.mkdir()
    # host-a and host-b answer as per-node responder actors, host-c as a per-process responder.
    node_a = rcs.start_responder(out, clock=ShiftedClock(*TRUTH["host-a"]), host="host-a")
    node_b = rcs.start_responder(out, clock=ShiftedClock(*TRUTH["host-b"]), host="host-b")
    proc_c = ray.remote(num_cpus=0)(TracedProcess).remote(str(out), "host-c", *TRUTH["host-c"])
    ray.get([node_a.identity.remote(), node_b.identity.remote(), proc_c.truth.remote(0)])

    ref = Recorder(Config(output_dir=out), SYSTEM_CLOCK, host="ref-host")
    sync = rcs.ClockSync(ref, node_responders=False, budget_ms=HANG_MS)
    sync.add_target(node_a, "node")
    sync.add_target(node_b, "node")
    sync.add_target(proc_c, "process")
    truth_a, truth_b = ShiftedClock(*TRUTH["host-a"]), ShiftedClock(*TRUTH["host-b"])
    truth_of = {
        "host-a": truth_a.offset_at,
        "host-b": truth_b.offset_at,
        "host-c": lambda t: ray.get(proc_c.truth.remote(t)),
    }
    found = []
    for step in (1, 2):
        for phase in ("begin", "end"):
            res = sync.measure(step=step, phase=phase)
            assert res.unanswered == 0 and len(res.measurements) == 3
            _check_truth(res.measurements, truth_of)
            found += res.measurements
            time.sleep(0.05)
    # The budget holds even when a target cannot answer (an actor busy in a long method): the call
    # waits out its budget for it, then returns while that actor is still held (how close to the
    # budget it returns is a speed figure: benchmarks/clock_handshake.py).
    busy = ray.remote(num_cpus=0)(TracedProcess).remote(str(tmp_path / "busy"), "host-busy", 0, 0.0)
    ray.get(busy.truth.remote(0))
    release = tmp_path / "release-busy"
    held = busy.busy_until.remote(str(release), 60.0)
    t0 = time.monotonic_ns()
    quick = rcs.measure_offsets([node_a, node_b, busy], budget_ms=20.0, record=False)
    took = time.monotonic_ns() - t0
    still_busy = not ray.wait([held], timeout=0)[0]
    release.touch()
    ray.get(held)
    assert still_busy and quick.unanswered >= 1 and 20_000_000 <= quick.took_ns <= took
    assert all(m["host"] != "host-busy" for m in quick.measurements)
    _check_truth(quick.measurements, truth_of)
    ray.kill(busy)
    print("uncertainties µs:", sorted(m["uncertainty_ns"] // 1000 for m in found))

    # The same real moment, recorded in two processes whose clocks disagree by 157 ms.
    proc_b = ray.remote(num_cpus=0)(TracedProcess).remote(str(out), "host-b2", *TRUTH["host-b"])
    sync2 = rcs.ClockSync(ref, node_responders=False, budget_ms=HANG_MS)
    sync2.add_target(proc_c)
    sync2.add_target(proc_b)
    ray.get(proc_b.truth.remote(0))
    assert sync2.measure(step=3, phase="begin").unanswered == 0
    at = time.time_ns() + 300_000_000
    real_c, real_b = ray.get([proc_c.region.remote("actor_update", at, 20_000_000),
                              proc_b.region.remote("actor_update", at, 20_000_000)])  # fmt: skip
    # the records are written by each process's drain: on disk once flushed
    assert all(ray.get([h.rl_trace_clock_flush.remote() for h in (node_a, node_b, proc_c, proc_b)]))
    assert ref.flush()
    real_lo, real_hi = real_c[0] - real_b[1], real_c[1] - real_b[0]  # the true gap lies in here

    records = _records(out)
    aligned = plan(records, mode="auto", tolerance_us=5000)
    assert aligned.mode == "aligned" and aligned.reference_host == "ref-host"
    section = aligned.manifest_section()
    assert set(section["hosts"]) == {"ref-host", "host-a", "host-b", "host-b2", "host-c"}
    assert section["hosts"]["ref-host"]["method"] == "reference"
    for host in ("host-a", "host-b", "host-c"):
        entry = section["hosts"][host]
        assert entry["method"] == "ray_ntp" and entry["samples_total"] >= 4 and entry["applied"]
        corr = aligned.correction_for(host)
        ts = entry["offset_at_wall_ns"]
        truth = truth_of[host](ts - entry["offset_ns"])
        assert abs((ts - corr(ts)) - truth) <= entry["uncertainty_ns"] + 1
    spans = _spans(out)
    fix_c, fix_b = aligned.correction_for("host-c"), aligned.correction_for("host-b2")
    raw_gap = spans["host-c"] - spans["host-b2"]
    gap = fix_c(spans["host-c"]) - fix_b(spans["host-b2"])
    bound = section["hosts"]["host-c"]["uncertainty_ns"] + section["hosts"]["host-b2"]["uncertainty_ns"]
    assert raw_gap - real_lo > 100_000_000  # the raw stamps are 125 ms off the true gap, whatever the latency
    assert real_lo - bound <= gap <= real_hi + bound, (gap, real_lo, real_hi, bound)
    assert not [p for p in aligned.problems if "not measured" in p["detail"]]

    wall = plan(records, mode="wall")
    assert wall.correction_for("host-a")(123) == 123
    off_hosts = {p["host"] for p in wall.problems if "--clock wall" in p["detail"]}
    assert {"host-a", "host-b", "host-b2", "host-c"} <= off_hosts
    _perfetto_alignment(tmp_path, spans, fix_c, fix_b)


def _spans(out: Path) -> dict[str, int]:
    """Start ns of the ``actor_update`` span in each host's real event log."""
    starts = {}
    for rec in _records(out):
        log = out / rec["event_log"]
        if log.exists():
            for line in log.read_text().splitlines():
                ev = json.loads(line)
                if ev.get("name") == "actor_update":
                    starts[rec["hostname"]] = ev["ts_ns"]
    return starts


def _perfetto_alignment(tmp: Path, spans: dict[str, int], fix_c: Any, fix_b: Any) -> None:
    """The corrected spans, written as Chrome JSON, sit in the real Perfetto engine exactly where the
    corrections put them (µs with 3 decimals: exact to the ns, ±1 ns each for the float parse)."""
    from rl_trace_observer.testing.perfetto import engine as perfetto_engine

    reason = perfetto_engine.unavailable_reason()
    if reason:
        pytest.skip(reason)
    base = min(spans.values()) - 1_000_000_000
    placed = {1: fix_c(spans["host-c"]) - base, 2: fix_b(spans["host-b2"]) - base}
    events = ",".join(
        f'{{"ph":"X","name":"actor_update","pid":{pid},"tid":1,"ts":{t // 1000}.{t % 1000:03d},"dur":20000}}'
        for pid, t in placed.items()
    )
    path = tmp / "aligned.json"
    path.write_text('{"traceEvents":[' + events + "]}")  # times as exact decimal text
    sql = (
        "select p.pid, s.ts from slice s join thread_track tt on s.track_id = tt.id "
        "join thread using(utid) join process p using(upid)"
    )
    res = perfetto_engine.shared_engine().load(path, [sql])
    assert res.ok, res.summary()
    rows = {r["pid"]: r["ts"] for r in res.query(sql).dicts()}
    assert set(rows) == {1, 2}
    assert abs((rows[1] - rows[2]) - (placed[1] - placed[2])) <= 2, (rows, placed)


def test_a_target_that_answers_after_its_turn_is_still_measured(ray_cluster: None, tmp_path: Path) -> None:
    """A background (sequential) measurement moves on from a target silent for its turn; the reply it
    sends later, within the budget, still counts (on a loaded host a Ray round trip takes tens of ms:
    dropping it left the host unmeasured). The slow target is held until the next one is asked, so it
    answers after its turn whatever the machine's speed."""
    from rl_trace_observer.integrations.ray.clock_measure import measure_offsets

    out = tmp_path / "trace"
    out.mkdir()
    release = tmp_path / "release"
    slow = ray.remote(num_cpus=0)(TracedProcess).remote(str(out), "host-slow", 7_000_000, 0.0)
    nxt = ray.remote(num_cpus=0)(ReleasingProcess).remote(str(out), "host-next", str(release))
    ray.get([slow.truth.remote(0), nxt.truth.remote(0)])
    held = slow.busy_until.remote(str(release), 60.0)  # the ping below queues behind it (same caller)
    res = measure_offsets([slow, nxt], rounds=2, budget_ms=HANG_MS, concurrent=False, record=False)
    ray.get(held)
    assert release.exists()  # the slow target was released by the next one's exchange, not by its limit
    by_host = {m["host"]: m for m in res.measurements}
    assert sorted(by_host) == ["host-next", "host-slow"] and res.unanswered == 0
    assert by_host["host-slow"]["rounds"] == 1 and by_host["host-next"]["rounds"] == 2  # asked once, then not
    _check_truth(res.measurements, {"host-slow": lambda t: 7_000_000, "host-next": lambda t: 0})


def test_wall_clock_jump_inside_a_profiled_step_is_reported(ray_cluster: None, tmp_path: Path) -> None:
    out = tmp_path / "trace"
    out.mkdir()
    proc = ray.remote(num_cpus=0)(TracedProcess).remote(str(out), "host-j", 2_000_000, 0.0)
    ray.get(proc.truth.remote(0))
    ref = Recorder(Config(output_dir=out), SYSTEM_CLOCK, host="ref-host")
    sync = rcs.ClockSync(ref, node_responders=False, budget_ms=HANG_MS)
    sync.add_target(proc)
    sync.measure(step=7, phase="begin")
    proc.jump.remote(-250_000_000)  # an NTP step back inside the profiled step
    sync.measure(step=7, phase="end")
    assert ray.get(proc.rl_trace_clock_flush.remote()) and ref.flush()
    # a loaded machine stretches one round trip past the default 1 ms bound, and the merge then
    # sets that measurement aside: the jump, not the bound, is what this test is about
    cp = plan(_records(out), mode="aligned", tolerance_us=5000)
    (jump,) = cp.manifest_section()["hosts"]["host-j"]["jumps"]
    assert jump["inside_profiled_window"]
    assert abs(jump["jump_ns"] + 250_000_000) <= _snapshot_error(out, "host-j", jump), jump
    assert any("jumped" in p["detail"] and "profiled window" in p["detail"] for p in cp.problems)
    # The correction does not draw a drift line across the jump: each side keeps its own offset.
    pts = cp.correction_for("host-j").points
    assert len(pts) == 2 and cp.correction_for("host-j").breaks == frozenset({0})


def test_on_step_boundary_with_node_responders(
    ray_cluster: None, tmp_path: Path, fresh_recorder: None
) -> None:
    from rl_trace_observer.capture import configure

    out = tmp_path / "trace"
    out.mkdir()
    rec = configure(Config(output_dir=out))
    assert rec is not None
    rcs.reset()
    try:
        assert rcs.prepare(timeout_s=60) == 1  # starts this node's responder and waits until it answers
        sync = rcs.clock_sync()
        assert sync is not None
        sync.budget_ms = sync.background_budget_ms = HANG_MS  # which boundaries are measured, not how fast
        res = rcs.on_step_boundary(1, "begin", wait=True)
        assert res is not None and res.measurements, "the node responder never answered"
        (m,) = res.measurements
        assert m["responder"] == "node" and m["host"] == rec.host
        assert abs(m["offset_ns"]) <= m["uncertainty_ns"]  # same host, same clock: zero within bound
        t0 = time.monotonic_ns()
        again = rcs.on_step_boundary(1, "end", wait=True)  # how fast: benchmarks/clock_handshake.py
        assert again is not None and 0 < again.took_ns <= time.monotonic_ns() - t0
        skipped_before = sync.skipped
        # The default: the caller only hands off; the background thread measures with more rounds.
        # Boundaries faster than a measurement: the newest waits, older queued ones are skipped.
        for step in (2, 3, 4):
            assert rcs.on_step_boundary(step, "begin") is None
            assert rcs.on_step_boundary(step, "end") is None
        assert rcs.clock_sync() is sync and rcs.flush(60)
        bg = sync.last_result
        assert bg is not None and bg is not res and len(bg.measurements) == 1
        assert bg.measurements[0]["phase"] == "end" and bg.measurements[0]["step"] == 4
        assert bg.measurements[0]["rounds"] >= 1
        # timing decides how many of the six boundaries were measured; each was measured or skipped
        (node,) = [r for r in _records(out) if r.get("role") == "clock_sync"]
        measured = [(o["step"], o["phase"]) for o in node["clock_offsets"] if o.get("step") in (2, 3, 4)]
        assert measured and measured[-1] == (4, "end") and len(set(measured)) == len(measured)
        assert len(measured) + sync.skipped - skipped_before == 6, (measured, sync.skipped, skipped_before)
        # Every boundary's snapshot was read on this thread and stored by the background one: none lost.
        stored = [(s["reason"], s.get("step")) for s in rec.record()["clock_snapshots"]]
        assert [x for x in stored if x[1] in (2, 3, 4)] == [
            (f"step_{p}", n) for n in (2, 3, 4) for p in ("begin", "end")
        ]
        mine = rec.record()
        assert [s["reason"] for s in mine["clock_snapshots"]].count("step_begin") >= 1
        assert mine["clock_offsets"][0]["method"] == "reference"
        name = f"rl_trace_clock_{ray.get_runtime_context().get_job_id()}_"
        assert any(a["name"].startswith(name) for a in ray.util.list_named_actors(all_namespaces=True))
    finally:
        rcs.reset()
    assert not [t for t in threading.enumerate() if t.name == "rl-trace-clock-sync"], "thread leaked"


def test_capture_start_periodic_and_end_of_training_measurements(ray_cluster: None, tmp_path: Path) -> None:
    """The measurements that bracket a run: capture start (waits for the targets in the background),
    a periodic one at unprofiled steps, the end of training (waits until stored). None of them
    marks a profiled window in the target's record."""
    out = tmp_path / "trace"
    out.mkdir()
    proc = ray.remote(num_cpus=0)(TracedProcess).remote(str(out), "host-p", 3_000_000, 20.0)
    ref = Recorder(Config(output_dir=out), SYSTEM_CLOCK, host="ref-host")
    sync = rcs.ClockSync(ref, node_responders=False, background_budget_ms=HANG_MS)
    sync.add_target(proc)
    assert not sync.used and sync.training_end() is False  # nothing measured: nothing to bracket
    assert not sync.finished
    assert sync.capture_start() and not sync.capture_start()  # once; the actor may still be starting
    assert sync.wait_idle(60)
    start = sync.last_result
    assert start is not None and [m["phase"] for m in start.measurements] == ["capture_start"]
    assert not sync.step_tick(5)  # the last measurement is not a minute old
    assert sync.step_tick(5, interval_s=0) and sync.wait_idle(60)
    assert sync.last_result is not None and sync.last_result.measurements[0]["step"] == 5
    assert sync.training_end(timeout_s=60) and sync.finished
    assert sync.training_end() and sync.last_result.measurements[0]["phase"] == "training_end"
    assert ray.get(proc.rl_trace_clock_flush.remote())
    sync.close()
    (rec,) = [r for r in _records(out) if r["hostname"] == "host-p"]
    phases = [(m["phase"], m["step"]) for m in rec["clock_offsets"]]
    assert phases == [("capture_start", None), ("periodic", 5), ("training_end", None)]
    assert not [s for s in rec["clock_snapshots"] if s["reason"].startswith("step_")]
    _check_truth(rec["clock_offsets"], {"host-p": lambda t: ray.get(proc.truth.remote(t))})


def test_skipped_quietly_without_ray(tmp_path: Path) -> None:
    code = f"""
        import sys
        from pathlib import Path
        from rl_trace_observer.integrations.ray import clock_sync
        from rl_trace_observer.capture import configure
        from rl_trace_observer.config import Config
        assert clock_sync.on_step_boundary(3, "begin") is None   # capture off: nothing at all
        clock_sync.on_capture_start(); clock_sync.on_step(3)
        assert clock_sync.on_training_end() is False
        rec = configure(Config(output_dir=Path({str(tmp_path)!r})))
        clock_sync.on_capture_start(); clock_sync.on_step(3)
        assert clock_sync.on_training_end() is False
        assert clock_sync.on_step_boundary(3, "begin") is None
        assert rec.record()["clock_snapshots"][-1]["reason"] == "step_begin"
        assert "ray" not in sys.modules, "the hook must not import Ray"
        print("ok")
    """
    proc = run_python(code, clean_env())
    assert "ok" in proc.stdout


def _snapshot_error(out: Path, host: str, jump: dict[str, Any]) -> int:
    """How far a jump seen between two snapshots can be off the real step: the time each snapshot's
    reading took (a preemption between its monotonic and wall reads) plus the real clock's slewing."""
    from rl_trace_observer.common.clock_offsets import DEFAULT_SLEW_PPM

    (rec,) = [r for r in _records(out) if r["hostname"] == host]
    lo, hi = jump["wall_range_ns"]
    (a,) = [s for s in rec["clock_snapshots"] if s["wall_ns"] == lo]
    (b,) = [s for s in rec["clock_snapshots"] if s["wall_ns"] == hi]
    slew = -(-DEFAULT_SLEW_PPM * abs(b["mono_ns"] - a["mono_ns"]) // 1_000_000)
    return int(a["read_ns"]) + int(b["read_ns"]) + int(slew)
