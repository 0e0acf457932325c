"""The "weight sync growing" rule of a step's one-line answer (``answers_line.sync_growth``), over any
sequence of per-step sync times: said for a jump above the steps before or a climb of 3 rises, never
for syncs that stay within the noise floor, never from fewer than 2 earlier syncs, and from the
step's own figures whatever order the steps come in."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from rl_trace_observer.analysis.live.answers_line import (
    NOISE_FLOOR,
    NOISE_STEPS,
    SYNC_FLOOR_NS,
    one_line,
    sync_growth,
    sync_ns,
)

MS = 10**6
syncs_ns = st.integers(min_value=1, max_value=3600 * 10**9)


def record(step: int, *durs: int) -> dict[str, Any]:
    """A step record as the watch keeps it, with only what the rule reads (its syncs)."""
    syncs = [{"step": step, "dur_ns": d, "replicas": []} for d in durs]
    return {"step": step, "figures": {"rollout.weight_sync.syncs": syncs} if syncs else {}}


def run(durs: list[int]) -> list[dict[str, Any]]:
    return [record(i + 1, d) if d else record(i + 1) for i, d in enumerate(durs)]


def floor(ns: int) -> float:
    return max(NOISE_FLOOR * ns, SYNC_FLOOR_NS)


@given(base=syncs_ns, offsets=st.lists(st.floats(0, 1), min_size=1, max_size=12))
def test_syncs_within_the_noise_floor_never_grow(base: int, offsets: list[float]) -> None:
    steps = run([base + int(o * floor(base)) for o in offsets])
    assert all(sync_growth(steps, s) is None for s in steps)


@given(before=st.lists(syncs_ns, min_size=2, max_size=8), extra=st.integers(1, 10**9))
def test_a_jump_above_the_steps_before_is_said_with_its_figures(before: list[int], extra: int) -> None:
    top = max(before[-NOISE_STEPS:])
    now = top + int(floor(top)) + extra
    steps = run([*before, now])
    said = sync_growth(steps, steps[-1])
    assert said is not None and said.startswith("weight sync growing: ")
    assert f"{now / 1e9:.3f} s" in said and f"{top / 1e9:.3f} s" in said
    assert said in one_line(steps[-1], steps)


@given(start=syncs_ns, rises=st.lists(st.integers(1, 10**8), min_size=3, max_size=3), head=st.integers(0, 2))
def test_three_rises_in_a_row_beyond_the_floor_are_said(start: int, rises: list[int], head: int) -> None:
    durs = [start]
    for r in rises:
        durs.append(durs[-1] + r)
    if durs[-1] - durs[0] <= floor(durs[0]):
        durs[-1] = durs[0] + int(floor(durs[0])) + 1
    steps = run([start] * head + durs)
    assert sync_growth(steps, steps[-1]) is not None


@given(durs=st.lists(st.one_of(st.just(0), syncs_ns), min_size=1, max_size=10))
def test_no_longer_than_the_sync_before_is_never_growth(durs: list[int]) -> None:
    steps = run(durs)
    synced = [s for s in steps if sync_ns(s)]
    for prev, now in pairwise(synced):
        if sync_ns(now) <= sync_ns(prev):
            assert sync_growth(steps, now) is None
    if len(synced) >= 1:
        assert sync_growth(steps, synced[min(1, len(synced) - 1)]) is None  # fewer than 2 before it
    assert all(sync_growth(steps, s) is None for s in steps if not sync_ns(s))  # no sync: nothing said


@given(durs=st.lists(syncs_ns, min_size=1, max_size=10), data=st.data())
def test_the_answer_reads_only_the_steps_before_whatever_their_order(durs: list[int], data: Any) -> None:
    steps = run(durs)
    shuffled = data.draw(st.permutations(steps))
    later = [record(len(steps) + 1 + i, 10**15) for i in range(2)]  # huge later syncs: not read
    for s in steps:
        assert sync_growth([*shuffled, *later], s) == sync_growth(steps, s)


def test_a_step_that_syncs_twice_counts_both() -> None:
    steps = [record(1, 4 * MS), record(2, 4 * MS), record(3, 3 * MS, 3 * MS)]
    assert sync_ns(steps[2]) == 6 * MS
    assert sync_growth(steps, steps[2]) == (
        "weight sync growing: 0.006 s, longer than in the 2 steps before (at most 0.004 s)"
    )
    assert one_line(steps[2], steps) == sync_growth(steps, steps[2])  # no stage rows: the growth alone
    assert one_line(steps[2]) == "no stage spans in this step"  # without the steps before: unknown


def timed(step: int, dur_ns: int) -> dict[str, Any]:
    return {"step": step, "figures": {"steps": [{"step": step, "dur_ns": dur_ns}]}}


@given(
    st.lists(st.integers(50 * MS, 150 * MS), min_size=2, max_size=8),
    st.floats(-3.0, 3.0, allow_nan=False),
)
def test_the_alert_band_is_the_diffs_noise_model(before: list[int], k: float) -> None:
    """The band around the steps before is ``rl-trace diff``'s 2 standard errors of the difference with
    the new step's spread taken as theirs (2·s·√(1/n + 1)), never narrower than 5 % of their mean;
    a step inside it is never alerted, one outside it always is."""
    import statistics

    from rl_trace_observer.analysis.live.answers_line import alert
    from rl_trace_observer.analysis.query.diff import _row

    used = before[-NOISE_STEPS:]
    mean, sd, n = statistics.fmean(used), statistics.stdev(used), len(used)
    band = max(2 * sd * (1 / n + 1) ** 0.5, NOISE_FLOOR * mean)
    # diff's band between these steps and n more like them: the same rule, 2·√(s²/n + s²/n)
    row = _row("step", "ns", [float(d) for d in used], [float(d) for d in used])
    assert row is not None and abs(row["noise"] - 2 * sd * (2 / n) ** 0.5) < 1e-3
    dur = round(mean + k * band)
    if dur <= 0 or abs(abs(dur - mean) - band) < 2:  # on the edge: rounding decides
        return
    steps = [timed(i + 1, d) for i, d in enumerate(before)] + [timed(len(before) + 1, dur)]
    said = alert(steps, steps[-1])
    assert (said is not None) == (abs(dur - mean) > band), (said, dur, mean, band)
    if said:
        assert f"± {band / 1e9:.3f} s" in said
