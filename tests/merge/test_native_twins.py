"""The merger's compiled ``.pftrace`` encoder (Cython, ``setup.py``) writes exactly what Python writes.

``RL_TRACE_NATIVE=0`` runs the pure-Python loops; the default runs the twins where they are built.
Both merge the same inputs to the same bytes in every output format: the generated run (Kineto,
VizTracer, TokenSpeed VizTracer + Proton, RL-Insight), every set of real public traces, and random
thread contents fed straight to the ``.pftrace`` encoder. In CI every twin must be built (a missing
compiler or a Cython error would otherwise silently fall back to Python).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from msgspec import UNSET

from rl_trace_observer.common import twins
from rl_trace_observer.merge.options import MergeOptions
from rl_trace_observer.merge.output.pftrace_fused import FusedWriter
from rl_trace_observer.merge.pipeline import merge
from rl_trace_observer.merge.timeline.model import Event

from ..conftest import in_ci, real_trace_sets, real_traces_dir

ROOT = Path(__file__).resolve().parents[2]
REAL = real_traces_dir()
SETS = real_trace_sets()
FORMATS = ["json", "json.gz", "pftrace", "pftrace.gz"]


@contextmanager
def _native(on: bool) -> Iterator[None]:
    old = os.environ.get("RL_TRACE_NATIVE")
    os.environ["RL_TRACE_NATIVE"] = "1" if on else "0"
    twins.reset()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("RL_TRACE_NATIVE", None)
        else:
            os.environ["RL_TRACE_NATIVE"] = old
        twins.reset()


def _built() -> bool:
    with _native(True):
        return all(twins.twin(name) is not None for name in twins.TWINS)


pytestmark = pytest.mark.skipif(
    not _built() and not in_ci(),
    reason="compiled twins not built here (scripts/bootstrap.sh builds them; CI requires them)",
)


def test_every_twin_is_built_and_current() -> None:
    with _native(True):
        missing = [name for name in twins.TWINS if twins.twin(name) is None]
    assert not missing, f"not built or older than their source: {missing} (run scripts/bootstrap.sh)"
    with _native(False):
        assert not any(twins.active().values())


def test_a_twin_is_judged_by_the_hash_of_its_source_not_by_file_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A copy of the tree (new file times, same source) keeps the twins; an edited source drops one."""
    for rel in twins.TWINS.values():
        copy = tmp_path / rel
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes((twins.PACKAGE_ROOT / rel).read_bytes())  # newer than the built module
    monkeypatch.setattr(twins, "PACKAGE_ROOT", tmp_path)
    with _native(True):
        assert all(twins.twin(name) is not None for name in twins.TWINS)
    name, rel = next(iter(twins.TWINS.items()))
    with (tmp_path / rel).open("a") as f:
        f.write("\n# an edit the built twin does not have\n")
    with _native(True):
        assert twins.twin(name) is None
    assert "built from another version" in caplog.text


def test_setup_builds_exactly_the_listed_twins() -> None:
    """One list: setup.py reads common/twin_sources.py, so the two can never disagree."""
    text = (ROOT / "setup.py").read_text()
    assert "twin_sources.py" in text and '.pyx"' not in text  # no second list of sources


def _digests(inputs: list[Path], out: Path, on: bool) -> dict[str, str]:
    got = {}
    with _native(on):
        for fmt in FORMATS:
            path = out / f"{'native' if on else 'python'}.{fmt}"
            res = merge([str(p) for p in inputs], str(path), MergeOptions(workers=0))
            assert res.usable, res.manifest["problems"]
            got[fmt] = hashlib.sha256(path.read_bytes()).hexdigest()
    return got


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("gen") / "run"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gen_run.py"), str(run), "--events", "60000",
         "--ranks", "2", "--tp", "2", "--jobs", "1"],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return run


def test_generated_run_merges_to_the_same_bytes(generated: Path, tmp_path: Path) -> None:
    assert _digests([generated], tmp_path, True) == _digests([generated], tmp_path, False)


@pytest.mark.skipif(not SETS, reason=f"no real traces at {REAL}")
@pytest.mark.parametrize("name", SETS)
def test_real_traces_merge_to_the_same_bytes(name: str, tmp_path: Path) -> None:
    inputs = [REAL / name]
    assert _digests(inputs, tmp_path, True) == _digests(inputs, tmp_path, False)


# ---------------------------------------------------------------- the .pftrace thread encoder
_ARGS = [
    UNSET,
    msgspec.Raw(b'{"a": 1,\n "b": "x"}'),
    msgspec.Raw(b"{}"),
    msgspec.Raw(b'{"u": "\\u00e9"}'),
    msgspec.Raw(b"[1]"),
    msgspec.Raw(b'{"grid": [1, 2, 3], "f": 1.5}'),
]
# where a thread's clock starts: varint sizes change at 2**14, 2**28 and 2**42 ns; floats lose
# integers beyond 2**53 (the fast path hands over ints there)
_BASES = [0, 2**14 - 3, 2**28 - 40, 2**42 - 40, 2**53 + 2, 2**63 - 10**6]
_scalar = st.none() | st.booleans() | st.floats(allow_nan=False, allow_infinity=False)
# "u" after a backslash: a text whose escaped backslash is followed by a u holds b"\\u" too
_text = st.text(st.sampled_from(["a", "u", "é", "\ud800", '"', "\\", "\n", " "]), max_size=4)
_json = st.recursive(
    _scalar | st.integers(-(2**70), 2**70) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=6,
)  # fmt: skip


# source args as sources write them: pretty-printed or not, \u escapes or UTF-8, objects or not
def _raw(value: Any, indent: int | None, ascii_only: bool) -> msgspec.Raw:
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    if "\ud800" in text:  # a lone surrogate has no UTF-8: only its \u escape can say it
        text = json.dumps(value, indent=indent)
    return msgspec.Raw(text.encode())


_raw_args = st.builds(
    _raw,
    _json | st.dictionaries(_text, _json, max_size=4),
    st.sampled_from([None, 1]),
    st.booleans(),
)
_row = st.tuples(
    st.sampled_from([1, 2]),  # tid
    st.sampled_from([0, 1, 5, 100]),  # step from the previous start on that thread
    st.sampled_from([0, 1, 50, 300, 10**6]),  # dur
    st.sampled_from(["a", "b", "é", ""]),
    st.sampled_from([UNSET, "k", ""]),
    st.one_of(st.sampled_from(_ARGS), _raw_args),
    st.one_of(
        st.none(),
        st.tuples(st.sampled_from("sf"), st.sampled_from([0, 1]), st.sampled_from([1, 2, 3, 2**62, -1])),
    ),
    st.booleans(),  # the flow end binds to the enclosing slice (bp=e) or the next one
)


def _events(rows: list[tuple[Any, ...]], base: int, as_int: bool) -> list[Event]:
    clock = {1: base, 2: base}
    out = []
    for tid, step, dur, name, cat, args, flow, enclosing in rows:
        t = clock[tid] = clock[tid] + step
        ts: Any = t if as_int or t > 2**53 else float(t)
        d: Any = dur if as_int or t > 2**53 else float(dur)
        out.append(Event(ph="X", ts=ts, dur=d, pid=7, tid=tid, name=name, cat=cat, args=args))
        if flow is not None:
            ph, lag, ident = flow
            fts: Any = ts + lag
            bp: Any = "e" if enclosing else UNSET
            out.append(Event(ph=ph, ts=fts, pid=7, tid=tid, name="fl", cat="ac2g", id=ident, bp=bp))
    return out


def _encode(events: list[Event], on: bool, intern_limit: int) -> bytes:
    buf = io.BytesIO()
    with _native(on):
        w = FusedWriter(buf, base_ns=0, sequence_id=3, intern_limit=intern_limit)
        w.process(7, "p", 7)
        w.thread(7, 1, "t1", 0)
        w.thread(7, 2, "t2", 1)
        half = len(events) // 2  # two batches: a thread's open slices carry over between them
        w.write_events(events[:half], None, None)
        w.write_events(events[half:], None, None)
        w.close()
    return buf.getvalue()


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(_row, max_size=60),
    base=st.sampled_from(_BASES),
    as_int=st.booleans(),
    intern_limit=st.sampled_from([2, 200_000]),
)
def test_compiled_thread_encoder_writes_the_python_bytes(
    rows: list[tuple[Any, ...]], base: int, as_int: bool, intern_limit: int
) -> None:
    copy = msgspec.structs.replace
    python = _encode([copy(e) for e in _events(rows, base, as_int)], False, intern_limit)
    assert _encode([copy(e) for e in _events(rows, base, as_int)], True, intern_limit) == python


class _Tagged(Event):
    """A subclass with a field of its own: the twin reads Event's fields by slot only from Events."""

    tag: int = 0


@settings(max_examples=100, deadline=None)
@given(rows=st.lists(_row, max_size=40), base=st.sampled_from(_BASES))
def test_compiled_thread_encoder_reads_other_event_types_by_name(
    rows: list[tuple[Any, ...]], base: int
) -> None:
    def tagged() -> list[Event]:
        return [_Tagged(**msgspec.structs.asdict(e), tag=1) for e in _events(rows, base, False)]

    python = _encode([msgspec.structs.replace(e) for e in _events(rows, base, False)], False, 200_000)
    assert _encode(tagged(), True, 200_000) == python


_counter = st.tuples(
    st.integers(0, 2**40),  # ts
    st.sampled_from(["mem", "", "é"]),
    st.sampled_from([UNSET, 0, "x"]),  # id
    st.one_of(
        st.sampled_from([UNSET, msgspec.Raw(b'{"v": 1.5, "w": 2}'), msgspec.Raw(b'{"\\ud800": 1}')]),
        st.builds(
            lambda d: msgspec.Raw(json.dumps(d).encode()),
            st.dictionaries(st.sampled_from(["a", "b"]), _scalar | st.integers(-(2**70), 2**70)),
        ),
    ),
)


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(_counter, max_size=30), intern_limit=st.sampled_from([1, 200_000]))
def test_compiled_counter_encoder_writes_the_python_bytes(
    rows: list[tuple[Any, ...]], intern_limit: int
) -> None:
    def events() -> list[Event]:
        return [
            Event(ph="C", ts=float(ts), pid=7, tid=1, name=name, id=cid, args=args)
            for ts, name, cid, args in rows
        ]

    def encode(on: bool) -> bytes:
        buf = io.BytesIO()
        with _native(on):
            w = FusedWriter(buf, base_ns=0, sequence_id=3, intern_limit=intern_limit)
            w.process(7, "p", 7)
            w.write_events(events(), None, None)
            w.write_events([Event(ph="X", ts=5.0, dur=1.0, pid=7, tid=1, name="n")], None, None)
            w.write_events(events(), None, None)
            w.close()
        return buf.getvalue()

    assert encode(True) == encode(False)


# ------------------------------------------------------------------------- the fused per-event loop
_NEAR_TS = st.one_of(
    st.integers(0, 5_000_000),  # µs as ints, as Kineto writes them
    st.floats(0, 5_000_000, allow_nan=False).map(lambda f: round(f, 3)),  # µs with 3 decimals
)
_TS = st.one_of(
    _NEAR_TS,
    st.sampled_from([-(10**12), 93 * 86_400 * 10**6, 2**60, 1e300]),  # far, absurd: the exact route
)
_DUR = st.one_of(st.integers(0, 10_000), st.floats(0, 10_000, allow_nan=False))


def _fused_event(ts: st.SearchStrategy[Any], dur: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.fixed_dictionaries(
        {
            "ph": st.sampled_from(["X", "X", "X", "i", "s", "t", "f", "B", "E", "C", "M", "b", "e", "?"]),
            "name": st.sampled_from(["a", "b", "launch", "scope_link"]),
            "cat": st.sampled_from(["c", "flow", "ac2g"]),
            "pid": st.sampled_from([7, 8, "GPU 0"]),
            "tid": st.integers(1, 3),
            "ts": ts,
        },
        optional={
            "dur": dur,
            "id": st.integers(1, 4),
            "bp": st.just("e"),
            "s": st.sampled_from(["g", "t"]),
            "bind_id": st.integers(1, 3),
            "flow_out": st.just(True),
            "args": st.just({"k": 1}),
        },
    )


def _ev(ph: str, ts: Any, **fields: Any) -> dict[str, Any]:
    return {"ph": ph, "name": "launch", "cat": "ac2g", "pid": 7, "ts": ts, **fields}


def _fused_both(
    files: list[list[dict[str, Any]]], spans: list[tuple[int, int]]
) -> tuple[dict[Any, Any], int]:
    """Merge the files (Torch traces) and an RL-Insight log of ``spans`` with the twin and without, to
    every format; also how many µs files the twin handed to the Python loop."""
    from rl_trace_observer.merge.transform import fastpath

    base = 1_790_857_026_000_000_000
    handed = 0
    python_loop = fastpath.to_output

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal handed
        handed += not kwargs["source_ns"]
        return python_loop(*args, **kwargs)

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "in"
        folder.mkdir()
        for n, events in enumerate(files):
            doc = {"schemaVersion": 1, "deviceProperties": [], "baseTimeNanoseconds": base}
            (folder / f"t{n}.pt.trace.json").write_text(json.dumps({**doc, "traceEvents": events}))
        lines = [
            {"ph": "X", "name": "s", "pid": 3, "tid": 1, "ts": (base + t) / 1000, "dur": d / 1000,
             "ts_ns": base + t, "dur_ns": d}
            for t, d in spans
        ]  # fmt: skip
        (folder / "rl-insight-events-h-3.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        got = {}
        for on in (True, False):
            with _native(on):
                for fmt in FORMATS:
                    path = Path(tmp) / f"{on}.{fmt}"
                    fastpath.to_output = counted if on else python_loop
                    try:
                        res = merge([str(folder)], str(path), MergeOptions(workers=0))
                    finally:
                        fastpath.to_output = python_loop
                    got[on, fmt] = (
                        res.exit_code,
                        path.read_bytes() if path.exists() else None,
                        json.dumps(res.manifest["counts"], sort_keys=True),
                        json.dumps([a["events"] for a in res.manifest["artifacts"]], sort_keys=True),
                    )
    return got, handed


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    files=st.lists(
        st.lists(_fused_event(_TS, st.one_of(_DUR, st.just(2**55))), max_size=40), min_size=1, max_size=2
    ),
    spans=st.lists(st.tuples(st.integers(0, 10**12), st.integers(0, 10**9)), max_size=8),
)
def test_compiled_fused_loop_merges_to_the_python_bytes(
    files: list[list[dict[str, Any]]], spans: list[tuple[int, int]]
) -> None:
    """The fused loop's twin (``transform/_fastpath_native.pyx``) on random Chrome-trace events: both
    time routes (µs with 3 decimals, ints, far and absurd values: the twin hands those files to the
    Python loop), every phase, flows with reused ids, global instants, lanes in start order, exit order
    and neither, plus an ns source (RL-Insight spans): every output format byte for byte as the Python
    loop writes it."""
    got, _ = _fused_both(files, spans)
    for fmt in FORMATS:
        assert got[True, fmt] == got[False, fmt], fmt


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(files=[[{"ph": "X", "name": "a", "cat": "c", "pid": 7, "tid": 1, "ts": 5, "dur": 2},
                 {"ph": "X", "name": "b", "cat": "c", "pid": 7, "tid": 1, "ts": 4, "dur": 9},
                 {"ph": "X", "name": "a", "cat": "c", "pid": 7, "tid": 1, "ts": 6, "dur": 1}]])  # fmt: skip
# a flow with two ends (fanned out in a .pftrace); a flow start read before a slice at its very time
@example(files=[[_ev("X", 0, tid=1, dur=100), _ev("s", 10, tid=1, id=1), _ev("X", 0, tid=2, dur=100),
                 _ev("f", 20, tid=2, id=1, bp="e"), _ev("f", 30, tid=2, id=1, bp="e")]])  # fmt: skip
@example(files=[[_ev("s", 5, tid=1, id=1), _ev("X", 5, tid=1, dur=10), _ev("f", 7, tid=1, id=1, bp="e")]])
@given(files=st.lists(st.lists(_fused_event(_NEAR_TS, _DUR), max_size=60), min_size=1, max_size=2))
def test_compiled_fused_loop_takes_ordinary_files_itself(files: list[list[dict[str, Any]]]) -> None:
    """Times near the base, as every real trace has them: the twin's typed route takes each file
    itself (none handed to the Python loop), and writes the Python loop's bytes."""
    got, handed = _fused_both(files, [])
    assert handed == 0
    for fmt in FORMATS:
        assert got[True, fmt] == got[False, fmt], fmt


_time = st.one_of(
    st.integers(0, 50),
    st.integers(0, 50).map(float),
    st.sampled_from([2**53, 2**53 + 1, 2**60, float(2**60), -0.0, float("nan")]),
)


@settings(max_examples=300, deadline=None)
@example(slices=[(1, 0)], rest=[2**53 + 1], in_order=False)  # lone events: their times are checked too
@example(slices=[(1, 0), (float("nan"), 0)], rest=[0], in_order=False)
@given(
    slices=st.lists(st.tuples(_time, _time), max_size=30),
    rest=st.lists(_time, max_size=12),
    in_order=st.booleans(),
)
def test_compiled_thread_order_is_pythons(
    slices: list[tuple[Any, Any]], rest: list[Any], in_order: bool
) -> None:
    """Slices by start, the longer first, merged with the flow events (slices first at equal times):
    the C sort and merge give the Python sorts' list, ties, mixed ints and floats, big ints and NaN
    (Python's order) included."""
    from rl_trace_observer.merge.output import pftrace_fused

    def lists() -> tuple[list[Event], list[Event]]:
        return (
            [Event(ph="X", ts=ts, dur=d, name=str(i)) for i, (ts, d) in enumerate(slices)],
            [Event(ph="s", ts=ts, name=f"r{i}") for i, ts in enumerate(rest)],
        )

    def run(fn: Any) -> list[Any]:
        a, b = lists()
        seq = fn(a, b, in_order)
        return [e.name for e in seq] + ["|"] + [e.name for e in a]

    with _native(True):
        twin = twins.twin(pftrace_fused.NATIVE_TWIN)
    assert twin is not None
    assert run(twin.order_thread) == run(pftrace_fused.order_thread)


# ------------------------------------------------------------------- picking events from a whole file
class _NotAnEvent:
    """Any other object with the fields: asked by name."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


class _Text(str):
    """A string equal to a literal but not the literal object."""


_PICKED = st.builds(
    lambda ph, cat, ts, dur, args, ident, plain: (
        _NotAnEvent(ph=ph, cat=cat, ts=ts, dur=dur, args=args, id=ident)
        if plain
        else Event(ph=ph, cat=cat, ts=ts, dur=dur, args=args, id=ident)
    ),
    st.sampled_from(["X", "M", "s", "f", "", _Text("X")]),  # equal to "X", not the same object
    st.sampled_from([UNSET, "scope", "user_annotation", "", "x", _Text("scope")]),
    st.sampled_from([UNSET, 0, 1.5]),
    st.sampled_from([UNSET, 0, 2.5]),
    st.sampled_from([UNSET, msgspec.Raw(b"{}")]),
    st.sampled_from([UNSET, 3]),
    st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(
    events=st.lists(_PICKED, max_size=30),
    ph=st.sampled_from(["X", "M", "s"]),
    cats=st.sampled_from([None, ("scope",), {"user_annotation", "x"}, frozenset(), ("",)]),
    need=st.lists(st.sampled_from(sorted(["ts", "dur", "args", "id"])), max_size=4, unique=True).map(tuple),
)
def test_compiled_pick_picks_pythons_events(
    events: list[Any], ph: str, cats: Any, need: tuple[str, ...]
) -> None:
    """The scans over a whole file (metadata names, stage regions, kernel scopes, causality spans): the
    twin picks exactly the events, in the order, that the Python comprehension picks, ``Event`` or
    not."""
    from rl_trace_observer.merge.timeline import select

    with _native(True):
        twin = twins.twin(select.TWIN)
    assert twin is not None
    got = twin.pick(events, ph, cats, need)
    assert [id(e) for e in got] == [id(e) for e in select.pick_python(events, ph, cats, need)]
