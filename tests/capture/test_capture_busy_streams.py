"""Busy streams written by the thread that fills them (``Stream.append`` → ``Channel.send_inline``)
and the pump lent the GIL (``Channel._lend``): nothing lost, repeated or reordered, with real drains,
threads, a drain killed mid-burst and SIGPIPE at its default."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trace_observer.capture import pump, streams
from rl_trace_observer.capture.pump import INLINE_LINES
from rl_trace_observer.capture.streams import OFFER_LINES, Stream

from ..capture_helpers import traced
from ..trace_files import event_logs, process_records, spans


# ------------------------------------------------------------------ the stream's decisions, alone
class _Channel:
    """Speaks what a Stream calls on its channel; ``send_inline`` takes the batch when allowed."""

    def __init__(self) -> None:
        self.notified = 0
        self.offered: list[int] = []  # the deque's length at each offer
        self.allow = True
        self.taken: list[bytes] = []
        self.now = 0.0

    def add(self, stream: Stream) -> int:
        return 1

    def notify(self) -> None:
        self.notified += 1

    def send_inline(self, s: Stream) -> None:
        self.offered.append(len(s.buf))
        if self.allow:
            data, _ = s.take()
            self.taken.append(data)
            s.inline_until = self.now + pump.IDLE_S


STEP = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 3 * OFFER_LINES)),
    st.tuples(st.just("pump"), st.just(0)),  # the pump's cycle takes what waits
    st.tuples(st.just("clock"), st.sampled_from([0.0, 0.01, 0.05, 0.2])),
    st.tuples(st.just("allow"), st.integers(0, 1)),  # send_inline declines (lock held, backlog)
)


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(STEP, min_size=1, max_size=30))
def test_every_line_is_taken_once_in_order_whoever_takes_it(steps: list[tuple[str, Any]]) -> None:
    ch = _Channel()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(streams, "_monotonic", lambda: ch.now)
        _run_steps(ch, steps)


def _run_steps(ch: _Channel, steps: list[tuple[str, Any]]) -> None:
    s = Stream(ch, Path("/nonexistent/events.jsonl"))  # type: ignore[arg-type]
    sent = 0
    for kind, arg in steps:
        if kind == "append":
            for _ in range(arg):
                n = len(s.buf) + 1
                wakes = n == 1 and s.inline_until < ch.now
                notified, offered = ch.notified, len(ch.offered)
                s.append(b"%d\n" % sent)
                sent += 1
                # a new batch wakes the pump unless this stream wrote one itself within IDLE_S
                assert ch.notified - notified == (1 if wakes else 0)
                # every OFFER_LINES-th waiting line offers the batch, and only then
                assert len(ch.offered) - offered == (1 if n > 1 and n % OFFER_LINES == 0 else 0)
        elif kind == "pump":
            data, _ = s.take()
            ch.taken.append(data)
        elif kind == "clock":
            ch.now += arg
        else:
            ch.allow = bool(arg)
    data, _ = s.take()
    ch.taken.append(data)
    assert b"".join(ch.taken) == b"".join(b"%d\n" % i for i in range(sent))
    assert s.emitted == sent


def test_a_stream_closed_just_after_a_busy_burst_reopens_on_its_next_line() -> None:
    ch = _Channel()
    s = Stream(ch, Path("/nonexistent/events.jsonl"))  # type: ignore[arg-type]
    s.inline_until = time.monotonic() + 60  # it wrote a batch itself a moment ago
    reopened: list[bool] = []
    s.closed_by_pump()
    s._notify = lambda: reopened.append(True)  # what _reopen would do: re-add, then wake the pump
    s.append(b"1\n")
    assert reopened == [True]


# ------------------------------------------------------------------ lending the pump the GIL
def test_lend_waits_for_a_pump_that_wants_the_gil_until_its_cycle_is_done(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pump, "LEND_S", 30.0)  # so that only the cycle's end can release it
    ch = pump.Channel(1 << 20, 1.0)
    ch._due = time.monotonic() - 1  # its wait is over
    done: list[float] = []

    def cycle() -> None:
        time.sleep(0.05)
        done.append(time.monotonic())
        ch._cycled.set()

    threading.Thread(target=cycle).start()
    ch._lend()
    assert done and time.monotonic() >= done[0]


def test_lend_never_waits_for_a_pump_still_waiting_or_already_done(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pump, "LEND_S", 30.0)
    ch = pump.Channel(1 << 20, 1.0)
    for due, cycled in ((time.monotonic() + 60, False), (time.monotonic() - 1, True), (pump.NEVER, False)):
        ch._due = due
        if cycled:
            ch._cycled.set()
        else:
            ch._cycled.clear()
        t0 = time.monotonic()
        ch._lend()
        assert time.monotonic() - t0 < 10


def test_lend_gives_up_after_lend_s_and_after_lend_max_s_per_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pump, "LEND_S", 0.2)
    monkeypatch.setattr(pump, "LEND_MAX_S", 0.5)
    ch = pump.Channel(1 << 20, 1.0)
    ch._due = time.monotonic() - 1  # a pump that never gets to its cycle (stuck, or gone)
    waits = []
    for _ in range(5):
        t0 = time.monotonic()
        ch._lend()
        waits.append(time.monotonic() - t0)
    assert all(w >= 0.15 for w in waits[:3])  # 3 x 0.2 s reach LEND_MAX_S
    assert all(w < 0.15 for w in waits[3:]) and ch._due == pump.NEVER


# ------------------------------------------------------------------ real processes and drains
def test_threads_writing_their_own_batches_lose_repeat_and_reorder_nothing(out_dir: Path) -> None:
    code = """
        import threading
        from rl_trace_observer.capture import get_recorder
        import time
        rec = get_recorder()
        N = 3000
        for k in range(4):  # the lanes first: a batch with a lane's name line in it goes by the pump
            rec.span("s", -1, 0, lane=f"rank_{k}")
        assert rec.flush(10)
        def work(k):
            for i in range(N):
                rec.span("s", i, i + 1, lane=f"rank_{k}")
        stop = threading.Event()
        def syncer():  # sync tokens interleaved with batches written by their own threads
            while not stop.is_set():
                rec.flush(10)
                time.sleep(0.002)
        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        s = threading.Thread(target=syncer)
        s.start()
        for t in threads: t.start()
        for t in threads: t.join()
        stop.set(); s.join()
        assert rec.flush(10)
        print(rec.events.inline_until > 0, rec.events.written, rec.events.dropped)
    """
    proc = traced(code, out_dir)
    inline, written, dropped = proc.stdout.split()
    assert inline == "True"  # the busy stream was written by its threads, not only by the pump
    (events,) = event_logs(out_dir).values()
    by_lane: dict[int, list[int]] = {}
    for e in spans(events):
        by_lane.setdefault(e["tid"], []).append(e["ts_ns"])
    assert sorted(len(v) for v in by_lane.values()) == [3001] * 4
    assert all(v == list(range(-1, 3000)) for v in by_lane.values())  # each thread's order, once each
    assert int(dropped) == 0 and int(written) == len(events)
    (record,) = process_records(out_dir).values()
    assert record["events"] == {"written": int(written), "dropped": 0}


def test_the_tail_of_a_burst_reaches_the_file_without_a_flush(out_dir: Path) -> None:
    code = f"""
        import time
        from pathlib import Path
        from rl_trace_observer.capture import get_recorder
        rec = get_recorder()
        rec.span("s", -1, 0)
        assert rec.flush(10)  # the drain and the lane are known: a batch can go from this thread
        for i in range({3 * INLINE_LINES + 5}):
            rec.span("s", i, i + 1)
        assert rec.events.inline_until > 0
        path = Path(rec.events.path)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # the pump's periodic cycle, not a flush or the exit
            if path.exists() and path.read_bytes().count(b'"ph":"X"') == {3 * INLINE_LINES + 6}:
                print("all")
                break
            time.sleep(0.01)
        import os; os._exit(0)  # no exit hook: what is on disk came during the run
    """
    assert traced(code, out_dir).stdout.split() == ["all"]


def test_with_sigpipe_at_its_default_only_the_pump_writes(out_dir: Path) -> None:
    code = """
        import signal
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # a write to a dead drain would kill us
        from rl_trace_observer.capture import get_recorder
        rec = get_recorder()
        rec.span("s", -1, 0)
        assert rec.flush(10)  # as the tail test: the drain and the lane are known
        for i in range(2000):
            rec.span("s", i, i + 1)
        assert rec.flush(10)
        print(rec.events.inline_until, rec.events.written)
    """
    inline_until, written = traced(code, out_dir).stdout.split()
    assert float(inline_until) == 0.0 and int(written) == 2002
    (events,) = event_logs(out_dir).values()
    assert [e["ts_ns"] for e in spans(events)] == list(range(-1, 2000))


def test_a_drain_killed_while_a_thread_writes_its_own_batches(out_dir: Path) -> None:
    code = """
        import logging, os, signal, sys, time
        logging.basicConfig(stream=sys.stderr)
        from rl_trace_observer.capture import get_recorder
        rec = get_recorder()
        rec.span("s", -1, 0)
        assert rec.flush(10)
        first = rec.events._channel.drain_pid
        for i in range(20000):
            rec.span("s", i, i + 1)
            if i == 5000:
                os.kill(first, signal.SIGKILL)
            if i % 1000 == 0:
                time.sleep(0.01)
        assert rec.flush(10)
        print(first, rec.events._channel.drain_pid, rec.events.written, rec.events.dropped)
        print(rec.events.inline_until > 0)
    """
    proc = traced(code, out_dir)
    counts, inline = proc.stdout.splitlines()
    assert inline == "True"  # the burst around the kill went by this thread's own writes
    first, second, written, dropped = map(int, counts.split())
    assert first != second
    (events,) = event_logs(out_dir).values()
    got = [e["ts_ns"] for e in spans(events)]
    assert got == sorted(got) and len(set(got)) == len(got)  # nothing repeated or reordered
    assert got[:5000] == list(range(-1, 4999)) or dropped > 0
    assert written == len(events) and written + dropped == 20002
    warnings = [line for line in proc.stderr.splitlines() if "drain process" in line]
    assert len(warnings) == 1 and "exited" in warnings[0]
