"""The stage spans of a shard load as columns (``SpanTable``) read as the list of spans they stand
for, filter per shape as the list filters span by span, and the stage index built from their
columns equals the one built span by span (rows, groupings, each lane's spans) — also where an end
does not fit int64 and the index takes the spans one by one."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ..conftest import requires

NAMES = ["actor_update", "generate_sequences", "update_weights", "compute_advantage", "step"]
ARGS: list[dict[str, Any]] = [
    {},
    {"state_lane_id": "rank_1"},
    {"state_lane_id": 10},
    {"rl.bucket": "wasted"},
    {"rl.bucket": 3},
    {"replica": 1},
]
rows = st.lists(
    st.tuples(
        st.sampled_from(NAMES),
        st.sampled_from(["rl_insight", "rl_trace.request", "other"]),
        st.integers(1, 3),  # pid
        st.integers(1, 2),  # tid
        st.integers(-50, 1000),
        st.integers(0, 100),
        st.sampled_from(range(len(ARGS))),
    ),
    max_size=60,
)


def _table(
    drawn: list[tuple[str, str, int, int, int, int, int]], huge: bool = False
) -> tuple[Any, list[Any]]:
    """A table as the shard loader makes it (one shape per distinct name, category, track and args)
    and the same spans as a list."""
    from rl_trace_observer.analysis.report.load import Span
    from rl_trace_observer.analysis.report.span_table import SpanTable

    table = SpanTable([])
    shapes: dict[tuple[Any, ...], int] = {}
    for name, cat, pid, tid, start, dur, a in drawn:
        key = (name, cat, pid, tid, a)
        if key not in shapes:
            shapes[key] = table.add_shape((name, cat, pid, tid, ARGS[a]))
        table.extend_columns([shapes[key]], [start], [dur])
    if huge:
        table.append(Span("actor_update", "rl_insight", 1, 1, 2**62, 2**62 + 5, {}))
    return table, list(table)


@requires("numpy")
@settings(max_examples=100, deadline=None)
@given(rows, st.sampled_from(["rl_insight", "rl_trace.request", "other"]))
def test_a_table_reads_and_filters_as_its_spans(drawn: list[Any], cat: str) -> None:
    from rl_trace_observer.analysis.report.load import Span
    from rl_trace_observer.analysis.report.span_table import select

    table, spans = _table(drawn)
    assert len(table) == len(spans) and table == spans
    assert [table[i] for i in range(len(spans))] == spans and table[1:4] == spans[1:4]
    if spans:
        assert table[-1] == spans[-1]
    keep = lambda s: s.cat == cat and "state_lane_id" not in s.args  # noqa: E731
    assert list(select(table, keep)) == [s for s in spans if keep(s)] == select(spans, keep)
    extra = [Span("engine_generate", "rl_trace.request", 9, 9, 5, 6, {"replica": 0})]
    assert list(table.plus(extra)) == [*spans, *extra] and list(table) == spans  # a new table


@requires("numpy")
@settings(max_examples=100, deadline=None)
@given(rows, st.booleans())
def test_the_stage_index_from_columns_equals_the_one_span_by_span(drawn: list[Any], huge: bool) -> None:
    from rl_trace_observer.analysis.report.load import TraceData
    from rl_trace_observer.analysis.report.stage_index import StageIndex, work_spans

    table, spans = _table(drawn, huge)
    data = TraceData(path="t", spans=table)
    data.thread_names = {(p, t): f"worker {t}" for p in range(1, 4) for t in range(1, 3)}
    data.process_names = {1: "actor · rank 0", 2: "rollout · replica 1", 3: "driver"}
    fast, slow = StageIndex(data, table), StageIndex(data, spans)
    assert fast.whos == slow.whos
    assert list(work_spans(fast)) == list(work_spans(slow))
    assert {w: list(fast.spans_of[w]) for w in fast.whos} == {w: list(slow.spans_of[w]) for w in slow.whos}

    def grouped(idx: StageIndex) -> tuple[Any, ...]:
        return (
            {(w, c): sorted(ints) for w, cats in idx.by_who_cat.items() for c, ints in cats.items()},
            {(k, lane): sorted(ints) for k, lanes in idx.by_who_name.items() for lane, ints in lanes.items()},
            {c: sorted(ints) for c, ints in idx.all_by_cat.items()},
        )

    assert grouped(fast) == grouped(slow)
