"""NeMo-RL's Perfetto workload tracer output (docs/FORMATS.md, "NeMo-RL Perfetto tracer").

The tracer (NVIDIA-NeMo/RL PRs #3879 / #3887) is in review, in no release: it cannot run here, so
tests/corpus/nemo_rl_perfetto.py writes what its code writes. Checked: it is recognised (and a plain
Chrome array is not taken for it), it is never placed without an anchor (its times are the driver's
monotonic clock), a process record's anchor places it, its step instants become ``rl.<algo>.step``
slices that give the report and ``rl-trace sql`` their steps, and Perfetto imports the merge cleanly.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trace_observer.merge.files.sources import discover, read_head
from rl_trace_observer.merge.formats import ReadContext, sniff
from rl_trace_observer.merge.formats.nemo_rl_perfetto import NemoRLPerfetto, step_spans
from rl_trace_observer.merge.timeline.model import Event
from rl_trace_observer.testing.perfetto import engine as pe

from ..corpus.nemo_rl_perfetto import write_record, write_trace

ROOT = Path(__file__).resolve().parents[2]
ANCHOR = 1_780_000_000_000_000_000


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rl_trace_observer.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


def test_recognised_and_a_plain_chrome_array_is_not(tmp_path: Path) -> None:
    trace = tmp_path / "grpo_perfetto.json"
    write_trace(trace)
    fmt, _ = sniff(read_head(discover([str(trace)])[0]))
    assert fmt is not None and fmt.kind == "nemo_rl_perfetto" and fmt.stack == "nemo-rl"
    plain = tmp_path / "other.json"
    plain.write_text(json.dumps([{"ph": "X", "name": "w", "pid": 1, "tid": 1, "ts": 1, "dur": 2}]))
    other, _ = sniff(read_head(discover([str(plain)])[0]))
    assert other is None or other.kind != "nemo_rl_perfetto"


def test_never_placed_without_an_anchor_and_steps_joined_with_one(tmp_path: Path) -> None:
    trace = tmp_path / "nemo_rl_perfetto_trace.json"
    info = write_trace(trace)
    data = trace.read_bytes()
    res = NemoRLPerfetto().read(data, ReadContext(str(trace), trace.name))
    assert res.skip and [p.kind for p in res.problems] == ["unanchored"]
    assert "monotonic" in res.problems[0].detail
    res = NemoRLPerfetto().read(data, ReadContext(str(trace), trace.name, anchor_ns=ANCHOR))
    assert not res.skip and res.dropped == 0
    steps = [e for e in res.events if e.name == "rl.grpo.step"]
    assert [(e.ts, e.dur) for e in steps] == [
        (ANCHOR + lo * 1000, (hi - lo) * 1000) for _, lo, hi in info["windows"]
    ]
    assert [msgspec.json.decode(e.args)["step"] for e in steps] == [1, 2]  # type: ignore[arg-type]
    assert set(res.process_names.values()) == {"driver", "trajectory_collector_actor", "grpo_async_rollouts"}
    assert sum(1 for e in res.events if e.ph == "B") == sum(1 for e in res.events if e.ph == "E") == 6


def test_merged_with_its_process_record_steps_report_and_sql(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    trace = run / "nemo_rl_perfetto_trace.json"
    info = write_trace(trace)
    mono0 = info["windows"][0][1]
    write_record(run, trace, ANCHOR - mono0 * 1000)  # the capture's monotonic → wall anchor
    out = tmp_path / "merged.json"
    r = cli("merge", str(run), "-o", str(out), "--workers", "0")
    assert r.returncode == 0, r.stderr
    manifest = json.loads(Path(f"{out}.manifest.json").read_text())
    assert manifest["problems"] == []
    (art,) = [a for a in manifest["artifacts"] if a["kind"] == "nemo_rl_perfetto"]
    assert art["anchor"] == {"ns": ANCHOR - mono0 * 1000, "source": "process record"}
    names = sorted(
        e["args"]["name"]
        for e in json.loads(out.read_text())["traceEvents"]
        if e.get("name") == "process_name"
    )
    assert names == [
        "node-a · pid 1000 · driver",  # the tracer's "driver" is the record's process
        "node-a · pid 1000 · driver · grpo_async_rollouts",
        "node-a · pid 1000 · driver · trajectory_collector_actor",
    ]
    rep_path = tmp_path / "report.json"
    assert cli("report", str(out), "--json", str(rep_path), "-q").returncode == 0
    rep = json.loads(rep_path.read_text())
    assert rep["source"]["steps_from"] == "rl.grpo.step"
    assert [(s["step"], s["dur_ns"]) for s in rep["steps"]] == [
        (n, (hi - lo) * 1000) for n, lo, hi in info["windows"]
    ]
    sql = cli("sql", str(out), "SELECT step, dur_ns FROM steps ORDER BY step", "--json")
    if sql.returncode == 0:  # the sql extra is installed
        assert [(row["step"], row["dur_ns"]) for row in json.loads(sql.stdout)] == [
            (n, (hi - lo) * 1000) for n, lo, hi in info["windows"]
        ]


@pytest.mark.perfetto
def test_perfetto_imports_the_merge_cleanly(tmp_path: Path) -> None:
    reason = pe.unavailable_reason()
    if reason:
        pytest.skip(reason)
    run = tmp_path / "run"
    run.mkdir()
    trace = run / "nemo_rl_perfetto_trace.json"
    info = write_trace(trace)
    write_record(run, trace, ANCHOR)
    for name in ("merged.json", "merged.pftrace"):
        out = tmp_path / name
        assert cli("merge", str(run), "-o", str(out), "--workers", "0").returncode == 0
        res = pe.expect_clean(out, ["SELECT count(*) FROM slice WHERE name = 'rl.grpo.step'"])
        assert res.queries[0].scalar() == len(info["windows"])


edges = st.lists(
    st.tuples(
        st.sampled_from(["grpo", "ppo"]), st.sampled_from(["start", "complete"]), st.integers(0, 10**6)
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(edges, st.integers(0, 3))
def test_step_spans_pair_each_complete_with_the_open_start(
    seq: list[tuple[str, str, int]], pids: int
) -> None:
    events = [
        Event(
            ph="i",
            name=f"{algo}_step_{edge}",
            pid=i % (pids + 1),
            tid=1,
            ts=ts,
            args=msgspec.Raw(b'{"step":1}'),
        )
        for i, (algo, edge, ts) in enumerate(seq)
    ]
    spans = step_spans(events)
    want: list[tuple[Any, ...]] = []
    open_: dict[tuple[Any, str], Event] = {}
    for e in sorted(events, key=lambda e: e.ts):  # type: ignore[arg-type, return-value]
        algo, edge = str(e.name).split("_step_")
        if edge == "start":
            open_[(e.pid, algo)] = e
        elif (start := open_.pop((e.pid, algo), None)) is not None:
            want.append((f"rl.{algo}.step", start.pid, start.ts, e.ts - start.ts))  # type: ignore[operator]
    assert [(s.name, s.pid, s.ts, s.dur) for s in spans] == want
    assert all(s.dur >= 0 for s in spans)  # type: ignore[operator]
