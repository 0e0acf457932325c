"""A Torch trace aligns on its process's RL-Insight stages in the merge (issue 8), on real files.

One "actor rank" runs the real tools (rl-insight through our backend, torch.profiler on the CPU,
VizTracer); its Torch trace then gets a known clock error by moving its ``baseTimeNanoseconds``,
as a Kineto clock that disagrees with the wall clock would. The merged ``record_function`` region
must land back inside its RL-Insight stage, in the manifest and in the real Perfetto engine.
"""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from rl_trace_observer.capture.identity import hostname
from rl_trace_observer.merge.clock.pairs import DEFAULT_MARGIN_NS
from rl_trace_observer.merge.options import MergeOptions
from rl_trace_observer.merge.pipeline import merge
from rl_trace_observer.testing.perfetto import engine as pe

from ..corpus.real_run import build_real_run

pytestmark = [pytest.mark.perfetto, pytest.mark.timeout(600)]
MS = 1_000_000
STAGE_SQL = (
    "select t.name as thread, s.ts, s.dur from slice s join thread_track tt on s.track_id = tt.id "
    "join thread t using (utid) where s.name = 'actor_update' order by t.name"
)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    reason = pe.unavailable_reason()
    if reason:
        pytest.skip(f"Perfetto engine unavailable: {reason}")
    root = tmp_path_factory.mktemp("stage-run")
    build_real_run(root / hostname(), ranks=1)
    return root


def _shift_torch(root: Path, error_ns: int) -> None:
    """Make the Torch trace's clock ``error_ns`` ahead of the wall clock (in place, path unchanged)."""
    (path,) = root.rglob("verl_train_step1_*.json.gz")
    doc = json.loads(gzip.decompress(path.read_bytes()))
    doc["baseTimeNanoseconds"] += error_ns
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))


def _raw_edges(root: Path) -> tuple[tuple[int, int], tuple[int, int]]:
    """(start, end) ns of the RL-Insight stage and of the Torch region, read from the files as written."""
    (log,) = root.rglob("rl-insight-*.chrome.jsonl")
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    (stage,) = [e for e in lines if e.get("ph") == "X" and e.get("name") == "actor_update"]
    (path,) = root.rglob("verl_train_step1_*.json.gz")
    doc = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    (region,) = [e for e in doc["traceEvents"] if e.get("name") == "actor_update" and e.get("ph") == "X"]
    r0 = int(doc["baseTimeNanoseconds"]) + int(Decimal(region["ts"]) * 1000)
    return (stage["ts_ns"], stage["ts_ns"] + stage["dur_ns"]), (r0, r0 + int(Decimal(region["dur"]) * 1000))


def _bounds(root: Path) -> tuple[int, int]:
    """The offsets (subtracted from Torch times) that keep the region inside its stage: start after the
    stage's start, end before its end."""
    (s0, s1), (r0, r1) = _raw_edges(root)
    return r1 - s1, r0 - s0


def _minimal(lo: int, hi: int, margin: int = DEFAULT_MARGIN_NS) -> int:
    """The "minimal" policy's offset: the one in [lo + margin, hi − margin] nearest 0."""
    if lo + margin > hi - margin:
        return (lo + hi) // 2
    return min(max(0, lo + margin), hi - margin)


def _stage_record(result: Any) -> dict[str, Any]:
    (record,) = [r for r in result.manifest["timeline"]["clock"]["artifacts"] if r["pairing"] == "stage_name"]
    return record


def _spans(engine: pe.Engine, output: str) -> dict[str, tuple[int, int]]:
    res = engine.load(output, [STAGE_SQL])
    assert res.ok, res.summary()
    spans = {row[0].split(" · ")[0]: (row[1], row[1] + row[2]) for row in res.query(STAGE_SQL).rows}
    assert set(spans) == {"RL-Insight", "Torch"}, spans
    return spans


@pytest.mark.parametrize("beyond_ms", [5, -5])
def test_torch_region_moves_back_inside_its_stage(run: Path, tmp_path: Path, beyond_ms: int) -> None:
    """Exact, whatever the stage's slack on this machine: the clock error is sized from the slack the
    files show (the region sticks out ``beyond_ms`` past the stage's end, or before its start), the
    bounds move by the error to the ns, the offset is the bound nearest 0, and Perfetto shows the region
    moved by exactly that offset."""
    import shutil

    root = tmp_path / "run"
    shutil.copytree(run, root)
    lo0, hi0 = _bounds(run)
    error = (-lo0 if beyond_ms > 0 else -hi0) + beyond_ms * MS
    _shift_torch(root, error)
    assert _bounds(root) == (lo0 + error, hi0 + error)  # the files say so; now the merger must
    (g0, g1) = (r - s for r, s in zip(_raw_edges(root)[1], _raw_edges(root)[0], strict=True))
    with pe.Engine() as engine:
        aligned = merge([str(root)], str(tmp_path / "aligned.json.gz"), MergeOptions(workers=0))
        rec = _stage_record(aligned)
        assert rec["pairs"] == 2 and rec["method"] == "pairs_minimal" and rec["applied"], rec
        assert rec["raw_acausal_pairs"] == 1 and rec["acausal_pairs"] == 0, rec
        assert rec["bounds_ns"] == [lo0 + error, hi0 + error], (rec, lo0, hi0)
        assert rec["offset_ns"] == _minimal(lo0 + error, hi0 + error) != 0, rec
        spans = _spans(engine, aligned.output)
        (s0, s1), (r0, r1) = spans["RL-Insight"], spans["Torch"]
        assert (r0 - s0, r1 - s1) == (g0 - rec["offset_ns"], g1 - rec["offset_ns"]), (spans, rec)
        assert s0 <= r0 and r1 <= s1, spans  # the region nests in its stage: Perfetto shows it so

        wall = merge([str(root)], str(tmp_path / "wall.json.gz"), MergeOptions(workers=0, clock_mode="wall"))
        assert _stage_record(wall)["applied"] is False
        assert any(
            p["kind"] == "clock" and "--clock wall keeps 1 of 2 pairs" in p["detail"]
            for p in wall.manifest["problems"]
        )
        (s0, s1), (r0, r1) = _spans(engine, wall.output).values()
        assert (r0 - s0, r1 - s1) == (g0, g1)  # raw: exactly where the shifted files put it


def test_torch_trace_on_the_wall_clock_is_left_where_it_is(run: Path, tmp_path: Path) -> None:
    """The real files as written: the stage holds its region already, so the offset is 0."""
    res = merge([str(run)], str(tmp_path / "out.json.gz"), MergeOptions(workers=0))
    rec = _stage_record(res)
    lo, hi = _bounds(run)
    assert lo + DEFAULT_MARGIN_NS <= 0 <= hi - DEFAULT_MARGIN_NS, (lo, hi)  # the region sits in its stage
    assert rec["bounds_ns"] == [lo, hi], (rec, lo, hi)  # the stage's slack, as the files have it
    assert rec["offset_ns"] == 0 and rec["raw_acausal_pairs"] == 0 and rec["pairs"] == 2, rec
    assert not [p for p in res.manifest["problems"] if p["kind"] == "clock"]


def test_unreadable_stage_log_leaves_the_torch_trace_on_the_host_clock(run: Path, tmp_path: Path) -> None:
    """The RL-Insight log is garbage: its own problem is reported, the Torch trace still merges,
    unaligned (no stage record), and the merge does not fail."""
    import shutil

    root = tmp_path / "run"
    shutil.copytree(run, root)
    (log,) = root.rglob("rl-insight-*.chrome.jsonl")
    log.write_bytes(b'{"ph":"X","cat":"rl_insight","ts_ns": \xff\xfe cut here')  # sniffed as ours
    res = merge([str(root)], str(tmp_path / "out.json.gz"), MergeOptions(workers=0))
    assert res.written
    (entry,) = [a for a in res.manifest["artifacts"] if a["path"].endswith(log.name)]
    assert entry["kind"] == "rl_insight", entry  # the Torch job did try to read its stages
    records = res.manifest["timeline"]["clock"]["artifacts"]
    assert not [r for r in records if r["pairing"] == "stage_name"]
    torch = [a for a in res.manifest["artifacts"] if a["kind"] == "torch"]
    assert torch and all(a["events"]["kept"] > 0 for a in torch)
    assert any(p["path"].endswith(log.name) for p in res.manifest["problems"]), res.manifest["problems"]
