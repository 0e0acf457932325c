"""``MergeOptions.skip_lines``: a reader is handed a line file less some runs of whole lines, and only
when every range is one — else the whole file (skipping saves time; it never changes an answer)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rl_trace_observer.merge.job.read import without_lines

lines_st = st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"") + b"\n"), max_size=20)


@given(lines_st, st.data())
def test_whole_line_runs_are_left_out_exactly(lines: list[bytes], data: st.DataObject) -> None:
    starts = [sum(len(x) for x in lines[:i]) for i in range(len(lines) + 1)]
    picked = sorted(data.draw(st.sets(st.integers(0, max(0, len(lines) - 1)))) if lines else set())
    runs, i = [], 0
    for k in picked:  # runs of one or two lines, apart from each other
        if k >= i:
            n = 2 if k + 1 < len(lines) and k + 1 not in picked else 1
            runs.append((starts[k], starts[k + n]))
            i = k + n + 1
    blob = b"".join(lines)
    left = [x for j, x in enumerate(lines) if not any(a <= starts[j] < b for a, b in runs)]
    assert without_lines(blob, tuple(runs)) == b"".join(left)


@given(lines_st, st.integers(0, 300), st.integers(1, 300))
def test_a_range_that_is_not_whole_lines_leaves_the_file_whole(lines: list[bytes], a: int, n: int) -> None:
    blob = b"".join(lines)
    out = without_lines(blob, ((a, a + n),))
    whole = a + n <= len(blob) and blob[a + n - 1 : a + n] == b"\n" and (a == 0 or blob[a - 1 : a] == b"\n")
    assert out == (blob[:a] + blob[a + n :] if whole else blob)
