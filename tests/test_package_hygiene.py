"""Importing the core pulls in nothing heavy and changes nothing; the README lists every setting."""

from __future__ import annotations

import ast
import json
import re

import pytest

from rl_trace_observer import config as config_mod

from .conftest import ROOT, clean_env, run_python

HEAVY = ("torch", "ray", "verl", "rl_insight", "omegaconf", "pandas", "numpy", "viztracer", "pyarrow")


@pytest.mark.parametrize(
    "module",
    [
        "rl_trace_observer",
        "rl_trace_observer.config",
        "rl_trace_observer.capture",
        "rl_trace_observer.merge",
        "rl_trace_observer.integrations.rl_insight",
    ],
)
def test_core_import_is_light_and_side_effect_free(module: str) -> None:
    code = f"""
        import json, os, sys, logging
        env_before = dict(os.environ)
        handlers_before = list(logging.getLogger().handlers)
        import {module}
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
        print(json.dumps({{"heavy": heavy, "env_changed": dict(os.environ) != env_before,
                          "logging_changed": logging.getLogger().handlers != handlers_before}}))
    """
    result = json.loads(run_python(code, clean_env()).stdout)
    assert result == {"heavy": [], "env_changed": False, "logging_changed": False}


def test_merge_never_imports_frameworks_anywhere() -> None:
    """Static check: no module under merge/ or capture/ names torch, verl or ray in an import."""
    pattern = re.compile(r"^\s*(import|from)\s+(torch|verl|ray|rl_insight)\b", re.M)
    for folder in ("capture", "merge"):
        for path in (ROOT / "src" / "rl_trace_observer" / folder).rglob("*.py"):
            assert not pattern.search(path.read_text()), f"{path} imports a framework"


def test_readme_lists_every_setting() -> None:
    readme = (ROOT / "README.md").read_text()
    assert config_mod.markdown_table() in readme, "regenerate with: rl-trace config --markdown"


def test_config_validation_is_one_line_per_problem() -> None:
    cfg = config_mod.load(
        {
            "RL_TRACE_OUTPUT_DIR": "rel/dir",
            "RL_TRACE_VIZTRACER": "maybe",
            "RL_TRACE_VIZTRACER_MIN_DURATION_US": "-3",
            "RL_TRACE_RECORD_INTERVAL_S": "nan",
            "RL_TRACE_OUTPT_DIR": "/typo",
        }
    )
    assert cfg.output_dir is None and cfg.viztracer is False
    assert cfg.viztracer_min_duration_us == 100.0 and cfg.record_interval_s == 1.0
    assert len(cfg.problems) == 5
    assert all("\n" not in p for p in cfg.problems)
    assert any("RL_TRACE_OUTPT_DIR is not a known setting" in p for p in cfg.problems)


def test_config_reads_valid_values() -> None:
    cfg = config_mod.load(
        {
            "RL_TRACE_OUTPUT_DIR": "/tmp/x",
            "RL_TRACE_FORWARD_TO_RL_INSIGHT": "1",
            "RL_TRACE_VIZTRACER": "true",
            "RL_TRACE_VIZTRACER_MIN_DURATION_US": "250",
            "RL_TRACE_VIZTRACER_ROLES": "e2e, actor",
        }
    )
    assert cfg.capture_enabled and cfg.forward_to_rl_insight and cfg.viztracer
    assert cfg.viztracer_min_duration_us == 250.0 and cfg.viztracer_roles == ("e2e", "actor")
    assert cfg.problems == ()


# ------------------------------------------------------------------------ the shape of the house
SRC = ROOT / "src"
# Who may import whom: a package imports only packages of its own rank or lower (and never its peers
# across a rank: integrations and testing never import merge).
LAYERS = {
    "rl_trace_observer": 0,  # the package root (version) and config: one place for settings
    "config": 0,
    "capture": 1,  # in-process, stdlib + orjson
    "integrations": 2,  # one folder per framework, imported lazily
    "testing": 3,  # for tests and benchmarks: synthetic files, fault harnesses (drive integrations)
    "merge": 3,  # readers → one timeline model → writers
    "analysis": 4,  # report, Perfetto engine harness
    "cluster": 4,  # merge --ray: node tasks (Ray + the merger); peers of analysis, never importing it
    "demo": 5,
    "cli": 6,
}


def _import_graph() -> dict[str, set[str]]:
    """Module → the modules it imports (top level, in functions and under TYPE_CHECKING alike)."""
    files = {}
    for path in (SRC / "rl_trace_observer").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        files[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    graph: dict[str, set[str]] = {}
    for module, (path, is_pkg) in files.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                if node.level > 1:
                    base = base[: len(base) - node.level + 1]
                target = (
                    ".".join([*base, node.module] if node.module else base) if node.level else node.module
                )
                for alias in node.names:
                    full = f"{target}.{alias.name}"
                    deps.add(full if full in files else str(target))
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        graph[module] = {d for d in deps if d in files and d != module}
    return graph


def test_no_import_cycles() -> None:
    graph = _import_graph()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycle = [*path[path.index(module) :], module]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        for dep in sorted(graph[module]):
            visit(dep, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_layers_only_import_downwards() -> None:
    wrong = []
    for module, deps in _import_graph().items():
        mine = module.split(".")[1] if "." in module else "rl_trace_observer"
        for dep in deps:
            theirs = dep.split(".")[1] if "." in dep else "rl_trace_observer"
            if theirs != mine and LAYERS[theirs] >= LAYERS[mine] and LAYERS[mine] > 0:
                wrong.append(f"{module} imports {dep}")
    assert not wrong, wrong


def test_modules_stay_small() -> None:
    """A module over ~500 lines is two modules."""
    big = [
        f"{p.relative_to(SRC)}: {n}"
        for p in (SRC / "rl_trace_observer").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 520
    ]
    assert not big, big
