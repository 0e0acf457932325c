"""The fused ``.pftrace`` encoder writes exactly the bytes of the dict writer it inlines.

:class:`FusedWriter.write_events` assembles a thread's BEGIN/END packets itself from the merge's
structs; :class:`PftraceWriter` (the reference, kept for rare events) is fed the same events as
normalised dicts, a thread at a time (in the order threads first appear), each in the merge's order,
with the same fan-out marks. Any difference in nesting, overlap drops, zero-length slices, flow
binding, interning or args would show up as different bytes; the equality to the JSON output in
the Perfetto engine is pinned by tests/merge/test_merge_perfetto.py and
tests/merge/test_real_traces.py (and here
for flows that tie across threads, where the two writers once disagreed).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from msgspec import UNSET

from rl_trace_observer.merge.output.pftrace import PftraceWriter
from rl_trace_observer.merge.output.pftrace_fused import FusedWriter, _order, event_dict, fan_ends
from rl_trace_observer.merge.timeline.model import Event
from rl_trace_observer.testing.perfetto import engine as pe

_ARGS = [UNSET, msgspec.Raw(b'{"a": 1,\n "b": "x"}'), msgspec.Raw(b"{}"), msgspec.Raw(b'{"u": "\\u00e9"}')]
# Args as sources write them, for the typed encoding (and its JSON fallback) to agree in both writers:
# ints beyond 64 bits, odd floats, nesting, empty containers, nulls, keys Perfetto would rewrite,
# strings with escapes and lone surrogates, pretty-printed or \u-escaped text, repeated values.
_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, 1, 2**63 - 1, -(2**63), 2**63, 2**64, 1.5, 1e300, -0.0, 1e-310, 0.1]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(st.sampled_from(["a", "é", "\ud800", '"', "\\", "\n", "☃", "\x00"]), max_size=4),
)
_key = st.sampled_from(["a", "b", "k", "x.y", "g[0]", "", "é", "\ud800"])
_json = st.recursive(
    _scalar, lambda c: st.lists(c, max_size=3) | st.dictionaries(_key, c, max_size=3), max_leaves=8
)


def _raw(value: Any, pretty: bool, ascii_only: bool) -> msgspec.Raw:
    text = json.dumps(value, indent=1 if pretty else None, ensure_ascii=ascii_only)
    if "\ud800" in text:  # a lone surrogate has no UTF-8: only its \u escape can say it
        text = json.dumps(value, indent=1 if pretty else None)
    return msgspec.Raw(text.encode())


_args = st.one_of(
    st.sampled_from(_ARGS),
    st.builds(_raw, st.dictionaries(_key, _json, max_size=4) | _json, st.booleans(), st.booleans()),
)
_slice = st.tuples(
    st.sampled_from([1, 2]),  # tid
    st.sampled_from([0, 1, 5, 100]),  # step from the previous start on that thread
    st.sampled_from([0, 1, 50, 300]),  # dur
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from([UNSET, "k"]),
    _args,
    st.one_of(st.none(), st.tuples(st.sampled_from("sf"), st.sampled_from([0, 1]), st.integers(1, 5))),
)


def _events(rows: list[tuple[Any, ...]]) -> list[Event]:
    clock = {1: 1000, 2: 1000}
    out = []
    for tid, step, dur, name, cat, args, flow in rows:
        t = clock[tid] = clock[tid] + step
        out.append(Event(ph="X", ts=float(t), dur=float(dur), pid=7, tid=tid, name=name, cat=cat, args=args))
        if flow is not None:
            ph, lag, ident = flow
            out.append(
                Event(ph=ph, ts=float(t + lag), pid=7, tid=tid, name="fl", cat="ac2g", id=ident, bp="e")
            )
    return out


def _write(events: list[Event], fused: bool) -> bytes:
    buf = io.BytesIO()
    w = (FusedWriter if fused else PftraceWriter)(buf, base_ns=0, sequence_id=3)
    w.process(7, "p", 7)
    w.thread(7, 1, "t1", 0)
    w.thread(7, 2, "t2", 1)
    if isinstance(w, FusedWriter):
        w.write_events(events, None, None)
    else:
        first: dict[Any, int] = {}  # threads are written in the order they first appear
        for e in events:
            first.setdefault(e.tid, len(first))
        ordered = sorted(events, key=lambda e: (first[e.tid], *_order(e)))
        fan = fan_ends(ordered, None)
        dicts = []
        for e in ordered:
            d = event_dict(e)
            mark = fan.get(id(e))
            if mark is not None:
                d[mark[0]] = mark[1]
            dicts.append(d)
        w.write_many(dicts)
    w.close()
    return buf.getvalue()


# Fan-out ids were paired in the merge's order across threads, the file's order is thread after thread:
# at one ns, tid 1's second end met tid 2's start first and lost its arrow (found by hypothesis).
_CROSS_THREAD_TIE = [
    *[(1, 0, 0, "a", UNSET, UNSET, None)] * 9,
    (1, 0, 0, "a", UNSET, UNSET, ("s", 0, 1)),
    (1, 0, 0, "a", UNSET, UNSET, ("f", 0, 1)),
    (2, 0, 0, "a", UNSET, UNSET, ("s", 0, 1)),
    (1, 0, 0, "a", UNSET, UNSET, ("f", 0, 1)),
]


@settings(max_examples=300, deadline=None)
@given(st.lists(_slice, max_size=60))
@example(_CROSS_THREAD_TIE)
@example(_CROSS_THREAD_TIE[-4:])
def test_fused_writer_bytes_equal_the_dict_writer(rows: list[tuple[Any, ...]]) -> None:
    copy = msgspec.structs.replace
    reference = _write([copy(e) for e in _events(rows)], fused=False)
    assert _write([copy(e) for e in _events(rows)], fused=True) == reference


@pytest.mark.perfetto
def test_cross_thread_tie_keeps_every_arrow_the_json_output_shows(engine: pe.Engine, tmp_path: Path) -> None:
    """Perfetto decides: the fused ``.pftrace`` of the tie shows the JSON output's arrows (its second
    start, a duplicate id, is ignored there: both ends link from the first start's thread)."""
    copy = msgspec.structs.replace
    events = _events(_CROSS_THREAD_TIE[-4:])
    pf = tmp_path / "tie.pftrace"
    pf.write_bytes(_write([copy(e) for e in events], fused=True))
    for e in events:  # the JSON writer's times: µs from the base (0 here)
        e.ts /= 1000  # type: ignore[operator]
        if e.dur is not UNSET:
            e.dur /= 1000
    js = tmp_path / "tie.json"
    js.write_bytes(msgspec.json.encode({"traceEvents": events}))
    sql = (
        "select ta.tid, tb.tid from flow f join slice so on so.id = f.slice_out "
        "join thread_track a on so.track_id = a.id join thread ta on ta.utid = a.utid "
        "join slice si on si.id = f.slice_in join thread_track b on si.track_id = b.id "
        "join thread tb on tb.utid = b.utid order by 1, 2"
    )
    got, ref = engine.load(pf, [sql]), engine.load(js, [sql])
    assert got.ok, got.summary()
    assert got.query(sql).rows == ref.query(sql).rows == ((1, 1), (1, 1))
