"""Every subcommand against outputs it cannot write: one stderr line naming the path, exit 1, no
traceback, nothing half-written; a missing input is exit 2 everywhere (issue 29, items 2 and 6).

Unwritable places that hold even for root: a path under ``/proc`` (no file can be created there) and
a path whose parent is a regular file. Each command runs in a fresh interpreter, as a user runs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rl_trace_observer.cli.errors import os_error_line, user_path

from ..cli_run import rl_trace
from ..conftest import need_all
from ..corpus.cluster_run import build_cluster_run

# The commands that write nothing but stdout; every other one has unwritable-output cases below.
NO_OUTPUT_OPTIONS = {"config", "view"}


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    need_all("pyarrow", "duckdb")  # the cases write span shards and run rl-trace sql on them
    base = tmp_path_factory.mktemp("cli-errors")
    build_cluster_run(base / "run", kernels=4)
    shards = base / "shards"
    proc = rl_trace("merge", str(base / "run"), "-o", str(base / "run.pftrace"), "--shards", str(shards))
    assert proc.returncode == 0, proc.stderr
    proc = rl_trace("report", str(shards), "-q", "--json", str(base / "report.json"))
    assert proc.returncode == 0, proc.stderr
    blocker = base / "a-file"
    blocker.write_text("not a directory\n")
    return {
        "base": base,
        "run": base / "run",
        "shards": shards,
        "report": base / "report.json",
        "file": blocker,
    }


def _cases(m: dict[str, Path]) -> list[tuple[str, list[str], str]]:
    """(command, argv, the unwritable path the error must name)."""
    run, shards, report = str(m["run"]), str(m["shards"]), str(m["report"])
    cases: list[tuple[str, list[str], str]] = []
    for bad in ("/proc/rl-trace-test.out", str(m["file"] / "sub" / "x.out"), "/proc/rl-trace-test/x.out"):
        cases += [
            ("merge", ["merge", run, "-o", bad + ".pftrace"], bad + ".pftrace"),
            ("merge", ["merge", run, "-o", str(m["base"] / "ok.json"), "--manifest", bad], bad),
            ("merge", ["merge", run, "-o", str(m["base"] / "ok2.json"), "--shards", bad], bad),
            ("merge", ["merge", shards, "--step", "1", "-o", bad + ".json.gz"], bad + ".json.gz"),
            ("merge", ["merge", shards, "--split-steps", "-o", bad + ".json.gz"], bad + ".json.gz"),
            ("report", ["report", shards, "-q", "--html", bad], bad),
            ("report", ["report", shards, "-q", "--json", bad], bad),
            ("report", ["report", shards, "-q", "--critical-path", bad + ".json.gz"], bad + ".json.gz"),
            ("sql", ["sql", shards, "SELECT 1 AS x", "--csv", "-o", bad], bad),
            ("diff", ["diff", report, report, "-q", "--html", bad], bad),
            ("diff", ["diff", report, report, "-q", "--json", bad], bad),
            ("demo", ["demo", "--out", bad], bad),
            ("collect", ["collect", "--to", bad], bad),
            ("watch", ["watch", run, "--out", bad, "--once"], bad),
        ]
    return cases


def _one_error_line(stderr: str, path: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and path in lines[0], stderr


def test_every_subcommand_says_one_line_when_it_cannot_write(
    made: dict[str, Path], capfd: pytest.CaptureFixture[str]
) -> None:
    from rl_trace_observer.cli.main import COMMAND_MODULES, _load_commands, app, main

    _load_commands()
    import typer.main

    commands = set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    assert len(commands) == len(COMMAND_MODULES)
    cases = _cases(made)
    assert {c for c, _, _ in cases} | NO_OUTPUT_OPTIONS == commands, "a subcommand without a case"
    before = sorted(p.name for p in made["base"].iterdir())
    for _, argv, path in cases:  # in this interpreter (fast); the subprocess tests below run the CLI whole
        capfd.readouterr()
        code = main(argv)
        err = capfd.readouterr().err
        assert code == 1, (argv, err)
        _one_error_line(err, path)
    assert sorted(p.name for p in made["base"].iterdir()) == before  # nothing written, nothing half


def test_a_failure_after_the_checks_is_one_line_naming_the_users_path(made: dict[str, Path]) -> None:
    """The output's directory is writable, so the up-front check passes, but the name is too long for
    the filesystem: the write fails in the middle of the command (the atomic writer's temp file)."""
    long = made["base"] / ("q" * 300 + ".csv")
    proc = rl_trace("sql", str(made["shards"]), "SELECT 1 AS x", "--csv", "-o", str(long))
    assert proc.returncode == 1
    _one_error_line(proc.stderr, str(long))


def test_the_user_path_replaces_the_atomic_temp_file() -> None:
    assert user_path("/ro/.q.csv.12345.tmp") == "/ro/q.csv"
    assert user_path("/ro/q.csv") == "/ro/q.csv"
    err = OSError(30, "Read-only file system", "/ro/.v.json.gz.99.tmp")
    assert os_error_line(err) == "error: cannot write /ro/v.json.gz: Read-only file system"


@pytest.mark.parametrize(
    "argv",
    [
        ["merge", "/nonexistent/in", "-o", "/tmp/never.json"],
        ["report", "/nonexistent/in"],
        ["sql", "/nonexistent/in", "SELECT 1"],
        ["diff", "/nonexistent/a", "/nonexistent/b"],
        ["view", "/nonexistent/in.pftrace"],
        ["watch", "/nonexistent/in", "--once"],
    ],
)
def test_a_missing_input_is_a_usage_error_everywhere(argv: list[str]) -> None:
    proc = rl_trace(*argv, timeout=60)
    assert proc.returncode == 2, proc.stderr
    _one_error_line(proc.stderr, "/nonexistent/")


def test_config_writes_nothing_and_never_fails() -> None:
    proc: Any = rl_trace("config", timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
