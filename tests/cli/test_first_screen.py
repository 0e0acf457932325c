"""A new user's first screen: the README says how to run ``rl-trace`` after the set-up, and the demo's
next commands are spelled so that they run from the user's shell (issue 29, item 7)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import ROOT

FIRST_SCREEN_LINES = 60


def test_readme_first_screen_has_the_two_commands_and_how_to_run_rl_trace() -> None:
    head = "\n".join((ROOT / "README.md").read_text().splitlines()[:FIRST_SCREEN_LINES])
    for needed in (
        "bash scripts/demo.sh",
        "bash scripts/test.sh",
        "source .venv/bin/activate",
        ".venv/bin/rl-trace",
        "rl-trace merge ",
    ):
        assert needed in head, needed


def test_readme_links_only_pages_that_exist() -> None:
    import re

    checked = 0
    for page in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
        for target in re.findall(r"\]\(((?:docs/)?[\w.-]+\.md)(?:#[\w-]+)?\)", page.read_text()):
            assert (page.parent / target).is_file(), f"{page.name} links {target}"
            checked += 1
    assert checked >= 10, checked  # the README's links to docs/ pages were found: the loop ran


def test_demo_names_rl_trace_as_the_shell_can_run_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from rl_trace_observer.cli.demo_cmd import rl_trace_command

    exe = Path(sys.executable).parent / "rl-trace"
    if not exe.exists():
        pytest.skip("rl-trace is not installed next to this interpreter")
    monkeypatch.chdir(ROOT)
    # the PATH of a shell that never activated the venv: the command is the script's path
    bare_path = "/usr/local/bin:/usr/bin:/bin"
    cmd, hint = rl_trace_command(bare_path)
    assert cmd != "rl-trace" and Path(cmd).name == "rl-trace" and hint and "activate" in hint
    env = {**os.environ, "PATH": bare_path}
    proc = subprocess.run(
        f"{cmd} --version", shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    # an activated venv: the bare name
    assert rl_trace_command(f"{exe.parent}:{bare_path}") == ("rl-trace", None)
