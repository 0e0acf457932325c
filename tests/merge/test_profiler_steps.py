"""Profiler-only runs get their steps from ``ProfilerStep#N`` everywhere, by ONE rule: the report
(issue 26), the span shards' ``step`` column and ``--step`` views of the raw run (issue 29, item 3).

The merge finds the markers while planning with a byte scan of each Torch trace
(``merge/formats/kineto/markers.py``); these tests hold that scan to what the format's full read
places, on real traces and on generated ones, and the rows to the report's windows.
"""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl_trace_observer.analysis.report.output import summarize
from rl_trace_observer.merge.files.sources import discover, read_content
from rl_trace_observer.merge.formats import ReadContext
from rl_trace_observer.merge.formats.kineto import Kineto
from rl_trace_observer.merge.formats.kineto.markers import read_markers
from rl_trace_observer.merge.plan.build import plan_sources
from rl_trace_observer.merge.timeline.steps import marker

from ..cli_run import rl_trace
from ..conftest import need
from ..corpus.recorded import record_process
from ..report.test_gpu import REAL

needs_real = pytest.mark.skipif(not REAL.is_dir(), reason=f"no real traces at {REAL}")
WITH_STEPS = ("dlrm-8rank", "hta-2rank", "kineto-cudagraph", "kineto-keys-after-events")


def _read_steps(path: Path) -> list[tuple[int, int, int, int]]:
    """(stated step, kind, start_ns, end_ns) of the CPU step markers the format's full read places."""
    src = discover([str(path)])[0]
    res = Kineto().read(read_content(src).data, ReadContext(src.url, src.name))
    if res.skip:
        return []
    out = []
    for e in res.events:
        if e.ph != "X" or e.cat != "user_annotation" or not isinstance(e.name, str):
            continue
        args = json.loads(bytes(e.args)) if isinstance(e.args, msgspec.Raw) else {}
        m = marker(e.name, int(e.ts), int(e.ts) + int(e.dur), args if isinstance(args, dict) else {})
        if m is not None:
            out.append((-1 if m.stated is None else m.stated, m.priority, m.start_ns, m.end_ns))
    return sorted(out)


def _scanned(path: Path) -> list[tuple[int, int, int, int]]:
    found = read_markers(discover([str(path)])[0])
    return sorted((-1 if m.stated is None else m.stated, m.priority, m.start_ns, m.end_ns) for m in found)


@needs_real
@pytest.mark.parametrize("name", WITH_STEPS)
def test_the_planning_scan_finds_what_the_read_places(name: str) -> None:
    files = sorted((REAL / name).iterdir())
    assert files
    for path in files:
        assert _scanned(path) == _read_steps(path), path
    assert any(_scanned(p) for p in files)


# a Kineto-shaped document: other events, ProfilerStep ranges (CPU, and GPU copies on the device
# clock), record_function ranges the rule also knows (any case, a step argument or none), keys in
# torch's order or another, braces and quotes inside strings, the anchor first, last or absent
# (absolute epoch µs, torch < 2.4)
_us = st.integers(0, 10**12).map(lambda n: Decimal(n) / 1000)
_event = st.tuples(
    st.sampled_from(["ProfilerStep#", "aten::mm", "ProfilerStep #", "gpu", "train_batch", "Global_Step"]),
    st.integers(0, 99),
    _us,
    _us,
    st.text(alphabet='ab{}"\\ ', max_size=6),
    st.booleans(),
)


def _document(events: list[tuple[Any, ...]], anchor: str) -> bytes:
    base_ns = 1_700_000_000_000_000_000
    offset = Decimal(1_700_000_000_000_000) if anchor == "absolute" else Decimal(0)
    parts = []
    for kind, n, ts, dur, text, name_last in events:
        name = f"{kind}{n}" if kind.startswith("ProfilerStep") else kind
        args: dict[str, Any] = {"note": text, "nested": {"x": text}}
        if kind == "Global_Step" and n % 2:
            args["step"] = n
        cat = "gpu_user_annotation" if kind == "gpu" else "user_annotation"
        if kind == "gpu":
            name = f"ProfilerStep#{n}"
        fields = [
            ('"ph"', '"X"'),
            ('"cat"', json.dumps(cat)),
            ('"pid"', "1"),
            ('"tid"', "1"),
            ('"ts"', str(ts + offset)),
            ('"dur"', str(dur)),
            ('"args"', json.dumps(args)),
        ]
        fields.insert(len(fields) if name_last else 2, ('"name"', json.dumps(name)))
        parts.append("{" + ", ".join(f"{k}: {v}" for k, v in fields) + "}")
    body = '"schemaVersion": 1, "traceEvents": [' + ",\n".join(parts) + "]"
    if anchor == "first":
        body = f'"baseTimeNanoseconds": {base_ns}, ' + body
    elif anchor == "last":
        body += f', "baseTimeNanoseconds": {base_ns}'
    return ("{" + body + "}").encode()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_event, max_size=12), st.sampled_from(["first", "last", "absolute", "none"]))
def test_the_scan_equals_the_read_on_generated_traces(
    tmp_path: Path, events: list[tuple[Any, ...]], anchor: str
) -> None:
    path = tmp_path / f"t-{anchor}.json.gz"
    path.write_bytes(gzip.compress(_document(events, anchor)))
    assert _scanned(path) == _read_steps(path)


# ------------------------------------------------------------------------------ one rule, end to end
@pytest.fixture(scope="module")
def hta(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    need("pyarrow")
    base = tmp_path_factory.mktemp("hta")
    raw = REAL / "hta-2rank"
    out, shards = base / "m.json.gz", base / "shards"
    proc = rl_trace("merge", str(raw), "-o", str(out), "--shards", str(shards))
    assert proc.returncode == 0, proc.stderr
    return {"base": base, "raw": raw, "out": out, "shards": shards}


@needs_real
def test_the_plan_rows_and_report_share_the_profiler_steps(hta: dict[str, Path]) -> None:
    need("duckdb")
    from rl_trace_observer.analysis.query.sql import open_run

    report = summarize(hta["out"])
    windows = [(s["step"], s["start_ns"], s["end_ns"]) for s in report["steps"]]
    assert [w[0] for w in windows] == [551, 552]
    plan = plan_sources(discover([str(hta["raw"])]))
    with open_run(hta["shards"]) as db:
        base = db.execute("SELECT base_ns FROM trace").fetchone()[0]
        rows = db.execute("SELECT ts_ns, step FROM spans WHERE ph = 'X'").fetchall()
    assert {s: (lo - base, hi - base) for s, (lo, hi) in plan.step_windows.items()} == {
        s: (lo, hi) for s, lo, hi in windows
    }
    first = {}  # a row's step: the earliest report window it starts in (the windows overlap here)
    for ts, step in rows:
        first[(ts, step)] = next((s for s, lo, hi in windows if lo <= ts - base < hi), None)
    assert all(step == want for (_, step), want in first.items())
    assert {step for _, step in rows} - {None} == {551, 552}


@needs_real
def test_a_profiler_only_run_has_a_view_per_step(hta: dict[str, Path]) -> None:
    view = hta["base"] / "raw-552.json.gz"
    proc = rl_trace("merge", str(hta["raw"]), "--step", "552", "-o", str(view))
    assert proc.returncode == 0 and "no_step_window" not in proc.stderr, proc.stderr
    manifest = json.loads(Path(f"{view}.manifest.json").read_text())
    assert [s["step"] for s in manifest["sessions"]] == [551, 552]  # the run's windows, 552 selected
    assert manifest["counts"]["events_kept"] > 0 and manifest["counts"]["events_filtered"] > 0
    split = hta["base"] / "split"
    proc = rl_trace("merge", str(hta["shards"]), "--split-steps", "-o", str(split / "v.json.gz"))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in split.glob("v.step*.json.gz")) == ["v.step551.json.gz", "v.step552.json.gz"]


@needs_real
def test_a_run_with_rl_insight_logs_takes_no_profiler_steps(tmp_path: Path) -> None:
    """The report reads RL-Insight's spans whenever a trace has any, so the plan does too: a log
    without step markers beside profiler traces gives no ProfilerStep windows to either."""
    run = tmp_path / "run"
    run.mkdir()
    for src in (REAL / "hta-2rank").iterdir():
        (run / src.name).write_bytes(src.read_bytes())
    t0 = 1682725898_100_000_000
    record_process(run, host="h", pid=7, spans=[("actor_update", t0, t0 + 10**8, "rank_0")])
    plan = plan_sources(discover([str(run)]))
    assert plan.step_windows == {}
    out = tmp_path / "m.json.gz"
    proc = rl_trace("merge", str(run), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    report = summarize(out)
    assert report["source"]["stage_source"] == "rl_insight"
    assert [s["step"] for s in report["steps"]] == [None]  # one window, as the plan: no marker


def test_a_train_batch_annotation_wins_in_the_plan_as_in_the_report(tmp_path: Path) -> None:
    """A profiler-only trace with ``record_function("train_batch")`` ranges besides ``ProfilerStep#N``:
    the rule prefers ``train_batch``, in the report (names read as stages) and in the plan alike."""
    ms = Decimal(1000)
    events = [
        ("ProfilerStep#", 7, 0 * ms, 100 * ms, "", False),
        ("ProfilerStep#", 8, 100 * ms, 100 * ms, "", False),
        ("train_batch", 0, 10 * ms, 50 * ms, "", True),
        ("train_batch", 0, 110 * ms, 50 * ms, "", False),
        ("aten::mm", 0, 20 * ms, 5 * ms, "", False),
    ]
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank0.pt.trace.json.gz").write_bytes(gzip.compress(_document(events, "first")))
    plan = plan_sources(discover([str(run)]))
    out = tmp_path / "m.json.gz"
    proc = rl_trace("merge", str(run), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    report = summarize(out)
    base = json.loads(gzip.decompress(out.read_bytes()))["rl_trace_observer"]["base_ns"]
    windows = {s["step"]: (s["start_ns"] + base, s["end_ns"] + base) for s in report["steps"]}
    assert report["source"]["steps_from"] == "train_batch" and sorted(windows) == [1, 2]
    assert plan.step_windows == windows
