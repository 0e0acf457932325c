"""Inputs recorded far apart on one timeline (issue 29, item 1): a stale file in a run directory, or
traces of different months, put times more than 2**51 ns (~26 days) — or 2**53 ns (~104 days) — from
the merge's base. Every time path must stay exact: the merge in every format with span shards (it
failed with ArrowInvalid for .pftrace and lost ns in .json.gz's shards), and the .pftrace in Perfetto.

The inputs are Kineto-shaped traces whose every time is an odd number of ns, so a rounding through a
double shows; the expected times come from the files' own digits, read with ``Decimal``.
"""

from __future__ import annotations

import gzip
import json
import random
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trace_observer.merge.options import MergeOptions
from rl_trace_observer.merge.pipeline import merge
from rl_trace_observer.merge.timeline.model import FLOAT_US_EXACT_NS

from ..conftest import need

need("pyarrow")  # every test here writes or reads span shards

from rl_trace_observer.merge.shards.dataset import Shards  # noqa: E402

DAY = 86_400 * 10**9
T0 = 1_700_000_000 * 10**9 + 123_456_789  # odd ns: a double of µs far from the base drops them
EVENTS = 3000  # enough that a 1 % rounding error shows
FORMATS = ("pftrace", "pftrace.gz", "json.gz", "json")


def _kineto_at(path: Path, pid: int, times_ns: list[int]) -> None:
    """A Kineto-shaped trace (µs with 3 decimals after ``baseTimeNanoseconds``) of back-to-back ops."""
    base = times_ns[0] - times_ns[0] % DAY
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python"}}
    ]
    for ns in times_ns:
        us = ns - base
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": pid,
                       "ts": float(f"{us // 1000}.{us % 1000:03d}"), "dur": 0.501})  # fmt: skip
    doc = {"schemaVersion": 1, "baseTimeNanoseconds": base, "traceEvents": events}
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)


def _write(folder: Path, days: tuple[float, float]) -> Path:
    """One file at T0 and one whose ops lie anywhere ``days`` after it, at random ns: a rounding through
    a double misses a ns for ~1 % (26-80 days) to ~50 % (past 101.8 days) of such values."""
    folder.mkdir(parents=True)
    rng = random.Random(int(days[0]))
    lo, hi = int(days[0] * DAY), int(days[1] * DAY)
    for i, (a, b) in enumerate(((0, 4 * 10**9), (lo, hi))):
        times = sorted({T0 + rng.randrange(a, b) for _ in range(EVENTS)})
        times = [t for t, nxt in zip(times, [*times[1:], None], strict=True) if nxt is None or nxt - t > 1000]
        _kineto_at(folder / f"rank{i}.json.gz", 100 + i, times)
    return folder


def _source_times(folder: Path) -> set[tuple[str, int]]:
    """Every X event's (name, exact ns) from the files' text: base + µs digits × 1000."""
    out = set()
    for path in folder.glob("*.json.gz"):
        with gzip.open(path) as f:
            doc = json.loads(f.read(), parse_float=Decimal)
        base = int(doc["baseTimeNanoseconds"])
        out |= {
            (e["name"], base + int(Decimal(e["ts"]) * 1000)) for e in doc["traceEvents"] if e["ph"] == "X"
        }
    return out


def _shard_times(folder: Path) -> set[tuple[str, int]]:
    table = Shards.open(folder).table()
    columns = (table.column(c).to_pylist() for c in ("name", "ts_ns", "ph"))
    rows = zip(*columns, strict=True)
    return {(name, ts) for name, ts, ph in rows if ph == "X"}


@pytest.fixture(
    scope="module",
    params=[(1, 2), (26, 80), (80, 101.5), (102, 150), (300, 340)],
    ids=lambda d: f"{d[0]}-{d[1]}-days",
)
def merged(request: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("far")
    inputs = _write(base / "in", request.param)
    results = {
        fmt: merge([str(inputs)], str(base / f"out.{fmt}"), MergeOptions(shards=str(base / f"shards-{fmt}")))
        for fmt in FORMATS
    }
    return {"base": base, "inputs": inputs, "results": results, "days": request.param}


def test_every_format_merges_with_shards(merged: dict[str, Any]) -> None:
    for fmt, res in merged["results"].items():
        assert res.exit_code == 0 and res.written, (fmt, res.manifest["problems"])


def test_shard_times_are_the_sources_ns_in_every_format(merged: dict[str, Any]) -> None:
    want = _source_times(merged["inputs"])
    assert len(want) > 2 * EVENTS * 0.9
    for fmt in FORMATS:
        assert _shard_times(merged["base"] / f"shards-{fmt}") == want, fmt


@pytest.mark.perfetto
def test_the_pftrace_opens_with_the_exact_ns(merged: dict[str, Any], engine: Any) -> None:
    want = sorted(ts for _, ts in _source_times(merged["inputs"]))
    loaded = engine.load(merged["base"] / "out.pftrace", ["select ts from slice order by ts"])
    assert loaded.ok, loaded.summary()
    got = [row[0] for row in loaded.queries[0].rows]
    assert [t - got[0] for t in got] == [t - want[0] for t in want]  # Perfetto's trace time: a shift


@pytest.mark.perfetto
def test_the_json_opens_without_import_errors(merged: dict[str, Any], engine: Any) -> None:
    """Perfetto reads JSON µs as doubles: beyond 2**52 ns its ns may be one off, but nothing it would
    drop for overlapping is written (the nesting check uses the value Perfetto will read)."""
    loaded = engine.load(merged["base"] / "out.json.gz")
    assert loaded.ok, loaded.summary()


def test_a_failed_merge_leaves_no_half_shard_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rl_trace_observer.merge.shards import sink

    inputs = _write(tmp_path / "in", (1, 2))
    keep = tmp_path / "shards" / "mine.txt"
    keep.parent.mkdir()
    keep.write_text("not ours\n")
    calls = {"n": 0}
    original = sink.ShardSink._route

    def route_then_fail(self: Any, table: Any, host: str) -> None:
        original(self, table, host)
        calls["n"] += 1
        if calls["n"] == 2:  # the second file: the first one's parts are already in place
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(sink.ShardSink, "_route", route_then_fail)
    res = merge([str(inputs)], str(tmp_path / "o.pftrace"), MergeOptions(shards=str(keep.parent), workers=0))
    assert res.exit_code == 1 and calls["n"] == 2
    assert sorted(p.name for p in keep.parent.rglob("*")) == ["mine.txt"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-FLOAT_US_EXACT_NS + 1, FLOAT_US_EXACT_NS - 1), min_size=1, max_size=50))
def test_shard_rows_take_back_the_ns_of_any_output_us(ns: list[int]) -> None:
    """The span sink reads the JSON writer's µs (``ns / 1000``) back to the exact ns below the limit,
    and takes the fast path's exact ints beyond it (``far``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from rl_trace_observer.merge.shards.sink import _ns

    assert _ns(pa, pc, [y / 1000 for y in ns]).to_pylist() == ns
    far_out = [y * 7 + FLOAT_US_EXACT_NS * (1 if y >= 0 else -1) for y in ns]  # past the limit: ints
    mixed = [(y if i % 2 else y / 1000) for i, y in enumerate(ns)]
    mixed = [far_out[i] if i % 2 else v for i, v in enumerate(mixed)]
    want = [far_out[i] if i % 2 else y for i, y in enumerate(ns)]
    assert _ns(pa, pc, mixed, far={1: 1}).to_pylist() == want
