"""Shared test helpers. Fresh interpreters (``run_python``) give RL-Insight and VERL clean global state."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rl_trace_observer.testing.real_traces import REAL_TRACES_REL
from rl_trace_observer.testing.real_traces import real_traces_dir as _real_traces_dir

ROOT = Path(__file__).resolve().parents[1]
DEMO_STEPS = 3


def real_traces_dir() -> Path:
    """The real public traces of this checkout (:mod:`rl_trace_observer.testing.real_traces`)."""
    return _real_traces_dir(ROOT)


def real_trace_sets() -> list[str]:
    real = real_traces_dir()
    return sorted(p.name for p in real.iterdir() if p.is_dir()) if real.is_dir() else []


os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # Ray 2.60 enables token auth by default
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# No metric sampler process per test that turns capture on; the tests of the sampler turn it on.
os.environ.setdefault("RL_TRACE_METRICS", "0")
# The metric sampler's node folders (locks, member lists, targets) of this session's runs: in a folder
# of the session's own, removed at its end, never in the shared <temp dir>/rl-trace-observer-<uid>.
# A process that imports this module with the variable set (a Ray worker or a spawned child that
# unpickles a test's function imports tests.conftest too) uses that folder and creates none.
_OWN_NODE_DIR = not os.environ.get("RL_TRACE_METRICS_NODE_DIR")
if _OWN_NODE_DIR:
    os.environ["RL_TRACE_METRICS_NODE_DIR"] = tempfile.mkdtemp(prefix="rl-trace-test-nodes-")
_NODE_DIR = os.environ["RL_TRACE_METRICS_NODE_DIR"]


# Nor does this process ever join one: in-process tests configure recorders from dicts (where
# RL_TRACE_METRICS defaults to 1), and a joined pytest would keep a sampler alive all session long.
# Tests of the sampler run their members in subprocesses.
from rl_trace_observer.capture.sampler import node as _sampler_node  # noqa: E402

_sampler_node.stay_out()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _OWN_NODE_DIR:  # only the folder this process made; a sampler still running sees it go, leaves
        shutil.rmtree(_NODE_DIR, ignore_errors=True)


EXTRAS = {  # what a light install (the README's quick check: '.[test,viztracer]') lacks, and its extra
    "ray": "ray",
    "rl_insight": "rl-insight",
    "verl": "verl",
    "torch": "demo",
    "numpy": "demo",
    "pyarrow": "shards",
    "duckdb": "sql",
    "prometheus_client": "metrics",  # the metric sampler's Prometheus text parser (and test servers)
    "pynvml": "metrics",  # nvidia-ml-py
    "vllm": "vllm",
}
FULL_INSTALL = "scripts/bootstrap.sh installs every extra"


def need(module: str) -> Any:
    """``module``, or a skip naming the extra that brings it (in CI the skip fails: see below)."""
    top = module.split(".")[0]
    extra = EXTRAS[top]
    return pytest.importorskip(module, reason=f"needs {top}: the '{extra}' extra ({FULL_INSTALL})")


def need_all(*modules: str) -> None:
    """Skip unless every module imports (for a test that starts a child needing them)."""
    for module in modules:
        need(module)


def requires(*modules: str) -> pytest.MarkDecorator:
    """A skipif mark naming the first missing module's extra (modules looked up, not imported)."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    extra = EXTRAS[missing[0]] if missing else ""
    reason = f"needs {missing[0]}: the '{extra}' extra ({FULL_INSTALL})" if missing else ""
    return pytest.mark.skipif(bool(missing), reason=reason)


def clean_env(**extra: str) -> dict[str, str]:
    """The current environment without any RL_TRACE_*/RL_INSIGHT_*/VERL_* leaking between tests."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RL_TRACE_", "RL_INSIGHT_", "VERL_")) and k != "PYTHONPATH"
    }
    env["RAY_AUTH_MODE"] = "disabled"
    env["RL_TRACE_METRICS"] = "0"  # no sampler process unless a test asks for one
    env["RL_TRACE_METRICS_NODE_DIR"] = _NODE_DIR
    env.update(extra)
    return env


def run_python(
    code: str, env: dict[str, str], timeout: float = 240, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter; fail the test with its output when it exits non-zero."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )
    if proc.returncode != 0:
        raise AssertionError(f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def merge_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``rl-trace merge ARGS`` in a fresh interpreter, as a user runs it (exit code, stdout, stderr)."""
    return subprocess.run(
        [sys.executable, "-m", "rl_trace_observer.cli.main", "merge", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    """A private real Perfetto engine (wasm trace processor in headless Chromium) for a test module;
    skipped with its reason where Chromium is missing (a failure in CI, see below)."""
    from rl_trace_observer.testing.perfetto import engine as pe

    reason = pe.unavailable_reason()
    if reason:
        pytest.skip(reason)
    with pe.Engine() as eng:
        yield eng


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One `rl-trace demo` run (real Ray, torch.profiler, VizTracer, RL-Insight, collect, merge, report),
    shared by every test module that reads its outputs."""
    need_all("ray", "torch", "rl_insight")  # what `rl-trace demo` runs on (the 'demo' extra)
    out = tmp_path_factory.mktemp("demo") / "out"
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rl_trace_observer.cli.main",
            "demo",
            "--out",
            str(out),
            "--steps",
            str(DEMO_STEPS),
        ],
        env=clean_env(RAY_USAGE_STATS_ENABLED="0"),
        capture_output=True,
        text=True,
        timeout=400,
        cwd=ROOT,
    )
    seconds = time.monotonic() - t0
    assert proc.returncode == 0, f"demo failed:\n{proc.stdout}\n{proc.stderr}"
    print(f"demo took {seconds:.1f} s\n{proc.stderr}")
    return {"out": out, "stdout": proc.stdout, "stderr": proc.stderr, "seconds": seconds}


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    d = tmp_path / "trace-out"
    d.mkdir()
    return d


@pytest.fixture
def fresh_recorder() -> Iterator[None]:
    """Reset the process recorder before and after a test that configures one."""
    from rl_trace_observer.capture import reset

    reset()
    yield
    reset()


CI_OFF = frozenset({"", "0", "false", "no", "off"})


def in_ci() -> bool:
    """``CI`` is set to something other than off (``CI=false``, ``CI=0`` and an empty value are off)."""
    return os.environ.get("CI", "").strip().lower() not in CI_OFF


def _ci_failure(longrepr: object) -> str:
    return f"skipped in CI (every dependency must be present): {longrepr}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """In CI every dependency is installed (scripts/bootstrap.sh): a skip there hides a broken set-up,
    so it fails instead. Locally, a missing browser or framework still skips with its reason."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and in_ci() and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = _ci_failure(report.longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):  # type: ignore[no-untyped-def]
    """The same for a whole module skipped while it is collected (``pytest.importorskip`` at module
    level, ``pytest.skip(allow_module_level=True)``): in CI that is a collection error, not a skip."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and in_ci():
        report.outcome = "failed"
        report.longrepr = _ci_failure(report.longrepr)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say plainly what a run without the real traces did not check (in CI their tests fail instead)."""
    if real_trace_sets():
        return
    terminalreporter.write_line(
        f"NOT CHECKED: no real traces at {real_traces_dir()} ({REAL_TRACES_REL} beside the repository): "
        "merging real public Kineto/HTA/MTIA/SGLang/VizTracer files (tests/merge/test_real_traces.py) "
        "and the "
        "compiled encoder on them (tests/merge/test_native_twins.py) were skipped",
        yellow=True,
        bold=True,
    )
