"""Hostile names and hostile queries at the command line (issue 33).

Item 12: names from traces never drive the terminal: ``rl-trace report`` and ``rl-trace sql`` (table,
``--json``; ``--csv`` to a terminal) print ESC, NUL, BEL, CR and bidi overrides escaped; the escaping
helper is checked on its own, with Hypothesis, too. Item 14: ``rl-trace sql`` is read-only over the
run unless ``--allow-file-access``: each way a query could read or write a file fails with one line,
exit 1, and leaves every file as it was; normal queries and the report's tables still work."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl_trace_observer.common.visible import visible, visible_json, visible_tree

from ..cli_run import rl_trace
from ..conftest import need_all

S, MS = 1_000_000_000, 1_000_000
# ESC[31m (red), NUL, BEL, CR (overwrites the line), U+202E (shows what follows reversed), CSI (C1)
HOSTILE = "\x1b[31mred\x00nul\x07bel\rcr\u202eevil\x9b2J"
RAW = ["\x1b", "\x00", "\x07", "\r", "\u202e", "\x9b"]
SHOWN = "\\x1b[31mred\\x00nul\\x07bel\\rcr\\u202eevil\\x9b2J"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A run whose role, lane, span and metric names carry the hostile characters, merged with shards."""
    need_all("pyarrow", "duckdb")
    from rl_trace_observer.capture import Recorder
    from rl_trace_observer.config import Config

    from ..corpus.recorded import FixedClock

    base = tmp_path_factory.mktemp("hostile")
    run = base / "run"
    run.mkdir()
    t0 = (time.time_ns() - 600 * S) // S * S
    clock = FixedClock(t0)
    rec = Recorder(
        Config(output_dir=run.resolve(), run_id="run-hostile", role="trainer"), clock, host="h", pid=1
    )
    for step in (1, 2):
        lo, hi = t0 + step * S, t0 + step * S + 500 * MS
        rec.span("global_step", lo, hi, lane="global_step", cat="verl", args={"step": step})
        rec.span("actor_update" + HOSTILE, lo + 10 * MS, hi - 10 * MS, lane="rank" + HOSTILE)
        rec.counter("loss" + HOSTILE, 0.5, wall_ns=hi - MS)
    rec.close()
    proc = rl_trace("merge", str(run), "-o", str(base / "run.json.gz"), "--shards", str(base / "shards"))
    assert proc.returncode == 0, proc.stderr
    return {"base": base, "trace": base / "run.json.gz", "shards": base / "shards"}


def _clean(out: str) -> None:
    for raw in RAW:
        assert raw not in out, f"{raw!r} reached the terminal"


def test_report_prints_names_escaped(hostile: dict[str, Path]) -> None:
    for src in (hostile["trace"], hostile["shards"]):
        proc = rl_trace("report", str(src))
        assert proc.returncode == 0, proc.stderr
        _clean(proc.stdout)
        _clean(proc.stderr)
        assert SHOWN in proc.stdout.replace("\n", "") or "actor_update\\x1b[31m" in proc.stdout


def test_sql_table_csv_and_json_print_names_escaped(hostile: dict[str, Path]) -> None:
    query = "SELECT DISTINCT name, lane FROM spans WHERE name LIKE 'actor_update%'"
    proc = rl_trace("sql", str(hostile["shards"]), query)
    assert proc.returncode == 0, proc.stderr
    _clean(proc.stdout)
    assert "actor_update\\x1b[31m" in proc.stdout
    # JSON: the same values (a parser gets the raw names back), none of them raw on the terminal
    proc = rl_trace("sql", str(hostile["shards"]), query, "--json")
    assert proc.returncode == 0, proc.stderr
    _clean(proc.stdout)
    assert json.loads(proc.stdout)[0]["name"] == "actor_update" + HOSTILE
    # CSV to a pipe or a file is data, byte for byte; to a terminal it is escaped (unit test below)
    out = hostile["base"] / "names.csv"
    proc = rl_trace("sql", str(hostile["shards"]), query, "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert ("actor_update" + HOSTILE).encode() in out.read_bytes()


def test_a_failing_query_echoing_a_name_is_escaped(hostile: dict[str, Path]) -> None:
    no_nul = HOSTILE.replace("\x00", "")  # an argument cannot hold NUL
    proc = rl_trace("sql", str(hostile["shards"]), f'SELECT "{no_nul}" FROM spans')
    assert proc.returncode == 1
    assert "\\x1b[31mred" in proc.stderr  # DuckDB's message names the column
    _clean(proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1


def test_csv_to_a_terminal_is_escaped() -> None:
    from rl_trace_observer.analysis.query.sql_format import Result, to_csv

    result = Result(["name"], [("a" + HOSTILE,)])
    assert "a" + HOSTILE in to_csv(result)
    shown = to_csv(result, escape=True)
    assert "a" + SHOWN in shown
    for raw in RAW:
        assert raw not in shown


def test_escapes_by_example() -> None:
    assert visible(HOSTILE) == SHOWN
    assert visible("plain name/with µ and 中文\tand\nlines") == "plain name/with µ and 中文\tand\nlines"
    assert visible("\x7f\u2066x\u2069\u200f") == "\\x7f\\u2066x\\u2069\\u200f"
    tree: Any = {"k\x1b": ["\x07", ("\r", 3)], "n": None}
    assert visible_tree(tree) == {"k\\x1b": ["\\x07", ("\\r", 3)], "n": None}
    data = json.dumps({"a": "x\u202e\x9by"}, ensure_ascii=False).encode()
    assert json.loads(visible_json(data)) == {"a": "x\u202e\x9by"}
    assert "\u202e".encode() not in visible_json(data)


TERMINAL_CONTROLS = [chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))]


@given(st.text())
def test_visible_leaves_no_control_and_changes_nothing_else(text: str) -> None:
    shown = visible(text)
    for ch in shown:
        assert ch in "\t\n" or ch not in TERMINAL_CONTROLS
        assert ch not in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
    if not any(ch in TERMINAL_CONTROLS or "\u2000" <= ch <= "\u2070" or ch == "\u061c" for ch in text):
        assert shown == text
    assert visible(shown) == shown  # escaping is idempotent: its output is plain printable text


@given(
    st.recursive(
        st.none() | st.text() | st.integers(-(2**63), 2**63 - 1),
        lambda c: st.lists(c) | st.dictionaries(st.text(), c),
    )
)
def test_visible_json_is_the_same_json_value(value: Any) -> None:
    import orjson

    data = orjson.dumps(value)
    assert orjson.loads(visible_json(data)) == value
    assert all(raw.encode() not in visible_json(data) for raw in ("\u202e", "\x9b", "\x7f"))


# ---------------------------------------------------------------- rl-trace sql is read-only (item 14)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _attacks(h: dict[str, Path]) -> list[tuple[str, str]]:
    base, shards = h["base"], h["shards"]
    part = next(shards.rglob("*.parquet"))
    doc = next(p for p in shards.iterdir() if p.is_file() and p.suffix == ".json")
    secret = h["secret"]
    return [
        ("copy to a new file", f"COPY (SELECT 1 AS a) TO '{base}/stolen.csv'"),
        ("copy over a span file", f"COPY (SELECT 2 AS a) TO '{part}' (FORMAT parquet, USE_TMP_FILE false)"),
        ("copy over the shard document", f"COPY (SELECT 1 AS a) TO '{doc}' (FORMAT csv, USE_TMP_FILE false)"),
        ("a select, then a copy", f"SELECT 1; COPY (SELECT 1 AS a) TO '{base}/second.csv'"),
        ("prepare a copy", f"PREPARE p AS COPY (SELECT 1 AS a) TO '{base}/prepared.csv'; EXECUTE p"),
        ("export the database", f"EXPORT DATABASE '{base}/exported'"),
        ("attach a new database", f"ATTACH '{base}/new.duckdb' AS n"),
        ("attach a span file", f"ATTACH '{part}' AS p"),
        ("read /etc/passwd", "SELECT * FROM read_csv('/etc/passwd')"),
        ("read a 0600 file", f"SELECT * FROM read_text('{secret}')"),
        ("list /etc", "SELECT * FROM glob('/etc/*')"),
        ("read parquet elsewhere", f"SELECT * FROM read_parquet('{h['other']}')"),
        ("turn file access back on", "SET enable_external_access = true"),
        ("unlock the settings", "RESET lock_configuration"),
        ("install an extension", "INSTALL httpfs"),
        ("load an extension", "LOAD httpfs"),
    ]


@pytest.fixture(scope="module")
def attackable(hostile: dict[str, Path]) -> dict[str, Path]:
    import duckdb

    base = hostile["base"]
    secret = base / "secret.txt"
    secret.write_text("the-secret-value\n")
    secret.chmod(0o600)
    other = base / "other.parquet"
    duckdb.connect().execute(f"COPY (SELECT 'not the run' AS x) TO '{other}'")
    return {**hostile, "secret": secret, "other": other}


def test_sql_refuses_every_file_access_with_one_line_and_touches_nothing(attackable: dict[str, Path]) -> None:
    h = attackable
    before = _files(h["base"])
    for what, query in _attacks(h):
        proc = rl_trace("sql", str(h["shards"]), query)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1, (what, proc.stdout, proc.stderr)
        assert len(lines) == 1 and lines[0].startswith("error: "), (what, proc.stderr)
        assert "--allow-file-access" in lines[0] or "locked" in lines[0], (what, lines[0])
        assert "the-secret-value" not in proc.stdout + proc.stderr and "root:" not in proc.stdout, what
        assert _files(h["base"]) == before, f"{what} changed the files"


def test_sql_normal_queries_and_the_report_tables_still_work(attackable: dict[str, Path]) -> None:
    h = attackable
    for query, want in (
        ("SELECT count(*) AS n FROM spans", "n"),
        ("SELECT step, dur_ns FROM steps ORDER BY step", "step"),
        ("SELECT role, stage, count(*) AS c FROM stage_spans GROUP BY ALL", "role,stage,c"),
        ("SELECT metric, count(*) AS c FROM samples GROUP BY ALL", "metric"),
        ("SELECT base_ns FROM trace", "base_ns"),
        ("DESCRIBE spans", "column_name"),
        ("EXPLAIN SELECT count(*) FROM spans", "physical_plan"),
        ("CREATE TEMP VIEW v AS SELECT name FROM spans; SELECT count(*) AS viewed FROM v", "viewed"),
        ("PIVOT (SELECT ph, name FROM spans) ON ph USING count(*)", "name"),
    ):
        proc = rl_trace("sql", str(h["shards"]), query, "--csv")
        assert proc.returncode == 0, (query, proc.stderr)
        assert want in proc.stdout, (query, proc.stdout[:200])
    # the converted .json.gz (no shards) and a run directory (merged into temporary shards) too
    plain = h["base"] / "plain.json.gz"
    assert rl_trace("merge", str(h["base"] / "run"), "-o", str(plain)).returncode == 0
    for source in (plain, h["base"] / "run"):
        proc = rl_trace("sql", str(source), "SELECT count(*) AS n FROM stage_spans", "--csv")
        assert proc.returncode == 0 and int(proc.stdout.split()[1]) > 0, proc.stderr
        proc = rl_trace("sql", str(source), "SELECT * FROM read_csv('/etc/passwd')")
        assert proc.returncode == 1 and "--allow-file-access" in proc.stderr, proc.stderr


def test_allow_file_access_is_the_explicit_way_out(attackable: dict[str, Path]) -> None:
    h = attackable
    target = h["base"] / "allowed-out" / "copied.csv"
    target.parent.mkdir()
    proc = rl_trace("sql", str(h["shards"]), f"COPY (SELECT 7 AS a) TO '{target}'", "--allow-file-access")
    assert proc.returncode == 0, proc.stderr
    assert target.read_text().split() == ["a", "7"]
    proc = rl_trace("sql", str(h["shards"]), "--help")
    assert "--allow-file-access" in proc.stdout and "read-only" in proc.stdout.lower()


def test_sql_select_star_at_80_columns_is_records(hostile: dict[str, Path]) -> None:
    """issue 34, item 5e, as a user runs it: ``COLUMNS=80 rl-trace sql SHARDS 'SELECT * FROM spans'``."""
    import subprocess
    import sys

    from ..conftest import ROOT, clean_env

    query = "SELECT * FROM spans WHERE ph = 'X' ORDER BY ts_ns LIMIT 3"
    proc = subprocess.run(
        [sys.executable, "-m", "rl_trace_observer.cli.main", "sql", str(hostile["shards"]), query],
        capture_output=True,
        text=True,
        timeout=180,
        env=clean_env(COLUMNS="80"),
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(ln.rstrip()) for ln in lines) <= 80
    assert sum(ln.startswith("-[ row ") for ln in lines) == 3
    assert any(ln.split()[:2] == ["name", "global_step"] for ln in lines)
    assert not any(len(ln.strip()) == 1 for ln in lines)


def test_merge_and_report_warnings_name_a_hostile_file_escaped(hostile: dict[str, Path]) -> None:
    """The lines on stderr too: a merge's problem lines and a report's error name files and events."""
    import shutil

    run = hostile["base"] / "run-with-bad-file"
    shutil.copytree(hostile["base"] / "run", run)
    bad = run / "trace\x1b[31m\x07\u202e.json"
    bad.write_text('{"traceEvents": [')  # cut short: a problem line names the file
    proc = rl_trace("merge", str(run), "-o", str(hostile["base"] / "with-bad.json.gz"))
    assert proc.returncode == 0, proc.stderr
    assert "trace\\x1b[31m\\x07\\u202e.json" in proc.stderr, proc.stderr
    _clean(proc.stdout + proc.stderr)
    proc = rl_trace("report", str(bad))
    assert proc.returncode != 0
    _clean(proc.stdout + proc.stderr)
