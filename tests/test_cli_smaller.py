"""The smaller things a new user tripped over (issue 29, item 6), each as the user met it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import ROOT, clean_env
from .corpus.cluster_run import build_cluster_run


def rl_trace(*args: str, timeout: float = 180, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rl_trace_observer.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env(),
        cwd=cwd,
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("smaller")
    build_cluster_run(base / "run", kernels=4)
    return base / "run"


def test_merging_a_directory_into_itself_again_skips_its_own_outputs(run: Path, tmp_path: Path) -> None:
    work = tmp_path / "run"
    shutil.copytree(run, work)
    first = rl_trace("merge", str(work), "-o", str(work / "merged.json.gz"))
    assert first.returncode == 0, first.stderr
    other = rl_trace("merge", str(work), "-o", str(work / "other.pftrace"))
    assert other.returncode == 0, other.stderr
    again = rl_trace("merge", str(work), "-o", str(work / "merged.json.gz"))
    assert again.returncode == 0, again.stderr
    assert "not_a_trace" not in again.stderr  # the earlier .pftrace is ours, not an unknown file
    manifest: dict[str, Any] = json.loads((work / "merged.json.gz.manifest.json").read_text())
    first_manifest = json.loads((tmp_path / "run" / "other.pftrace.manifest.json").read_text())
    assert manifest["counts"]["events_kept"] == first_manifest["counts"]["events_kept"]
    assert {str(work / "other.pftrace"), str(work / "merged.json.gz")} <= set(manifest["ignored"])
    # named explicitly as an input, the output is still refused
    named = rl_trace("merge", str(work / "merged.json.gz"), "-o", str(work / "merged.json.gz"))
    assert named.returncode == 2 and "is one of the inputs" in named.stderr
