"""The smaller things a new user tripped over (issue 29, item 6), each as the user met it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ..cli_run import rl_trace
from ..conftest import clean_env, need_all
from ..corpus.cluster_run import build_cluster_run


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
    assert manifest["counts"]["events_kept"] == first_manifest["counts"]["events_kept"] > 0
    assert {str(work / "other.pftrace"), str(work / "merged.json.gz")} <= set(manifest["ignored"])
    # named explicitly as an input, the output is still refused
    named = rl_trace("merge", str(work / "merged.json.gz"), "-o", str(work / "merged.json.gz"))
    assert named.returncode == 2 and "is one of the inputs" in named.stderr


def test_report_on_an_empty_directory_names_no_deleted_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = rl_trace("report", str(empty))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert "no trace files among the inputs" in proc.stderr
    assert "rl-trace-report-" not in proc.stderr  # the temporary folder, already removed


def test_report_reads_what_a_cut_short_trace_holds(tmp_path: Path) -> None:
    from ..corpus.cluster_run import _kineto

    whole = tmp_path / "trace.json.gz"
    _kineto(
        whole,
        77,
        1_700_000_000 * 10**9,
        [("actor_update", 1_700_000_000 * 10**9, 1_700_000_001 * 10**9)],
        800,
    )
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size * 2 // 3])
    proc = rl_trace("report", str(cut), "-q", "--json", str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stderr
    assert "warning: " in proc.stderr and "reported on what the merge kept" in proc.stderr
    summary = json.loads((tmp_path / "r.json").read_text())
    assert summary["source"]["read_error"] and summary["source"]["events"] > 100
    assert any(p["kind"] == "incomplete" for p in summary["artifacts"]["problems"])


def test_view_refuses_a_file_that_is_not_a_trace(run: Path, tmp_path: Path) -> None:
    from rl_trace_observer.cli.view_cmd import not_a_trace

    junk = tmp_path / "random.bin"
    junk.write_bytes(bytes(range(1, 256)) * 20)
    proc = rl_trace("view", str(junk), timeout=60)
    assert proc.returncode == 1 and "not a trace file" in proc.stderr and proc.stderr.count("\n") == 1
    for fmt in ("pftrace", "pftrace.gz", "json.gz", "json"):  # every output format still opens
        out = tmp_path / f"m.{fmt}"
        assert rl_trace("merge", str(run), "-o", str(out)).returncode == 0
        assert not_a_trace(out) is None, fmt


def test_config_shows_the_variables_as_the_user_spells_them() -> None:
    from rl_trace_observer import config as config_mod

    proc = subprocess.run(
        [sys.executable, "-m", "rl_trace_observer.cli.main", "config"],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(RL_TRACE_VIZTRACER="1"),
    )
    doc = json.loads(proc.stdout)
    assert set(doc) == {s.name for s in config_mod.SETTINGS} and "output_dir" not in doc
    assert doc["RL_TRACE_VIZTRACER"] == {"value": True, "environment": "1", "default": "0"}


def test_sql_needs_no_pandas_reads_time_zones_and_takes_the_format_from_the_suffix(
    run: Path, tmp_path: Path
) -> None:
    need_all("duckdb", "pyarrow")
    shards = tmp_path / "shards"
    assert (
        rl_trace("merge", str(run), "-o", str(tmp_path / "m.json.gz"), "--shards", str(shards)).returncode
        == 0
    )
    code = (
        "import sys; from rl_trace_observer.analysis.query.sql_format import query; "
        f"r = query({str(shards)!r}, 'SELECT 1 AS x'); assert r.rows == [(1,)]; "
        "print('pandas' in sys.modules)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=clean_env()
    )
    assert proc.stdout.strip() == "False", proc.stderr  # binding Python values made DuckDB import it
    tz = rl_trace("sql", str(shards), "SELECT to_timestamp(1) AS t", "--json")
    assert tz.returncode == 0 and json.loads(tz.stdout) == [{"t": "1970-01-01 00:00:01+00:00"}], tz.stderr
    out = tmp_path / "q.csv"
    proc = rl_trace("sql", str(shards), "SELECT 1 AS x", "-o", str(out))
    assert proc.returncode == 0 and out.read_text() == "x\n1\n", proc.stderr


def test_sql_on_a_json_gz_without_shards_says_it_converted(run: Path, tmp_path: Path) -> None:
    need_all("duckdb", "pyarrow")
    merged = tmp_path / "m.json.gz"
    assert rl_trace("merge", str(run), "-o", str(merged)).returncode == 0
    proc = rl_trace("sql", str(merged), "SELECT count(*) AS n FROM spans", "--csv")
    assert proc.returncode == 0
    notes = [line for line in proc.stderr.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and "--shards" in notes[0] and "converted" in notes[0]


def test_problems_of_one_kind_are_one_line_in_the_report(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from rl_trace_observer.analysis.report import html, terminal

    problems = [
        {"kind": "unlinked", "path": f"/r/worker{i}.json.gz", "detail": f"no process record for pid {i}"}
        for i in range(8)
    ] + [{"kind": "incomplete", "path": "/r/x.json.gz", "detail": "cut"}]
    torch = {"files": 9, "complete": 8, "incomplete": 1, "skipped": 0}
    arts = {"status": "partial", "by_kind": {"torch": torch}, "problems": problems, "problem_count": 9}
    buf = io.StringIO()
    terminal._provenance(Console(file=buf, width=300), {"clock": {}, "artifacts": arts})
    lines = [line for line in buf.getvalue().splitlines() if line.startswith("  ")]
    assert len(lines) == 2 and "(+7 more like it)" in lines[0] and "worker0" in lines[0]
    host = {"host": "h", "method": "reference", "applied": True, "offset_ns": 0, "uncertainty_ns": 0}
    page = html._provenance_section({"clock": {"hosts": [{**host, "drift_ppm": None}]}, "artifacts": arts})
    assert page.count("<li class=warn>") == 2 and "7 more like it" in page
    assert ">True<" not in page and ">yes<" in page


def test_long_lane_labels_are_shortened_not_clipped() -> None:
    from rl_trace_observer.analysis.report import svg

    label = svg._label(10, "unknown · thread 59811 (python3)")
    shown = label.rsplit("</title>", 1)[1].removesuffix("</text>")
    assert len(shown) <= svg.LABEL_CHARS and shown.startswith("unknown") and shown.endswith("(python3)")
    assert "<title>unknown · thread 59811 (python3)</title>" in label
