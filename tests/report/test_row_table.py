"""The answers' rows as columns (``RowTable``) and the report's groupings as columns
(``IntervalChunks``) give exactly what the lists of tuples they replace give: row for row, and
answer for answer through the numpy paths that read them (idle, arrivals, the critical path) —
with a time beyond int64 too, where they fall back to the Python path."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trace_observer.analysis.answers import StepWindow, WorkSpan, answer_sections
from rl_trace_observer.analysis.answers import interval_arrays as ia
from rl_trace_observer.analysis.answers.interval_chunks import IntervalChunks, Source
from rl_trace_observer.analysis.answers.model import RowTable, by_lane
from rl_trace_observer.analysis.answers.verl_metrics import _role_of_kind

from ..conftest import requires
from .test_answers import barrier_runs, runs

HUGE = 2**64  # beyond int64: the tables turn into lists


def tables(spans: list[WorkSpan]) -> tuple[RowTable, dict[tuple[str, str], RowTable]]:
    """What the report's stage index hands the answers: one table per lane over shared contexts,
    and their concatenation (lane after lane, each lane's rows in the spans' order)."""
    contexts: list[tuple] = []
    ids: dict[tuple, int] = {}
    lanes: dict[tuple[str, str], RowTable] = {}
    for lane in by_lane(spans):  # by_lane's lane order
        lanes[lane] = RowTable(contexts)
    for s in spans:
        key = (s.role, s.lane, s.name, s.stage, s.pid, s.tid, s.bucket)
        if key not in ids:
            ids[key] = len(contexts)
            contexts.append(key)
        lanes[(s.role, s.lane)].add(ids[key], s.start_ns, s.end_ns)
    return RowTable.concat(contexts, list(lanes.values()), lanes), lanes


def _with_buckets(spans: list[WorkSpan], bucket: str | None) -> list[WorkSpan]:
    return [s._replace(bucket=bucket, pid=i % 3, tid=i % 2) if i % 3 == 0 else s for i, s in enumerate(spans)]


@settings(max_examples=100, deadline=None)
@given(runs(), st.sampled_from([None, "productive", "idle", "wasted"]), st.booleans())
def test_a_table_reads_as_its_rows(
    run: tuple[list[WorkSpan], list[StepWindow]], bucket: str | None, huge: bool
) -> None:
    spans = _with_buckets(run[0], bucket)
    if huge and spans:
        spans[-1] = spans[-1]._replace(end_ns=HUGE)
    flat, lanes = tables(spans)
    rows = [s for lane in by_lane(spans).values() for s in lane]
    assert list(flat) == rows and flat == rows and len(flat) == len(rows)
    assert flat.columnar() is not (huge and bool(spans))
    assert [flat[i] for i in range(len(rows))] == rows
    if rows:
        assert flat[-1] == rows[-1] and flat[1:3] == rows[1:3]
    assert {lane: list(t) for lane, t in by_lane(flat).items()} == by_lane(rows)
    for lane, table in lanes.items():
        assert table.stages() == {s.stage for s in table}
        assert table.lanes_seen() == ({lane} if len(table) else set())


@requires("numpy")
@settings(max_examples=150, deadline=None)
@given(runs() | barrier_runs(), st.sampled_from([None, "productive", "overhead", "idle", "wasted"]))
def test_answers_from_a_table_equal_those_from_its_rows(
    run: tuple[list[WorkSpan], list[StepWindow]], bucket: str | None
) -> None:
    """Idle (the lanes' columns made from the arrays), arrivals (last ends per context) and the
    critical path (the walk over sorted arrays, its narrowings on the columns) against the rows."""
    spans, windows = run
    spans = _with_buckets(spans, bucket)
    flat, lanes = tables(spans)
    assert flat.columnar()
    rows = list(flat)
    assert answer_sections(flat, windows, lanes) == answer_sections(rows, windows)
    assert _role_of_kind(flat) == _role_of_kind(rows)


@settings(max_examples=60, deadline=None)
@given(runs())
def test_answers_with_a_time_beyond_int64_take_the_rows(run: tuple[list[WorkSpan], list[StepWindow]]) -> None:
    spans, windows = run
    if spans:
        spans = [*spans, spans[0]._replace(start_ns=HUGE - 5, end_ns=HUGE)]
    flat, lanes = tables(spans)
    assert answer_sections(flat, windows, lanes) == answer_sections(list(flat), windows)


intervals = st.lists(st.tuples(st.integers(-50, 3_000), st.integers(0, 400)), max_size=300)


@settings(max_examples=150, deadline=None)
@given(st.lists(intervals, max_size=5), st.integers(-100, 1_500), st.integers(0, 2_000), st.booleans())
def test_interval_chunks_measure_as_their_tuples(
    groups: list[list[tuple[int, int]]], lo: int, width: int, huge: bool
) -> None:
    """Sources shared by several lists, long enough for the numpy path (and a value beyond int64,
    which turns its source into lists: the Python path), against the same intervals as tuples."""
    sources = []
    for group in groups:
        src = Source()
        for start, dur in group:
            src.add(start, start + dur)
        sources.append(src)
    if huge and sources:
        sources[0].add(HUGE, HUGE + 1)
        assert not sources[0].columnar()
    chunks = IntervalChunks.join([IntervalChunks(sources), None, IntervalChunks(sources[:1])])
    tuples = [(s, e) for src in [*sources, *sources[:1]] for s, e in zip(src.starts, src.ends, strict=True)]
    assert sorted(chunks) == sorted(tuples) and len(chunks) == len(tuples)
    hi = lo + width
    assert ia.covered(chunks, lo, hi) == ia.covered(tuples, lo, hi)
    assert ia.clipped_union(chunks, lo, hi) == ia.clipped_union(tuples, lo, hi)
    assert ia.union_list(chunks) == ia.union_list(tuples)
