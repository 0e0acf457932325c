"""The compiled Chrome JSON encoder (``merge/output/_chrome_json_native.pyx``) writes exactly msgspec's bytes.

It writes the common fields itself (plain ASCII text, 64-bit ints, the merge's ns/1000 times, ``Raw``
args, booleans) and hands every other event to msgspec whole; either way a piece must be the bytes of
:func:`rl_trace_observer.merge.output.chrome_json.encode_piece`. Whole merges in every format are
compared with the Python path in ``test_native_twins.py``; here random events reach the encoder
directly, hostile ones included (escapes, surrogates, NaN, -0.0, ints beyond 64 bits, empty ``Raw``).
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec import UNSET, Raw

from rl_trace_observer.common import twins
from rl_trace_observer.merge.output import chrome_json
from rl_trace_observer.merge.timeline.model import Event

from ..conftest import in_ci

_native: Any = twins.twin(chrome_json.NATIVE_TWIN)

pytestmark = pytest.mark.skipif(
    _native is None and not in_ci(),
    reason="compiled twins not built here (scripts/bootstrap.sh builds them; CI requires them)",
)

_EXACT = 1 << 47  # |ns| the encoder writes itself; the rest is msgspec's

text = st.one_of(
    st.sampled_from(["", "X", "aten::mm", "cpu_op", "ProfilerStep#3", 'a"b', "back\\slash", "tab\t", "\x7f"]),
    st.text(max_size=12),
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=20),
)
ints = st.one_of(
    st.integers(-1000, 1000),
    st.integers(-(1 << 63), (1 << 63) - 1),
    st.sampled_from([-(1 << 63), (1 << 63) - 1, 1 << 63, (1 << 64) - 1, -(1 << 64), 10**30]),
)
times = st.one_of(
    st.integers(-_EXACT + 1, _EXACT - 1).map(lambda ns: ns / 1000),  # what the merge writes
    st.integers(-(1 << 60), 1 << 60).map(lambda ns: ns / 1000),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e16, 5e-324, 0.0005, 140737488355.327, -140737488355.327]),
)
raws = st.one_of(
    st.sampled_from([b"{}", b'{"a": 1}', b'{"name": "x\\u00e9"}', b"[1, 2]", b"7", b""]),
    st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=4).map(
        msgspec.json.encode
    ),
).map(Raw)


def _field(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.just(UNSET), values)


events = st.builds(
    Event,
    ph=st.sampled_from(["X", "B", "E", "i", "s", "t", "f", "C", "M", ""]),
    name=_field(text),
    cat=_field(text),
    pid=_field(st.one_of(ints, text)),
    tid=_field(st.one_of(ints, text)),
    ts=_field(st.one_of(times, ints)),
    dur=_field(st.one_of(times, ints)),
    id=_field(st.one_of(ints, text)),
    id2=_field(raws),
    bind_id=_field(st.one_of(ints, text)),
    flow_in=_field(st.booleans()),
    flow_out=_field(st.booleans()),
    bp=_field(text),
    s=_field(text),
    scope=_field(text),
    cname=_field(text),
    args=_field(raws),
)


def _both(evs: list[Event]) -> tuple[Any, Any]:
    def run(fn: Any) -> Any:
        try:
            return bytes(fn())
        except Exception as exc:  # e.g. a lone surrogate: msgspec refuses it, on both paths alike
            return type(exc)

    native = run(lambda: _native.encode_piece(evs, chrome_json._ENCODER.encode))
    return native, run(lambda: chrome_json.encode_piece(evs))


@settings(max_examples=600, deadline=None)
@given(st.lists(events, max_size=8))
def test_random_events_encode_to_msgspecs_bytes(evs: list[Event]) -> None:
    native, python = _both(evs)
    assert native == python


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-_EXACT + 1, _EXACT - 1), min_size=1, max_size=50))
def test_every_merge_time_prints_as_msgspec_prints_it(ns: list[int]) -> None:
    """The encoder's own digits for ns / 1000 (trailing zeros dropped, ``.0`` kept) are msgspec's."""
    evs = [Event(ph="X", ts=n / 1000, dur=abs(n) / 1000) for n in ns]
    native, python = _both(evs)
    assert native == python


def test_the_common_event_is_written_here_and_odd_ones_by_msgspec() -> None:
    """The fast path is taken (no fallback call) for a Kineto-like event, and not for escapes."""
    calls: list[Event] = []

    def fallback(e: Event) -> bytes:
        calls.append(e)
        return chrome_json._ENCODER.encode(e)

    common = Event(
        ph="X", name="aten::mm", cat="cpu_op", pid=3, tid=7, ts=12.5, dur=0.001, args=Raw(b'{"a": 1}')
    )
    odd = [
        Event(ph="X", name="é"),
        Event(ph="X", ts=math.nan),
        Event(ph="X", pid=1 << 64),
        Event(args=Raw(b"")),
    ]
    out = _native.encode_piece([common, *odd], fallback)
    assert calls == odd
    assert bytes(out) == bytes(chrome_json.encode_piece([common, *odd]))
    assert bytes(_native.encode_piece([], fallback)) == bytes(chrome_json.encode_piece([])) == b" ,\n"


def test_a_piece_of_many_events_grows_its_buffer_and_stays_exact() -> None:
    args = Raw(b'{"' + b"k" * 5000 + b'": 1}')  # far more than the encoder's first guess per event
    evs = [Event(ph="X", name="n", ts=i / 1000, args=args) for i in range(3000)]
    assert bytes(_native.encode_piece(evs, chrome_json._ENCODER.encode)) == bytes(
        chrome_json.encode_piece(evs)
    )
