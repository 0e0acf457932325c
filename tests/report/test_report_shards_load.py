"""The report's reading of span shards: spans in trace order however the parts come, and the
collector paused for the bulk of it (resumed as it was)."""

from __future__ import annotations

import gc
import threading
from collections import Counter, defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trace_observer.common.collector_pause import collector_paused

from ..conftest import requires


@requires("pyarrow")
@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, 3), st.integers(0, 50)), min_size=0, max_size=12),
        max_size=6,
    ),
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 50)), max_size=4),
    st.booleans(),
    st.booleans(),
)
def test_spans_come_out_in_trace_order_however_the_parts_come(
    parts: list[list[tuple[int, int]]], pairs: list[tuple[int, int]], sort_parts: bool, row_keys: bool
) -> None:
    """Parts in (job, ordinal) order (as the merge writes them) are kept as they come; a part out of
    order, or a B/E pair met at its end, makes the keeper sort — stably, as the old tuple sort. Each
    span keeps its own name, track, times and args whether a part's shapes are numbered by one
    int64 key or (``row_keys``: too many distinct values for one) by rows of indices."""
    from rl_trace_observer.analysis.report import shards

    room = shards._KEY_ROOM
    shards._KEY_ROOM = 1 if row_keys else room
    try:
        _check_trace_order(parts, pairs, sort_parts)
    finally:
        shards._KEY_ROOM = room


def _check_trace_order(
    parts: list[list[tuple[int, int]]], pairs: list[tuple[int, int]], sort_parts: bool
) -> None:
    import pyarrow as pa

    from rl_trace_observer.analysis.report.load import Span
    from rl_trace_observer.analysis.report.shards import _Kept

    kept, everything, n = _Kept(), [], 0
    for part in parts:
        rows = sorted(part) if sort_parts else part
        names = [f"s{n + i}" for i in range(len(rows))]
        n += len(rows)
        table = pa.table(
            {
                "name": pa.array(names, pa.string()),
                "category": pa.array(["c"] * len(rows), pa.string()),
                "trace_pid": pa.array([1] * len(rows), pa.int64()),
                "trace_tid": pa.array([2 + o % 3 for _, o in rows], pa.int64()),
                "ts_ns": pa.array([100 + o for _, o in rows], pa.int64()),
                "dur_ns": pa.array([None if o % 5 == 0 else o - 25 for _, o in rows], pa.int64()),
                "job": pa.array([j for j, _ in rows], pa.int64()),
                "ordinal": pa.array([o for _, o in rows], pa.int64()),
                "args": pa.array([None if o % 3 == 0 else f'{{"o":{o % 4}}}' for _, o in rows], pa.string()),
            }
        )
        kept.add_part(table, base=100)
        everything += [(j, o, name) for (j, o), name in zip(rows, names, strict=True)]
    for j, o in pairs:
        kept.add(j, o, Span(f"s{n}", "c", 1, 2, 0, 0))
        everything.append((j, o, f"s{n}"))
        n += 1
    got = kept.in_trace_order()
    assert [s.name for s in got] == [name for *_, name in sorted(everything, key=lambda e: e[:2])]
    by_name = {s.name: s for s in got}
    for _, o, name in everything[: len(everything) - len(pairs)]:  # the rows read from Arrow
        s = by_name[name]
        assert (s.start_ns, s.dur_ns, s.tid) == (o, 0 if o % 5 == 0 else max(o - 25, 0), 2 + o % 3)
        assert s.args == ({} if o % 3 == 0 else {"o": o % 4})


def test_the_collector_resumes_only_when_the_last_pause_ends_and_only_if_it_ran() -> None:
    assert gc.isenabled()
    started, release = threading.Event(), threading.Event()

    def other() -> None:
        with collector_paused():
            started.set()
            release.wait(10)

    try:
        with collector_paused():
            assert not gc.isenabled()
            worker = threading.Thread(target=other)
            worker.start()
            assert started.wait(10)
        assert not gc.isenabled()  # the other pause still runs
        release.set()
        worker.join(10)
        assert gc.isenabled()
        gc.disable()  # the program's own choice stays
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        release.set()
        gc.enable()


def test_a_failing_block_resumes_the_collector() -> None:
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


ARGS = [{}, {"state_lane_id": "rank_1"}, {"state_lane_id": 10}, {"rl.bucket": "wasted"}, {"rl.bucket": 3}]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["actor_update", "generate_sequences", "update_weights", "compute_advantage"]),
            st.sampled_from(["stage", "rl_trace.x", "other"]),
            st.integers(1, 2),  # pid
            st.integers(1, 2),  # tid
            st.integers(0, 1000),
            st.integers(0, 100),
            st.sampled_from(
                [{}, {"state_lane_id": "rank_1"}, {"state_lane_id": 10}, {"rl.bucket": "wasted"}]
            ),
        ),
        max_size=40,
    )
)
def test_the_stage_index_groups_rows_as_by_lane_would(
    rows: list[tuple[str, str, int, int, int, int, dict[str, object]]],
) -> None:
    """The index's rows per lane (handed to the answers instead of grouping them again) equal
    ``by_lane`` of its flat rows: same lanes, same order, same rows — and its per-context rows equal
    one worked out span by span."""
    from rl_trace_observer.analysis.answers.model import RL_BUCKETS, WorkSpan, by_lane
    from rl_trace_observer.analysis.report.identity import lane_of, process_role
    from rl_trace_observer.analysis.report.load import Span, TraceData
    from rl_trace_observer.analysis.report.stage_index import StageIndex, lanes_of, work_spans
    from rl_trace_observer.analysis.report.stages import classify

    spans = [Span(n, c, p, t, s, d, a) for n, c, p, t, s, d, a in rows]
    data = TraceData(path="t.json", spans=spans)
    data.thread_names = {(p, t): f"worker {t}" for _, _, p, t, *_ in rows}
    idx = StageIndex(data, spans)
    assert lanes_of(idx) == by_lane(list(work_spans(idx)))
    want = []
    for s in spans:
        role, lane = process_role(data, s.pid), lane_of(data, s)
        bucket = s.args.get("rl.bucket")
        bucket = bucket if bucket in RL_BUCKETS else None
        row = WorkSpan(role, lane, s.name, classify(s.name), s.start_ns, s.end_ns, s.pid, s.tid, bucket)
        want.append(row)
    assert Counter(work_spans(idx)) == Counter(want)
    # the groupings (intervals kept per context, listed by each grouping) hold every span's times
    by_cat: dict[tuple[str, str, str], list[tuple[int, int]]] = defaultdict(list)
    by_name: dict[tuple[str, str, str], list[tuple[int, int]]] = defaultdict(list)
    for row in want:
        by_cat[(row.role, row.lane, row.stage)].append((row.start_ns, row.end_ns))
        by_name[(row.role, row.name, row.lane)].append((row.start_ns, row.end_ns))
    got_cat = {
        (w.role, w.lane, c): sorted(ints) for w, cats in idx.by_who_cat.items() for c, ints in cats.items()
    }
    assert got_cat == {k: sorted(v) for k, v in by_cat.items()}
    got_name = {
        (r, n, lane): sorted(ints)
        for (r, n), lanes in idx.by_who_name.items()
        for lane, ints in lanes.items()
    }
    assert got_name == {k: sorted(v) for k, v in by_name.items()}
    assert sorted(i for ints in idx.all_by_cat.values() for i in ints) == sorted(
        i for v in by_cat.values() for i in v
    )
