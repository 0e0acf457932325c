"""The span summaries a worker sends back for the clock's causality checks, as columns: the same
tuples back, through a pickle (they travel from worker processes and Ray nodes), with a time or id
beyond int64 too."""

from __future__ import annotations

import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trace_observer.merge.clock.probe import SpanSummaries

values = st.integers(-(2**63), 2**63 - 1) | st.integers(-(2**70), 2**70)
summaries = st.lists(
    st.tuples(st.sampled_from(["gen", "update", "", "ünï"]), values, values, values, values), max_size=30
)


@settings(max_examples=200, deadline=None)
@given(summaries)
def test_summaries_give_back_their_tuples(spans: list[tuple[str, int, int, int, int]]) -> None:
    got = SpanSummaries(spans)
    assert list(got) == spans and got == spans and len(got) == len(spans)
    assert list(pickle.loads(pickle.dumps(got))) == spans
    assert got.tracks() == {(s[3], s[4]) for s in spans}
    assert got.max_end() == (max(s[2] for s in spans) if spans else None)
    assert bool(got) is bool(spans)
