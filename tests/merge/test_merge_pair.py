"""The merge output and its manifest are one unit (issue 33, items 9 and 16).

A re-merge that fails — nothing usable, or ``--strict`` with problems — leaves the earlier output and
its manifest byte for byte, and writes its own manifest beside them. A merge killed with ``kill -9``
at any point of its commit leaves either the earlier pair or a new output whose manifest the readers
recognise as another merge's (one line, no traceback); the next merge sweeps what the killed one left.
Real kills: the CLI in a subprocess, stopped at a named point by the test-only ``_RLTO_TEST_PAUSE``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rl_trace_observer.analysis.report.inputs import paired_manifest
from rl_trace_observer.config import TEST_PAUSE_VAR
from rl_trace_observer.merge.manifest.pair import failed_path

from ..cli_run import rl_trace
from ..conftest import clean_env, requires
from ..corpus.kineto_cpu import kineto_cpu_events

T0 = time.time_ns() - 10**10


def _kineto(pid: int, n: int) -> dict[str, Any]:
    events = kineto_cpu_events(pid, n)
    return {"schemaVersion": 1, "deviceProperties": [], "baseTimeNanoseconds": T0, "traceEvents": events}


def _run(folder: Path, n: int, broken: bool = False) -> Path:
    folder.mkdir(parents=True)
    (folder / "worker.pt.trace.json").write_text(json.dumps(_kineto(100, n)))
    if broken:  # a second trace cut in its first event: a problem, the first file still merges
        (folder / "cut.pt.trace.json").write_text('{"schemaVersion": 1, "traceEvents": [{"ph": "X", "na')
    return folder


def _merge(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rl_trace_observer.cli.main", "merge", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env or clean_env(),
    )


def _pair(out: Path) -> tuple[bytes, bytes]:
    return out.read_bytes(), Path(f"{out}.manifest.json").read_bytes()


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".rl-merge-" in p.name)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pair")
    empty = root / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("nothing to merge here\n")
    return {
        "a": _run(root / "a", 50),
        "b": _run(root / "b", 80),
        "problems": _run(root / "problems", 70, broken=True),
        "empty": empty,
    }


@pytest.mark.parametrize("fmt", ["json.gz", "json"])
@pytest.mark.parametrize("failing", ["empty", "problems"])
def test_a_failed_remerge_leaves_the_earlier_pair_untouched(
    runs: dict[str, Path], tmp_path: Path, fmt: str, failing: str
) -> None:
    out = tmp_path / f"run.{fmt}"
    first = _merge(str(runs["a"]), "-o", str(out))
    assert first.returncode == 0, first.stderr
    before = _pair(out)
    strict = ["--strict"] if failing == "problems" else []
    again = _merge(str(runs[failing]), "-o", str(out), *strict)
    assert again.returncode == 1 and "Traceback" not in again.stderr
    assert _pair(out) == before  # output and manifest, byte for byte
    failed = failed_path(Path(f"{out}.manifest.json"))
    doc = json.loads(failed.read_text())
    assert doc["status"] == "failed" and doc["output"]["kept_earlier"] is True
    assert str(failed) in again.stderr and "left as they were" in again.stderr
    manifest, note = paired_manifest(out, Path(f"{out}.manifest.json"))
    assert note is None and manifest is not None and manifest["status"] == "ok"
    assert manifest["counts"]["events_kept"] == 50
    if fmt == "json.gz":  # the report reads the earlier trace with the manifest that describes it
        report = rl_trace("report", str(out), "--json", str(tmp_path / "r.json"), "-q")
        assert report.returncode == 0, report.stderr
        summary = json.loads((tmp_path / "r.json").read_text())
        assert summary["source"]["manifest"] == f"{out}.manifest.json"
        assert summary["source"]["manifest_note"] is None
    ok = _merge(str(runs["b"]), "-o", str(out))  # a later success replaces the pair, drops the failure's
    assert ok.returncode == 0 and not failed.exists() and _pair(out) != before
    assert _leftovers(tmp_path) == []


def test_strict_without_an_earlier_output_still_writes_what_it_found(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "fresh.json.gz"
    proc = _merge(str(runs["problems"]), "-o", str(out), "--strict")
    assert proc.returncode == 1 and out.exists()
    manifest, note = paired_manifest(out, Path(f"{out}.manifest.json"))
    assert note is None and manifest is not None and manifest["status"] == "partial"


def _killed_at(point: str, inputs: Path, out: Path, tmp: Path, *more: str) -> None:
    """Run a merge to ``out`` and kill -9 it at ``point`` of its commit."""
    ready = tmp / f"ready-{point}"
    env = clean_env(**{TEST_PAUSE_VAR: f"{point}={ready}"})
    proc = subprocess.Popen(
        [sys.executable, "-m", "rl_trace_observer.cli.main", "merge", str(inputs), "-o", str(out), *more],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the merge never reached " + point
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert b"Traceback" not in err


@pytest.mark.parametrize("point", ["output-complete", "output-renamed"])
def test_kill_during_the_commit_never_pairs_an_output_with_another_merges_manifest(
    runs: dict[str, Path], tmp_path: Path, point: str
) -> None:
    out = tmp_path / "run.json.gz"
    mpath = Path(f"{out}.manifest.json")
    assert _merge(str(runs["a"]), "-o", str(out)).returncode == 0
    before = _pair(out)
    _killed_at(point, runs["b"], out, tmp_path)
    manifest, note = paired_manifest(out, mpath)
    if point == "output-complete":  # killed before either rename: the earlier pair, whole
        assert _pair(out) == before and note is None and manifest is not None
        assert len(_leftovers(tmp_path)) == 2  # the completed output and manifest temps
    else:  # the new output, the earlier manifest: the reader tells
        assert out.read_bytes() != before[0] and mpath.read_bytes() == before[1]
        assert manifest is None and note is not None and "not the manifest of run.json.gz" in note
        report = rl_trace("report", str(out), "--json", str(tmp_path / "r.json"), "-q")
        assert report.returncode == 0 and "Traceback" not in report.stderr
        lines = [ln for ln in report.stderr.splitlines() if "not the manifest" in ln]
        assert len(lines) == 1 and lines[0].startswith("warning: ") and str(mpath) in lines[0]
        summary = json.loads((tmp_path / "r.json").read_text())
        assert summary["source"]["manifest"] is None and summary["source"]["events"] == 80
    unrelated = tmp_path / f".{out.name}.rl-merge-notes.tmp"  # a look-alike nobody can prove stale
    unrelated.write_text("keep me")
    again = _merge(str(runs["b"]), "-o", str(out))
    assert again.returncode == 0, again.stderr
    assert _leftovers(tmp_path) == [unrelated.name]  # the killed merge's temps are gone
    manifest, note = paired_manifest(out, mpath)
    assert note is None and manifest is not None and manifest["counts"]["events_kept"] == 80


@requires("pyarrow")
def test_a_merge_killed_after_its_shards_leaves_no_pftrace_reading_another_merges_rows(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    out, shards = tmp_path / "run.pftrace", tmp_path / "shards"
    assert _merge(str(runs["a"]), "-o", str(out), "--shards", str(shards)).returncode == 0
    before = _pair(out)
    _killed_at("output-complete", runs["b"], out, tmp_path, "--shards", str(shards))
    assert _pair(out) == before  # the earlier pair, whole; the shards are the killed merge's
    proc = rl_trace("report", str(out), "-q")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and f"the span shards in {shards.resolve()}" in proc.stderr
    again = _merge(str(runs["b"]), "-o", str(out), "--shards", str(shards))
    assert again.returncode == 0, again.stderr
    report = rl_trace("report", str(out), "--json", str(tmp_path / "r.json"), "-q")
    assert report.returncode == 0, report.stderr
    assert json.loads((tmp_path / "r.json").read_text())["source"]["events"] == 80


@requires("pyarrow")
@pytest.mark.parametrize("fmt", ["json.gz", "pftrace"])
def test_kills_at_many_instants_never_leave_a_report_with_another_merges_manifest(
    runs: dict[str, Path], tmp_path: Path, fmt: str
) -> None:
    """Merges of alternating inputs killed after growing delays (planning, jobs, stitching, shards,
    commit): after each kill, whatever the report reads agrees with the manifest it uses."""
    out, shards = tmp_path / f"run.{fmt}", tmp_path / "shards"
    assert _merge(str(runs["a"]), "-o", str(out), "--shards", str(shards)).returncode == 0
    for k, delay in enumerate([0.3, 0.8, 1.2, 1.6, 2.2]):
        inputs = runs["b"] if k % 2 == 0 else runs["a"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "rl_trace_observer.cli.main", "merge", str(inputs), "-o", str(out),
             "--shards", str(shards)],
            env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
        assert b"Traceback" not in err
        report = rl_trace("report", str(out), "--json", str(tmp_path / "r.json"), "-q")
        assert "Traceback" not in report.stderr, report.stderr
        if report.returncode:  # a .pftrace whose shards a killed merge rewrote: one line, refused
            assert fmt == "pftrace" and report.stderr.count("\n") == 1 and "another merge" in report.stderr
            continue
        summary = json.loads((tmp_path / "r.json").read_text())
        used = summary["source"]["manifest"]
        if used is not None:
            manifest = json.loads(Path(used).read_text())
            assert summary["source"]["events"] == manifest["counts"]["events_kept"]
        else:
            assert summary["source"]["manifest_note"]
    final = _merge(str(runs["b"]), "-o", str(out), "--shards", str(shards))
    assert final.returncode == 0, final.stderr
    assert _leftovers(tmp_path) == [] and not list(shards.rglob(".*rl-merge-*"))


@requires("pyarrow")
def test_a_view_that_selects_nothing_leaves_the_earlier_view_and_its_manifest(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    shards, view = tmp_path / "shards", tmp_path / "view.json.gz"
    assert (
        _merge(str(runs["a"]), "-o", str(tmp_path / "run.pftrace"), "--shards", str(shards)).returncode == 0
    )
    assert _merge(str(shards), "-o", str(view)).returncode == 0
    before = _pair(view)
    empty = _merge(str(shards), "-o", str(view), "--role", "nobody")
    assert empty.returncode == 1 and "Traceback" not in empty.stderr
    assert _pair(view) == before and failed_path(Path(f"{view}.manifest.json")).exists()
    manifest, note = paired_manifest(view, Path(f"{view}.manifest.json"))
    assert note is None and manifest is not None and manifest["counts"]["events_kept"] == 50
