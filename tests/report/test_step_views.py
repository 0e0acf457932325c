"""Every step the report shows gets a view, and a span row's step is the step the report gives it
(issue 29, item 3). The run is written by the real capture layer: a trainer with one ``global_step``
marker per step but clock snapshots only at the profiled step 2 (as the VERL integration and the
demo record them), two actor ranks with stage spans in every step, and a rollout replica.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trace_observer.analysis.report.compute import step_windows
from rl_trace_observer.analysis.report.load import Span
from rl_trace_observer.analysis.report.stages import STAGE_TABLE, STEP, classify
from rl_trace_observer.capture import Recorder
from rl_trace_observer.config import Config
from rl_trace_observer.merge.timeline.steps import NAMED_MARKERS, STEP_MARKERS, marker, windows_from_markers

from ..cli_run import rl_trace
from ..conftest import need_all, requires
from ..corpus.recorded import SetClock, record_process

S, MS = 10**9, 10**6
T0 = 1_750_000_000 * S
STEPS = {1: (T0, T0 + 300 * MS), 2: (T0 + 300 * MS, T0 + 700 * MS), 3: (T0 + 700 * MS, T0 + 900 * MS)}


def _write_run(folder: Path) -> Path:
    folder.mkdir(parents=True)
    clock = SetClock()
    trainer = Recorder(
        Config(output_dir=folder.resolve(), run_id="run-1", role="trainer"), clock, host="h", pid=1
    )
    clock.now = STEPS[2][0]  # snapshots at the profiled step only
    trainer.clock_snapshot("step_begin", step=2)
    clock.now = STEPS[2][1]
    trainer.clock_snapshot("step_end", step=2)
    clock.now = None
    for step, (lo, hi) in STEPS.items():  # one marker per step, as the VERL integration writes them
        args = {"step": step, "profiled": step == 2}
        trainer.span("global_step", lo, hi, lane="global_step", cat="verl", args=args)
    trainer.close()
    for rank in (0, 1):
        spans = [
            (name, lo + off, lo + off + 50 * MS, f"rank_{rank}")
            for lo, _ in STEPS.values()
            for name, off in (("actor_compute_log_prob", 60 * MS), ("actor_update", 120 * MS + rank * MS))
        ]
        record_process(folder, host="h", pid=10 + rank, spans=spans, role="actor", rank=rank)
    gens = [("vllm_generate", lo + MS, lo + 55 * MS, "replica_0") for lo, _ in STEPS.values()]
    record_process(folder, host="h", pid=20, spans=gens, role="rollout")
    return folder


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    need_all("pyarrow", "duckdb")  # span shards, and rl-trace sql over them
    base = tmp_path_factory.mktemp("steps")
    folder = _write_run(base / "run")
    proc = rl_trace("merge", str(folder), "-o", str(base / "run.pftrace"), "--shards", str(base / "shards"))
    assert proc.returncode == 0, proc.stderr
    proc = rl_trace("report", str(base / "shards"), "-q", "--json", str(base / "report.json"))
    assert proc.returncode == 0, proc.stderr
    return {"base": base, "run": folder, "shards": base / "shards", "report": base / "report.json"}


def _sql(shards: Path, query: str) -> list[dict[str, Any]]:
    proc = rl_trace("sql", str(shards), query, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_every_row_has_the_step_the_report_gives_it(run: dict[str, Path]) -> None:
    report = json.loads(run["report"].read_text())
    assert [s["step"] for s in report["steps"]] == [1, 2, 3]
    rows = _sql(
        run["shards"],
        "SELECT s.step AS row_step, w.step AS report_step, count(*) AS n FROM spans s "
        "LEFT JOIN steps w ON s.ts_ns >= w.start_ns AND s.ts_ns < w.end_ns WHERE s.ph = 'X' GROUP BY ALL",
    )
    assert all(r["row_step"] == r["report_step"] for r in rows), rows
    assert {r["row_step"] for r in rows} == {1, 2, 3}


def test_every_step_of_the_report_gets_a_view(run: dict[str, Path]) -> None:
    out = run["base"] / "views"
    proc = rl_trace("merge", str(run["shards"]), "--split-steps", "-o", str(out / "v.json.gz"))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.glob("v.step*.json.gz")) == [f"v.step{s}.json.gz" for s in (1, 2, 3)]
    for step in (1, 3):
        view = run["base"] / f"s{step}.pftrace"
        proc = rl_trace("merge", str(run["shards"]), "--step", str(step), "-o", str(view))
        assert proc.returncode == 0, proc.stderr
        manifest = json.loads(Path(f"{view}.manifest.json").read_text())
        assert manifest["counts"]["events_kept"] >= 4  # a marker, two ranks' stages, a generation


def test_a_raw_run_selects_unprofiled_steps_too(run: dict[str, Path]) -> None:
    out = run["base"] / "raw-s1.json.gz"
    proc = rl_trace("merge", str(run["run"]), "--step", "1", "-o", str(out))
    assert proc.returncode == 0 and "no_step_window" not in proc.stderr, proc.stderr
    manifest = json.loads(Path(f"{out}.manifest.json").read_text())
    assert [(s["step"], s["start_ns"], s["end_ns"]) for s in manifest["sessions"]] == [
        (step, lo, hi) for step, (lo, hi) in STEPS.items()
    ]
    assert manifest["counts"]["events_kept"] >= 4


def test_the_stage_tables_step_rows_are_the_merges_markers() -> None:
    rows = [(r.pattern, r.why) for r in STAGE_TABLE if r.category == STEP]
    assert rows == list(STEP_MARKERS)
    assert [r.category for r in STAGE_TABLE[: len(rows)]] == [STEP] * len(rows)  # tried first


_markers = st.lists(
    st.tuples(
        st.sampled_from([*NAMED_MARKERS, "ProfilerStep#1", "ProfilerStep #2", "actor_update"]),
        st.integers(0, 10**6),
        st.integers(0, 10**5),
        st.dictionaries(st.sampled_from(["step", "global_step", "profiled", "mode"]), st.one_of(
            st.integers(0, 5), st.sampled_from(["1", "2.0", "x", True, "sync"])), max_size=3),
    ),
    max_size=12,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(_markers)
def test_the_report_and_the_merge_cut_steps_alike(rows: list[tuple[str, int, int, dict[str, Any]]]) -> None:
    spans = [Span(name, "verl", 1, 1, lo, dur, args) for name, lo, dur, args in rows]
    markers = [m for s in spans if (m := marker(s.name, s.start_ns, s.end_ns, s.args)) is not None]
    report = [
        (w.step, w.start_ns, w.end_ns, w.profiled, w.mode)
        for w in step_windows([s for s in spans if classify(s.name) == STEP])
    ]
    merge = [(w.step, w.start_ns, w.end_ns, w.profiled, w.mode) for w in windows_from_markers(markers)]
    assert report == merge


@requires("pyarrow")
def test_a_view_obeys_strict_when_the_run_it_shows_lost_something(tmp_path: Path) -> None:
    """``--strict`` on a view fails as it fails the merge: here the merge skipped a damaged file."""
    folder = _write_run(tmp_path / "run")
    (folder / "broken.pftrace").write_bytes(b"\x0a\xff\xff\xff")  # a protobuf cut in its first field
    shards = tmp_path / "shards"
    merged = rl_trace("merge", str(folder), "-o", str(tmp_path / "run.pftrace"), "--shards", str(shards))
    assert merged.returncode == 0, merged.stderr
    assert json.loads((tmp_path / "run.pftrace.manifest.json").read_text())["problems"]
    lenient = rl_trace("merge", str(shards), "-o", str(tmp_path / "view.pftrace"), "--step", "1")
    assert lenient.returncode == 0, lenient.stderr
    view = json.loads((tmp_path / "view.pftrace.manifest.json").read_text())
    assert view["status"] == "partial" and view["problems"][0]["kind"] == "source_problems"
    strict = rl_trace("merge", str(shards), "-o", str(tmp_path / "strict.pftrace"), "--step", "1", "--strict")
    assert strict.returncode == 1 and "--strict" in strict.stderr, strict.stderr
