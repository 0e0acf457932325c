"""Damaged span shards (issue 33, item 13): ``report``, ``sql`` and ``diff`` name the damaged part and
what is wrong in one line, never a traceback; where parts are damaged they answer from the whole ones
and say which are left out (``source.missing_parts``, ``trace.missing_parts``, the diff's
``incomplete``); a damaged shard document is an error naming it.

The shards are built once (the 3-host cluster corpus, 11 parts); each case damages a copy."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rl_trace_observer.merge.options import MergeOptions
from rl_trace_observer.merge.pipeline import merge
from rl_trace_observer.merge.shards.dataset import Shards

from ..cli_run import rl_trace
from ..conftest import need, requires
from ..corpus.cluster_run import build_cluster_run

pa = need("pyarrow")
pytestmark = requires("duckdb")

DOC = "rl-trace-shards.json"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("damaged")
    build_cluster_run(base / "run")
    res = merge([str(base / "run")], str(base / "run.pftrace"), MergeOptions(shards=str(base / "shards")))
    assert res.exit_code == 0
    shards = Shards.open(base / "shards")
    big = max(shards.parts(), key=lambda p: p["rows"])
    return {"base": base, "shards": base / "shards", "part": big, "rows": shards.rows}


def _cut(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


DAMAGE: dict[str, tuple[Callable[[Path, str], None], str]] = {
    "part truncated": (lambda d, part: _cut(d / part), "bytes where the merge wrote"),
    "part empty": (lambda d, part: (d / part).write_bytes(b""), "empty (0 bytes"),
    "part deleted": (lambda d, part: (d / part).unlink(), "missing (deleted"),
    "part garbled footer": (
        lambda d, part: (d / part).write_bytes((d / part).read_bytes()[:-12] + b"\0" * 12),
        "not a readable Parquet file",
    ),
    "document cut": (lambda d, part: _cut(d / DOC), "shard document is cut short"),
    "document empty": (lambda d, part: (d / DOC).write_bytes(b""), "shard document is empty"),
}
COMMANDS = {
    "report": lambda d, ref, tmp: ["report", str(d), "-q", "--json", str(tmp / "r.json")],
    "sql": lambda d, ref, tmp: ["sql", str(d), "SELECT count(*) FROM spans", "--json"],
    "sql steps": lambda d, ref, tmp: ["sql", str(d), "SELECT count(*) FROM steps", "--json"],
    "diff": lambda d, ref, tmp: ["diff", str(ref), str(d), "--json", str(tmp / "d.json")],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_shards_name_the_part_and_answer_from_the_whole_ones(
    built: dict[str, Any], tmp_path: Path, damage: str, command: str
) -> None:
    copy = tmp_path / "shards"
    shutil.copytree(built["shards"], copy)
    part = built["part"]["path"]
    hurt, said = DAMAGE[damage]
    hurt(copy, part)
    proc = rl_trace(*COMMANDS[command](copy, built["shards"], tmp_path))
    assert "Traceback" not in proc.stderr and "Aborted" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if said in ln]
    assert len(lines) == 1, proc.stderr
    if damage.startswith("document"):  # its parts cannot be told from leftovers: an error naming it
        assert proc.returncode == 1 and lines[0].startswith("error: ") and str(copy / DOC) in lines[0]
        return
    assert proc.returncode == 0, proc.stderr
    assert part in lines[0] and "1 of 11 span shard parts left out" in lines[0]
    whole = built["rows"] - built["part"]["rows"]
    if command == "report":
        source = json.loads((tmp_path / "r.json").read_text())["source"]
        assert source["missing_parts"] == [{"path": part, "why": source["missing_parts"][0]["why"]}]
        assert said in source["missing_parts"][0]["why"] and source["events"] == whole
    elif command == "sql":
        assert json.loads(proc.stdout) == [{"count_star()": whole}]
    elif command == "diff":
        assert json.loads((tmp_path / "d.json").read_text())["incomplete"] == [
            lines[0].removeprefix("warning: ")
        ]


def test_a_pftrace_reported_through_its_damaged_shards_says_so(built: dict[str, Any], tmp_path: Path) -> None:
    (built["shards"] / built["part"]["path"]).rename(tmp_path / "moved.parquet")
    try:
        proc = rl_trace("report", str(built["base"] / "run.pftrace"), "-q")
    finally:
        (tmp_path / "moved.parquet").rename(built["shards"] / built["part"]["path"])
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    assert f"1 of 11 span shard parts left out, {built['part']['path']}: missing" in proc.stderr


def test_no_whole_part_is_an_error_naming_one(built: dict[str, Any], tmp_path: Path) -> None:
    copy = tmp_path / "shards"
    shutil.copytree(built["shards"], copy)
    for p in Shards.open(copy).parts():
        (copy / p["path"]).write_bytes(b"")
    for args in (["report", str(copy), "-q"], ["sql", str(copy), "SELECT 1"]):
        proc = rl_trace(*args)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        assert "no listed part is whole" in proc.stderr and proc.stderr.startswith("error: ")
