"""The pump's side of the pipe: frames written through a real non-blocking pipe that fills and
drains at random arrive whole and in order, and a pipe that stays full costs no write attempts."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trace_observer.capture import frames


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)  # one page: every test fills it many times
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    try:
        yield r, w
    finally:
        os.close(r)
        os.close(w)


def _read_some(r: int, n: int) -> bytes:
    try:
        return os.read(r, n)
    except BlockingIOError:
        return b""


# sizes drawn as numbers: st.binary stays small and would seldom fill the pipe mid-payload
PAYLOAD = st.builds(lambda n, c: bytes([c]) * n, st.integers(0, 6000), st.integers(0, 255))
FRAME = st.tuples(
    st.sampled_from(sorted(frames.KINDS)),
    st.integers(0, 2**31),
    PAYLOAD,
    st.integers(-(2**40), 2**40),
)


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(st.tuples(st.lists(FRAME, max_size=20), st.integers(0, 20000)), min_size=1, max_size=12),
)
def test_frames_through_a_filling_pipe_arrive_whole_and_in_order(
    steps: list[tuple[list[tuple[int, int, bytes, int]], int]],
) -> None:
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        out, box, parser = frames.PipeOut(w), frames.Outbox(), frames.Parser()
        got: list[frames.Frame] = []
        sent = []
        for batch, read_n in steps:  # add some frames, write what fits, the reader takes some
            for kind, sid, payload, a in batch:
                box.add(kind, sid, payload, a=a, b=len(payload))
                sent.append(frames.Frame(kind, sid, a, len(payload), 0, payload))
            out.write(box)
            got += parser.feed(_read_some(r, read_n))
        for _ in range(1000):  # then the reader catches up
            if not box:
                break
            got += parser.feed(_read_some(r, 1 << 16))
            out.write(box)
        assert not box, "everything was written once the reader caught up"
        got += parser.feed(_read_some(r, 1 << 20))
        assert got == sent
        assert parser.pending == 0
    finally:
        os.close(r)
        os.close(w)


def test_a_pipe_that_stays_full_is_polled_not_written(
    pipe: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    r, w = pipe
    out, box = frames.PipeOut(w), frames.Outbox()
    for i in range(2000):  # a backlog: far more chunks than one write vector takes
        box.add(frames.LINES, 1, b"x" * 100 + b"\n", a=i, b=1)
    calls = []
    real = os.writev
    monkeypatch.setattr(os, "writev", lambda fd, bufs: calls.append(len(bufs)) or real(fd, bufs))
    out.write(box)
    assert out.full and calls, "the first write fills the pipe"
    held, tries = len(box), len(calls)
    for _ in range(100):  # the drain is stopped: the pump's cycles go on
        out.write(box)
    assert len(calls) == tries, "no write attempt while the pipe has no room"
    assert len(box) == held
    assert os.read(r, 1 << 16)  # the drain reads again
    out.write(box)
    assert len(calls) > tries and len(box) < held, "room again: the next cycle writes"


def test_a_reader_that_went_away_is_reported_even_while_full() -> None:
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)
        os.set_blocking(w, False)
        out, box = frames.PipeOut(w), frames.Outbox()
        box.add(frames.LINES, 1, b"y" * 10000, a=1, b=1)
        out.write(box)
        assert out.full
        os.close(r)  # the drain exited while the pipe was full
        with pytest.raises(BrokenPipeError):
            out.write(box)
    finally:
        os.close(w)


@given(
    windows=st.lists(st.lists(st.integers(1, 10**8), min_size=1, max_size=3000), min_size=1, max_size=10),
    p=st.sampled_from([0.99, 0.999]),
)
def test_pooled_percentiles_equal_one_window_of_all_the_calls(windows: list[list[int]], p: float) -> None:
    """The freeze benchmark pools runs from their tails: the figure must be that of all the calls."""
    from rl_trace_observer.testing.capture_load import _stats, pooled_q

    pooled = pooled_q([_stats(w, 1.0) for w in windows], p)
    whole = _stats([x for w in windows for x in w], 1.0)
    if pooled is not None:  # None only where the tails kept are too short for that quantile
        key = {0.99: "p99_ms", 0.999: "p999_ms"}[p]
        assert pooled == whole[key]
    if p == 0.999 and len(windows) <= 10 and all(len(w) >= 100 for w in windows):
        assert pooled is not None
