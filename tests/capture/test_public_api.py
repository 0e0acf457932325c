"""The library's public API from one short path: ``rl_trace_observer.merge(inputs, output, options)``
and ``rl_trace_observer.report(...)``, loaded on first use (importing the package loads neither)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import rl_trace_observer as rto
from rl_trace_observer import api

from ..conftest import clean_env, run_python
from ..corpus.cluster_run import build_cluster_run


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_merge_and_report_from_the_package_root(tmp_path: Path) -> None:
    run = build_cluster_run(tmp_path / "nodes")
    out = tmp_path / "run.json.gz"
    res = rto.merge([str(tmp_path / "nodes")], str(out), rto.MergeOptions(workers=0))
    assert res.exit_code == 0 and res.usable, res.problems
    again = api.merge([str(tmp_path / "nodes")], str(tmp_path / "again.json.gz"), api.MergeOptions(workers=0))
    assert _sha(out) == _sha(Path(again.output))  # one merge, whichever door
    summary = rto.report(out, json_path=tmp_path / "report.json")
    assert [s["step"] for s in summary["steps"]] == sorted(run["truth"]["steps"])
    assert json.loads((tmp_path / "report.json").read_text())["schema"] == summary["schema"]


def test_importing_the_package_loads_no_merger_and_the_names_come_on_first_use() -> None:
    code = """
        import json, sys
        import rl_trace_observer as rto
        before = sorted(m for m in sys.modules if m.startswith("rl_trace_observer"))
        options = rto.MergeOptions
        print(json.dumps({"before": before, "options": options.__module__, "callable": callable(rto.merge),
                          "report": rto.report.__module__, "dir": "report" in dir(rto)}))
    """
    got = json.loads(run_python(code, clean_env()).stdout)
    assert got == {
        "before": ["rl_trace_observer"],
        "options": "rl_trace_observer.merge.options",
        "callable": True,
        "report": "rl_trace_observer.api",
        "dir": True,
    }


def test_one_merge_function_whichever_door() -> None:
    """``rto.merge(...)``, ``api.merge`` and ``rl_trace_observer.merge.merge`` are one function."""
    import rl_trace_observer.merge as merge_package
    from rl_trace_observer.merge.pipeline import local

    assert api.merge is local.merge and merge_package.merge is local.merge
    assert api.merge_steps is local.merge_steps


def test_merge_as_the_first_name_asked_of_the_package() -> None:
    """``rto.merge`` before anything else is imported: once a RecursionError."""
    code = """
        import rl_trace_observer as rto
        print(callable(rto.merge), rto.merge.__name__)
    """
    assert run_python(code, clean_env()).stdout.split() == ["True", "rl_trace_observer.merge"]
