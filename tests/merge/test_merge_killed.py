"""``kill -9`` of a merge whose pool workers are busy (issue 33, item 10): the workers die with it, no
traceback reaches the terminal, and the next merge to the same output removes what the killed one left
— its owned temp and part files — and nothing else, not even files with look-alike names."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from rl_trace_observer.merge.output import owned

from ..conftest import clean_env

T0 = time.time_ns() - 10**10
FILES, EVENTS = 6, 60_000


def _kineto(pid: int, n: int) -> dict[str, Any]:
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": "CPU"}}
    ]
    events += [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": f"op{i % 97}",
            "pid": pid,
            "tid": pid,
            "ts": 1000.0 + 3 * i,
            "dur": 2.0,
        }
        for i in range(n)
    ]
    return {"schemaVersion": 1, "deviceProperties": [], "baseTimeNanoseconds": T0, "traceEvents": events}


@pytest.fixture(scope="module")
def busy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("busy")
    for k in range(FILES):
        (root / f"rank{k}.pt.trace.json").write_text(json.dumps(_kineto(100 + k, EVENTS)))
    return root


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _stitching(folder: Path) -> bool:
    for path in folder.glob(".*.rl-merge-*.tmp"):
        try:
            if path.stat().st_size > 0:
                return True
        except FileNotFoundError:  # renamed into place meanwhile
            pass
    return False


def _look_alikes(folder: Path, name: str) -> list[Path]:
    """Files a sweep must keep: another namespace's, a living owner's, another output's, old-style."""
    pid1_start = owned._start_ticks(1)
    where = owned._where()
    keep = [
        folder / f".{name}.rl-merge-ffffffff-1.999999.tmp",  # another machine or PID namespace
        folder / f".{name}.rl-merge-{where}-{pid1_start}.1.tmp",  # its owner (pid 1) is alive
        folder / f".other.json.gz.rl-merge-{where}-1.999999.tmp",  # a dead owner, another output
        folder / f".{name}.4242.tmp",  # a plain atomic-write temp: no owner mark
    ]
    for path in keep:
        path.write_text("not the merge's")
    return keep


def test_kill_9_takes_the_workers_and_the_next_merge_sweeps_its_leftovers(
    busy_run: Path, tmp_path: Path
) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "run.json"
    err_path = tmp_path / "stderr"
    with err_path.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rl_trace_observer.cli.main", "merge", str(busy_run), "-o", str(out),
             "--workers", "2"],
            env=clean_env(), stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
        )  # fmt: skip
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not _stitching(out_dir):  # a job's bytes in the output, the others under way
            assert proc.poll() is None, err_path.read_text()
            assert time.monotonic() < deadline, "no worker ever spilled a part"
            workers = [c.pid for c in psutil.Process(proc.pid).children()] or workers
            time.sleep(0.01)
        workers = [c.pid for c in psutil.Process(proc.pid).children()] or workers
        os.kill(proc.pid, signal.SIGKILL)  # the merge only, as the OOM killer does
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert len(workers) == 2
    deadline = time.monotonic() + 5
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [w for w in workers if _alive(w)], "a worker outlived its merge"
    time.sleep(0.5)  # anything a worker could still print
    assert "Traceback" not in err_path.read_text() and "BrokenPipeError" not in err_path.read_text()
    left = [p for p in out_dir.iterdir() if ".rl-merge-" in p.name]
    assert left and not out.exists()
    keep = _look_alikes(out_dir, out.name)
    again = subprocess.run(
        [sys.executable, "-m", "rl_trace_observer.cli.main", "merge", str(busy_run), "-o", str(out)],
        env=clean_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert sorted(p for p in out_dir.iterdir() if p.name.startswith(".")) == sorted(keep)
    assert json.loads(Path(f"{out}.manifest.json").read_text())["counts"]["events_kept"] == FILES * EVENTS


def test_the_sweep_removes_only_what_a_gone_owner_left(tmp_path: Path) -> None:
    """The rule itself, under a shard directory: a dead owner's file goes, and a pid now held by a
    process that started at another time; a living owner's, our own, another namespace's and unmarked
    files stay."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_start = owned._start_ticks(child.pid)
    child.wait()
    where, me = owned._where(), os.getpid()
    part_dir = tmp_path / "step=1" / "host=h"
    part_dir.mkdir(parents=True)
    gone = part_dir / f".part-000001-x.parquet.rl-merge-{where}-{dead_start or 1}.{child.pid}.tmp"
    mine = part_dir / f".part-000002-x.parquet.rl-merge-{where}-{owned._start_ticks(me) + 1}.{me}.tmp"
    reused = part_dir / f".part-000007-x.parquet.rl-merge-{where}-{owned._start_ticks(1) + 1}.1.tmp"
    keep = [
        part_dir / f".part-000003-x.parquet.rl-merge-{where}-{owned._start_ticks(1)}.1.tmp",  # alive
        part_dir / f".part-000004-x.parquet.rl-merge-0badf00d-{dead_start}.{child.pid}.tmp",  # elsewhere
        part_dir / f".part-000005-x.parquet.{child.pid}.tmp",  # unmarked
        part_dir / "part-000006-x.parquet",  # a part
    ]
    for path in (gone, mine, reused, *keep):
        path.write_bytes(b"x")
    removed = owned.sweep(tmp_path, set(), recursive=True)
    assert sorted(removed) == sorted([gone, reused])  # pid 1 lives, but started at another time
    assert all(p.exists() for p in (mine, *keep))  # our own pid is never judged gone
