"""80-column terminals (issue 29, item 5): every report table, the diff and ``--help`` fit, and what a
row is about (its key column), a verdict and every number stay whole — checked at a fixed width."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from typing import Any

import pytest
from rich.cells import cell_len
from rich.console import Console

from rl_trace_observer.analysis.query import diff, diff_render
from rl_trace_observer.analysis.report import gpu_tables, terminal
from rl_trace_observer.analysis.report.answer_tables import tables as answer_tables
from rl_trace_observer.analysis.report.rollout import rollout_section
from rl_trace_observer.analysis.report.rollout_tables import tables as rollout_tables

from ..conftest import ROOT, clean_env
from ..report.test_gpu import hand  # noqa: F401 (the module fixture: a hand-built trace with kernels)
from ..report.test_report_definitions import summary  # noqa: F401 (the module fixture)
from ..report.test_report_rollout import _trace

WIDTH = 80
NUMBER = re.compile(r"[-+±−]?\d[\d,.]*(?: (?:ns|µs|ms|s))?%?")


def _render(renderable: Any) -> str:
    buf = io.StringIO()
    Console(file=buf, width=WIDTH).print(renderable)
    return buf.getvalue()


def _fits(text: str) -> None:
    wide = [line for line in text.splitlines() if cell_len(line.rstrip()) > WIDTH]
    assert not wide, "\n".join(wide)
    assert "…" not in text  # nothing cut with an ellipsis


def _visible(text: str, cells: list[str]) -> None:
    """Each word of each cell appears intact (a long key may wrap between words, never inside one)."""
    words = set(text.split())
    for cell in cells:
        for word in cell.split():
            assert word in words, f"{word!r} of {cell!r} is cut"


def _whole(text: str, cells: list[str]) -> None:
    """Each cell appears on one line, as is (not wrapped, not cut)."""
    lines = text.splitlines()
    for cell in cells:
        assert any(cell in line for line in lines), f"{cell!r} is cut or wrapped"


@pytest.fixture(scope="module")
def full(summary: dict[str, Any]) -> dict[str, Any]:  # noqa: F811
    spans, windows, training = _trace()
    return {**summary, "rollout": rollout_section(spans, windows, training)}


def test_the_whole_report_fits_80_columns(full: dict[str, Any]) -> None:
    buf = io.StringIO()
    terminal.render(full, Console(file=buf, width=WIDTH))
    _fits(buf.getvalue())


def _numbers_whole(t: Any, text: str) -> None:
    """Every number of a column the narrow table still shows appears on one line, as is."""
    shown = re.search(r"without ([^)]*)\)", " ".join(text.split()))
    left_out = {h.strip() for h in shown.group(1).split(",")} if shown else set()
    for row in t.rows:
        for i, cell in enumerate(row):
            header = t.short.get(i, t.headers[i])
            if i not in t.left and header not in left_out and NUMBER.fullmatch(cell):
                _whole(text, [cell])


def test_every_plain_tables_key_column_and_numbers_stay_whole(full: dict[str, Any]) -> None:
    plain = answer_tables(full) + rollout_tables(full["rollout"])
    assert len(plain) >= 7
    for t in plain:
        text = _render(terminal.plain_table(t, True, WIDTH))
        _fits(text)
        _visible(text, [row[0] for row in t.rows])  # the key column
        _numbers_whole(t, text)


def test_the_gpu_section_fits_80_columns(hand: tuple[Any, dict[str, Any]]) -> None:  # noqa: F811
    """issue 26's tables: whole report and each table at 80 columns; a kernel name longer than the
    key column may get folds onto the next line, whole, never cut with an ellipsis."""
    report = hand[1]
    buf = io.StringIO()
    terminal.render(report, Console(file=buf, width=WIDTH))
    _fits(buf.getvalue())
    plain = gpu_tables.tables(report)
    assert {t.title.split(" (")[0] for t in plain} >= {"GPU per step and device", "GPU per stage",
                                                       "Top kernels"}  # fmt: skip
    assert any(len(row[0]) > terminal.MAX_KEY_WIDTH for t in plain for row in t.rows)  # one folds
    for t in plain:
        text = _render(terminal.plain_table(t, True, WIDTH))
        _fits(text)
        key = _key_column(text, t.short.get(0, t.headers[0]), t.short.get(1, t.headers[1]))
        for row in t.rows:
            assert "".join(row[0].split()) in key, f"{row[0]!r} is cut"
        _numbers_whole(t, text)


def _key_column(text: str, first: str, second: str) -> str:
    """The key column's text, its folded lines joined (it ends where the second header starts)."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(first) and second in line)
    width = lines[at].index(second, len(first))
    return "".join("".join(line[:width].split()) for line in lines[at + 1 :])


def test_the_idle_cause_headers_are_not_cut(full: dict[str, Any]) -> None:
    (idle,) = [t for t in answer_tables(full) if t.title.startswith("Idle time by cause")]
    text = _render(terminal.plain_table(idle, True, WIDTH))
    words = {w for i in range(3, len(idle.headers)) for w in idle.short.get(i, idle.headers[i]).split()}
    for word in words:
        assert re.search(rf"(^|\s){re.escape(word)}(\s|$)", text, re.M), word


def test_diff_keeps_the_series_and_the_verdict_at_80_columns() -> None:
    def run(values: list[int]) -> dict[str, Any]:
        steps = [
            {
                "step": i + 1,
                "dur_ns": v,
                "roles": [{"role": "trainer_with_a_long_role_name", "mean_ns": {"update": v}}],
            }
            for i, v in enumerate(values)
        ]
        return {"source": {"path": "/a/very/long/path/to/a/run/report.json"}, "steps": steps}

    result = diff.compare(
        run([100_000_000, 101_000_000, 99_000_000]), run([150_000_000, 151_000_000, 149_000_000])
    )
    text = _render(diff_render.terminal(result, width=WIDTH))
    _fits(text)
    for row in result["rows"]:
        _whole(text, [row["key"], diff_render.verdict(row)])
    assert "CHANGED" in text


def test_a_one_step_diff_has_no_band_and_a_tie_is_the_same() -> None:
    one = {
        "source": {"path": "a"},
        "steps": [{"step": 1, "dur_ns": 5, "roles": [{"role": "t", "mean_ns": {"update": 7}}]}],
    }
    other = {
        "source": {"path": "b"},
        "steps": [{"step": 1, "dur_ns": 6, "roles": [{"role": "t", "mean_ns": {"update": 7}}]}],
    }
    rows = {r["key"]: r for r in diff.compare(one, other)["rows"]}
    assert diff_render.verdict(rows["step"]) == "no band" and not rows["step"]["noise_known"]
    assert diff_render.verdict(rows["t/update"]) == "same"


def test_skip_first_beyond_the_steps_names_the_option() -> None:
    run = {"source": {"path": "a"}, "steps": [{"step": s, "dur_ns": 5, "roles": []} for s in (1, 2, 3)]}
    with pytest.raises(diff.DiffError, match=r"--skip-first 5 leaves no step of A \(3 step\(s\)\)"):
        diff.compare(run, run, skip_first=5)


@pytest.mark.parametrize(
    "command", ["", "merge", "report", "sql", "diff", "demo", "collect", "view", "config"]
)
def test_help_fits_80_columns_with_every_default(command: str) -> None:
    env = clean_env(COLUMNS=str(WIDTH), TERM="dumb")
    argv = [sys.executable, "-m", "rl_trace_observer.cli.main", *command.split(), "--help"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    _fits(text)
    assert not re.search(r"<(str|int|float|bool|list)", text) and "{" not in text.split("\n")[0]
    if not command:
        assert "Commands:" in text and "..." not in text.split("Commands:")[-1]  # command list whole
    if command == "merge":
        assert len(text.splitlines()) <= 45
        for default in ("[default: auto]", "[default: 1000.0", "(default: 2)", "[default: 600.0"):
            assert default in " ".join(text.split()), default
    if command == "report":
        flat = " ".join(text.split())
        assert "span shards" in flat and ".pftrace" in flat


def _sql_text(columns: list[str], rows: list[tuple[Any, ...]], width: int = WIDTH) -> str:
    from rl_trace_observer.analysis.query.sql_format import Result, to_rich

    buf = io.StringIO()
    Console(file=buf, width=width).print(to_rich(Result(columns, rows), width=width))
    return buf.getvalue()


def test_a_wide_sql_result_prints_records_not_letter_columns() -> None:
    """issue 34, item 5e: ``SELECT * FROM spans`` at 80 columns was one letter per line per column."""
    columns = ["run", "host", "pid", "role", "step", "source", "lane", "name", "category", "ph", "ts_ns"]
    columns += ["dur_ns", "args", "artifact", "trace_pid", "trace_tid"]
    row = ("run-demo-20261205", "worker-host-1", 4242, "actor", 3, "RL-Insight", "rank_0", "actor_update")
    row += (
        "rl_insight",
        "X",
        1796454188010000000,
        480000000,
        '{"step": 3}',
        "rl-insight-h-pid-1.jsonl",
        256,
        7,
    )
    text = _sql_text(columns, [row, row])
    _fits(text)
    assert text.count("-[ row ") == 2 and "one record each" in text
    lines = text.splitlines()
    for column, value in zip(columns, row, strict=True):  # one ``column  value`` line each, whole
        assert any(ln.strip().split(None, 1) == [column, str(value)] for ln in lines), column
    assert not any(len(ln.strip()) == 1 for ln in lines)  # no column one letter wide


def test_a_narrow_sql_result_stays_a_table() -> None:
    text = _sql_text(["step", "wall_ms"], [(1, 12.5), (2, 13.25)])
    _fits(text)
    assert "-[ row" not in text and text.split()[:2] == ["step", "wall_ms"]
    # wide enough for the table on a wide terminal: the same result is a table there
    wide = _sql_text(["a" * 20, "b" * 20, "c" * 20, "d" * 20, "e" * 20], [("x",) * 5], width=200)
    assert "-[ row" not in wide
