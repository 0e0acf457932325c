"""A Torch trace aligns on its process's RL-Insight stages in the merge (issue 8), on real files.

One "actor rank" runs the real tools (rl-insight through our backend, torch.profiler on the CPU,
VizTracer); its Torch trace then gets a known clock error by moving its ``baseTimeNanoseconds``,
as a Kineto clock that disagrees with the wall clock would. The merged ``record_function`` region
must land back inside its RL-Insight stage, in the manifest and in the real Perfetto engine.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from rl_trace_observer.capture.identity import hostname
from rl_trace_observer.merge.options import MergeOptions
from rl_trace_observer.merge.pipeline import merge
from rl_trace_observer.testing.perfetto import engine as pe

from .corpus.real_run import build_real_run

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


def _stage_record(result: Any) -> dict[str, Any]:
    (record,) = [r for r in result.manifest["timeline"]["clock"]["artifacts"] if r["pairing"] == "stage_name"]
    return record


def _spans(engine: pe.Engine, output: str) -> dict[str, tuple[int, int]]:
    res = engine.load(output, [STAGE_SQL])
    assert res.ok, res.summary()
    spans = {row[0].split(" · ")[0]: (row[1], row[1] + row[2]) for row in res.query(STAGE_SQL).rows}
    assert set(spans) == {"RL-Insight", "Torch"}, spans
    return spans


@pytest.mark.parametrize("error_ms", [5, -5])
def test_torch_region_moves_back_inside_its_stage(run: Path, tmp_path: Path, error_ms: int) -> None:
    import shutil

    root = tmp_path / "run"
    shutil.copytree(run, root)
    _shift_torch(root, error_ms * MS)
    with pe.Engine() as engine:
        aligned = merge([str(root)], str(tmp_path / "aligned.json.gz"), MergeOptions(workers=0))
        rec = _stage_record(aligned)
        assert rec["pairs"] == 2 and rec["method"] == "pairs_minimal" and rec["applied"], rec
        assert rec["raw_acausal_pairs"] == 1 and rec["acausal_pairs"] == 0, rec
        lo, hi = rec["bounds_ns"]
        assert lo <= rec["offset_ns"] <= hi
        # moved as far as needed and no further: the error, less the stage's own slack on that side
        assert 0.9 * abs(error_ms) * MS <= abs(rec["offset_ns"]) <= abs(error_ms) * MS + MS // 10, rec
        assert (rec["offset_ns"] > 0) == (error_ms > 0)
        spans = _spans(engine, aligned.output)
        (s0, s1), (r0, r1) = spans["RL-Insight"], spans["Torch"]
        assert s0 <= r0 and r1 <= s1, spans  # the region nests in its stage: Perfetto shows it so

        wall = merge([str(root)], str(tmp_path / "wall.json.gz"), MergeOptions(workers=0, clock_mode="wall"))
        assert _stage_record(wall)["applied"] is False
        assert any(
            p["kind"] == "clock" and "--clock wall keeps 1 of 2 pairs" in p["detail"]
            for p in wall.manifest["problems"]
        )
        (s0, s1), (r0, r1) = _spans(engine, wall.output).values()
        assert max(s0 - r0, r1 - s1) >= 0.9 * abs(error_ms) * MS  # raw: sticks out by the error


def test_torch_trace_on_the_wall_clock_is_left_where_it_is(run: Path, tmp_path: Path) -> None:
    """The real files as written: the stage holds its region already, so the offset is 0."""
    res = merge([str(run)], str(tmp_path / "out.json.gz"), MergeOptions(workers=0))
    rec = _stage_record(res)
    assert rec["offset_ns"] == 0 and rec["raw_acausal_pairs"] == 0 and rec["pairs"] == 2, rec
    lo, hi = rec["bounds_ns"]
    assert lo <= 0 <= hi and hi - lo < 5 * MS, rec  # the stage's slack: microseconds to a few ms
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
