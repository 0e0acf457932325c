"""``rl-trace merge`` as a user runs it: exit codes, manifest on failure, selection, URLs, outputs."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import fsspec
import pytest

from rl_trace_observer.merge.options import MergeOptions
from rl_trace_observer.merge.pipeline import merge

from ..conftest import merge_cli
from ..corpus.recorded import record_process
from ..corpus.tokenspeed_files import write_rank

T0 = time.time_ns() - 10**10
S = 10**9  # one second in ns


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two steps recorded by a trainer, two actor ranks on two hosts with the SAME pid, a second run."""
    root = tmp_path_factory.mktemp("run")
    steps = {1: (T0, T0 + S), 2: (T0 + S, T0 + 2 * S)}
    record_process(root / "h1", host="h1", pid=10, role="trainer", rank=None, steps=steps,
                   spans=[("train_step", T0 + S // 10, T0 + S // 2, "driver")])  # fmt: skip
    for host, rank in (("h1", 0), ("h2", 1)):
        spans = [("actor_update", T0 + k * S + S // 4, T0 + k * S + S // 2, f"rank_{rank}") for k in (0, 1)]
        record_process(
            root / host, host=host, pid=4242, rank=rank, spans=spans, counters=[("loss", 1.5, T0 + S // 3)]
        )
    record_process(root / "h3", host="h3", pid=7, run_id="run-2", spans=[("other", T0, T0 + 5, "x")])
    return root


def _manifest(path: Path) -> dict[str, Any]:
    return json.loads(Path(f"{path}.manifest.json").read_text())


def test_cli_success_prints_output_and_how_to_open_it(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.json.gz"
    proc = merge_cli(str(run_dir), "-o", str(out), "--run", "run-1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(out)
    assert "ui.perfetto.dev" in proc.stderr and "rl-trace view" in proc.stderr
    doc = json.loads(gzip.decompress(out.read_bytes()))
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert {"h1 · pid 4242 · actor rank 0", "h2 · pid 4242 · actor rank 1", "h1 · pid 10 · trainer"} <= names
    m = _manifest(out)
    assert m["counts"]["processes"] == 3
    assert {p["kind"] for p in m["problems"]} == {
        "clock"
    }  # two hosts, no clock sync measured: said once each
    assert [s["step"] for s in m["sessions"]] == [1, 2] and m["sessions"][0]["start_ns"] == T0
    assert doc["rl_trace_observer"]["base_ns"] == m["timeline"]["base_ns"] <= T0


def test_mixed_runs_are_reported_and_strict_fails(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.json"
    proc = merge_cli(str(run_dir), "-o", str(out))
    assert proc.returncode == 0
    assert "mixed_runs" in proc.stderr and proc.stderr.count("warning: mixed_runs") == 1
    assert proc.stderr.count("warning: clock") == 1  # one line per kind, however many problems
    strict = merge_cli(str(run_dir), "-o", str(tmp_path / "s.json"), "--strict")
    assert strict.returncode == 1 and (tmp_path / "s.json").exists()
    assert _manifest(tmp_path / "s.json")["status"] == "partial"


def test_usage_errors_exit_2_and_write_nothing(run_dir: Path, tmp_path: Path) -> None:
    assert merge_cli(str(run_dir), "-o", str(tmp_path / "x.txt")).returncode == 2
    assert merge_cli(str(tmp_path / "absent"), "-o", str(tmp_path / "x.json")).returncode == 2
    assert merge_cli(str(run_dir), "-o", str(tmp_path / "x.json"), "--step", "3-1").returncode == 2
    assert merge_cli(str(run_dir), "-o", str(tmp_path / "x.json"), "--time-window", "abc").returncode == 2
    assert merge_cli(str(run_dir)).returncode == 2  # no -o
    victim = run_dir / "h1" / "rl-trace-process-h1-pid-10.json"
    before = victim.read_bytes()
    proc = merge_cli(str(victim), "-o", str(victim))
    assert proc.returncode == 2 and "is one of the inputs" in proc.stderr and victim.read_bytes() == before
    assert not list(tmp_path.iterdir())


def test_nothing_usable_exits_1_with_a_failed_manifest(tmp_path: Path) -> None:
    write_rank(tmp_path / "in" / "n", profile_id="p", tp=0, pid=5, start_wall_ns=T0, anchored=False)
    (tmp_path / "in" / "n" / "p-TP0.viztracer.json").unlink()
    out = tmp_path / "out.json"
    proc = merge_cli(str(tmp_path / "in"), "-o", str(out))
    assert proc.returncode == 1
    m = _manifest(out)
    assert m["status"] == "failed" and m["counts"]["events_kept"] == 0
    assert [p["kind"] for p in m["problems"] if p["kind"] == "unanchored"] == ["unanchored"]
    assert "unanchored" in proc.stderr
    # it says so, and why, and nothing about --strict or how to open an empty trace
    assert "nothing usable was merged" in proc.stderr and "1 file: nothing usable" in proc.stderr
    assert "--strict" not in proc.stderr and "ui.perfetto.dev" not in proc.stderr
    assert not out.exists() and not m["output"]["written"]  # an earlier good output would be kept


def test_nothing_usable_keeps_an_earlier_output(tmp_path: Path) -> None:
    write_rank(tmp_path / "in" / "n", profile_id="p", tp=0, pid=5, start_wall_ns=T0, anchored=False)
    (tmp_path / "in" / "n" / "p-TP0.viztracer.json").unlink()
    out = tmp_path / "out.json"
    out.write_bytes(b'{"traceEvents":[]}')
    assert merge([str(tmp_path / "in")], str(out)).exit_code == 1
    assert out.read_bytes() == b'{"traceEvents":[]}'


def test_step_role_and_window_selection(run_dir: Path, tmp_path: Path) -> None:
    one = merge(
        [str(run_dir)], str(tmp_path / "s2.json"), MergeOptions(run="run-1", steps=((2, 2),), workers=0)
    )
    ev = [e for e in json.loads((tmp_path / "s2.json").read_text())["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in ev] == ["actor_update", "actor_update"]  # step 2's spans only
    assert one.manifest["counts"]["events_filtered"] > 0
    none = merge(
        [str(run_dir)], str(tmp_path / "s9.json"), MergeOptions(run="run-1", steps=((9, 9),), workers=0)
    )
    assert any(p["kind"] == "no_step_window" for p in none.manifest["problems"]) and none.exit_code == 1
    roles = merge(
        [str(run_dir)], str(tmp_path / "r.json"), MergeOptions(run="run-1", roles=("trainer",), workers=0)
    )
    assert roles.manifest["counts"]["events_kept"] == 1
    win = merge(
        [str(run_dir)],
        str(tmp_path / "w.json"),
        MergeOptions(run="run-1", time_window=(T0 / 1e9, (T0 + S) / 1e9), workers=0),
    )
    assert win.manifest["counts"]["events_kept"] == 5  # train_step, 2 actor_update, 2 loss samples


def test_split_steps_writes_one_output_per_step(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "split.json"
    proc = merge_cli(str(run_dir), "-o", str(out), "--run", "run-1", "--split-steps")
    assert proc.returncode == 0, proc.stderr
    for step in (1, 2):
        m = _manifest(tmp_path / f"split.step{step}.json")
        assert m["options"]["steps"] == [[step, step]] and m["counts"]["events_kept"] >= 2


def test_fsspec_memory_url_input(tmp_path: Path) -> None:
    write_rank(tmp_path / "local", profile_id="p", tp=0, pid=5, start_wall_ns=T0)
    fs = fsspec.filesystem("memory")
    for path in (tmp_path / "local").iterdir():
        fs.pipe(f"/runs/n1/{path.name}", path.read_bytes())
    res = merge(["memory://runs"], str(tmp_path / "mem.json"), MergeOptions(workers=0))
    local = merge([str(tmp_path / "local")], str(tmp_path / "loc.json"), MergeOptions(workers=0))
    assert (
        res.exit_code == 0
        and res.manifest["counts"]["events_kept"] == local.manifest["counts"]["events_kept"] > 0
    )
    assert all(a["path"].startswith("memory://") for a in res.manifest["artifacts"])


def test_worker_processes_give_the_same_bytes_as_in_process(run_dir: Path, tmp_path: Path) -> None:
    for fmt in ("json", "json.gz", "pftrace", "pftrace.gz"):
        a = merge([str(run_dir)], str(tmp_path / f"a.{fmt}"), MergeOptions(run="run-1", workers=0))
        b = merge([str(run_dir)], str(tmp_path / f"b.{fmt}"), MergeOptions(run="run-1", workers=2))
        assert a.exit_code == b.exit_code == 0
        assert (tmp_path / f"a.{fmt}").read_bytes() == (tmp_path / f"b.{fmt}").read_bytes()


def test_merging_imports_no_framework(run_dir: Path, tmp_path: Path) -> None:
    """The merger (readers, passes, writers, workers) never pulls in torch, ray, verl or numpy."""
    code = (
        "import sys, json\n"
        "from rl_trace_observer.merge.pipeline import MergeOptions, merge\n"
        f"merge([{str(run_dir)!r}], {str(tmp_path / 'x.pftrace')!r}, MergeOptions(workers=0))\n"
        f"merge([{str(run_dir)!r}], {str(tmp_path / 'x.json.gz')!r}, MergeOptions(workers=0))\n"
        "heavy = ('torch', 'ray', 'verl', 'numpy', 'pandas', 'rl_insight', 'viztracer')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
