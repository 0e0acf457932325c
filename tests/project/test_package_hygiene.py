"""Importing the core pulls in nothing heavy and changes nothing; the README lists every setting."""

from __future__ import annotations

import ast
import json
import re

import pytest

from rl_trace_observer import config as config_mod

from ..conftest import ROOT, clean_env, run_python

HEAVY = ("torch", "ray", "verl", "rl_insight", "omegaconf", "pandas", "numpy", "viztracer", "pyarrow")


@pytest.mark.parametrize(
    "module",
    [
        "rl_trace_observer",
        "rl_trace_observer.config",
        "rl_trace_observer.capture",
        "rl_trace_observer.merge",
        "rl_trace_observer.api",
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
    for folder in ("common", "capture", "merge"):
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
    "common": 0,  # atomic writes, JSON encoding, the clock-offset estimator: stdlib (+ orjson) only
    "capture": 1,  # in-process, stdlib + orjson
    "integrations": 2,  # one folder per framework, imported lazily
    "testing": 3,  # for tests: synthetic files, the offline Perfetto engine, capture fault harnesses
    "merge": 3,  # formats → one timeline model → writers
    "analysis": 4,  # answers, the report, SQL and diffs
    "cluster": 4,  # merge --ray: node tasks (Ray + the merger); peers of analysis, never importing it
    "demo": 5,
    "cli": 6,
    "api": 6,  # the library's public entry points (merge, ray_merge, report): above what they call
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
        tree = ast.parse(path.read_text())
        if module == "rl_trace_observer":  # its __getattr__ loads the public API on first use only
            tree.body = [
                n for n in tree.body if not (isinstance(n, ast.FunctionDef) and n.name == "__getattr__")
            ]
        for node in ast.walk(tree):
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


# Inside a package, the same rule one level down: each sub-package (or module at the package's root) is
# a unit, and a unit imports only units of a LOWER rank (peers of one rank never import each other), so
# a folder cycle or an upward import fails here. A new folder must be given its rank.
SUBLAYERS: dict[str, dict[str, int]] = {
    "merge": {
        "timeline": 0,  # the one timeline model: events, identities, times
        "files": 0,  # bytes on disk: inputs read once, gzip members, part files
        "clock": 1,  # host corrections, pair estimates, causality checks (no plan, no files)
        "options": 1,  # what a merge is asked for
        "formats": 2,  # one folder/module per input format, one registry
        "plan": 3,  # inputs → what each file is, its owner, what to merge
        "transform": 3,  # the passes over one file's events (and their fused fast path)
        "output": 3,  # output plumbing: Chrome JSON and Perfetto protobuf writers (and the compiled
        # twin), deflate pieces stitched into one gzip member, part files, write-back, owned temp names
        "shards": 4,  # the span table: schema, rows written in the jobs, loader
        "job": 5,  # the per-file job, forward (read, align, passes, counts, emit), its pool; the stitcher
        "manifest": 6,  # what went in, what came out
        "views": 7,  # outputs written from span shards
        "pipeline": 8,  # THE merge, given an executor (local pool here, Ray nodes in cluster/)
        "__init__": 9,  # the package's entry
    },
    "analysis": {
        "answers": 0,  # idle causes, stragglers, critical path: pure functions of stage spans
        "view_server": 0,  # serves one trace to the Perfetto UI
        "gpu": 1,  # kernels per step, rank and stage (HTA's definitions): computation over the answers'
        "report": 2,  # load a merged run, compute the figures (with the answers and gpu), render
        "query": 3,  # SQL (the report's tables too), diffs, the critical path drawn in: on top of the report
        "live": 3,  # rl-trace watch: each finished step merged and reported as the run grows, served
        "__init__": 4,
    },
}


def _unit(module: str, package: str) -> str | None:
    """``rl_trace_observer.merge.formats.kineto.format`` → ``formats`` (None: not in ``package``)."""
    parts = module.split(".")
    if parts[:2] != ["rl_trace_observer", package]:
        return None
    return parts[2] if len(parts) > 2 else "__init__"


def _unit_violations(graph: dict[str, set[str]], package: str, ranks: dict[str, int]) -> list[str]:
    wrong = []
    for module, deps in sorted(graph.items()):
        mine = _unit(module, package)
        if mine is None:
            continue
        if mine not in ranks:
            wrong.append(f"{module}: {package}/{mine} has no rank in SUBLAYERS")
            continue
        for dep in sorted(deps):
            theirs = _unit(dep, package)
            if theirs is None or theirs == mine or theirs not in ranks:
                continue
            if ranks[theirs] >= ranks[mine]:
                wrong.append(f"{module} imports {dep}: {package}/{mine} may not import {package}/{theirs}")
    return wrong


def _folder_cycles(graph: dict[str, set[str]], packages: set[str]) -> list[list[str]]:
    """Cycles between the parts of each package, at every depth: its sub-packages (each with all it
    holds) and its root modules, with the imports between them."""
    cycles: list[list[str]] = []
    for pkg in sorted(packages):

        def part(module: str, pkg: str = pkg) -> str | None:
            if module == pkg:
                return pkg + ".__init__"
            if not module.startswith(pkg + "."):
                return None
            return pkg + "." + module[len(pkg) + 1 :].split(".")[0]

        edges: dict[str, set[str]] = {}
        for module, deps in graph.items():
            a = part(module)
            for dep in deps:
                b = part(dep)
                if a is not None and b is not None and a != b:
                    edges.setdefault(a, set()).add(b)
        cycles += _cycles(edges)
    return cycles


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    found, done = [], set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            found.append([*path[path.index(node) :], node])
            return
        if node in done:
            return
        for nxt in sorted(edges.get(node, ())):
            visit(nxt, [*path, node])
        done.add(node)

    for node in sorted(edges):
        visit(node, [])
    return found


def _packages() -> set[str]:
    return {
        ".".join(p.relative_to(SRC).parent.parts) for p in (SRC / "rl_trace_observer").rglob("__init__.py")
    }


@pytest.mark.parametrize("package", sorted(SUBLAYERS))
def test_sub_packages_only_import_downwards(package: str) -> None:
    wrong = _unit_violations(_import_graph(), package, SUBLAYERS[package])
    assert not wrong, "\n".join(wrong)


def test_no_folder_imports_itself_back_through_another() -> None:
    cycles = _folder_cycles(_import_graph(), _packages())
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_the_folder_checks_catch_a_cycle_and_an_upward_import() -> None:
    """The checks above can fail: a made-up graph with plan ↔ formats and formats → pipeline."""
    graph = {
        "rl_trace_observer.merge.plan.build": {"rl_trace_observer.merge.formats.base"},
        "rl_trace_observer.merge.formats.base": {"rl_trace_observer.merge.plan.plan"},
        "rl_trace_observer.merge.plan.plan": set(),
        "rl_trace_observer.merge.formats.kineto.format": {"rl_trace_observer.merge.pipeline.local"},
        "rl_trace_observer.merge.pipeline.local": set(),
    }
    cycles = _folder_cycles(graph, {"rl_trace_observer.merge"})
    merge = "rl_trace_observer.merge"
    assert cycles == [[f"{merge}.formats", f"{merge}.plan", f"{merge}.formats"]], cycles
    wrong = _unit_violations(graph, "merge", SUBLAYERS["merge"])
    assert any("formats.base imports rl_trace_observer.merge.plan.plan" in w for w in wrong), wrong
    assert any("merge/formats may not import merge/pipeline" in w for w in wrong), wrong


def test_no_private_name_is_imported_from_another_folder() -> None:
    """A ``_name`` is its folder's own business (the Ray merge once imported four of the pipeline's)."""
    graph_files = {}
    for path in (SRC / "rl_trace_observer").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        graph_files[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    wrong = []
    for module, (path, is_pkg) in graph_files.items():
        here = module if is_pkg else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = module.split(".") if is_pkg else module.split(".")[:-1]
            if node.level > 1:
                base = base[: len(base) - node.level + 1]
            target = ".".join([*base, node.module] if node.module else base) if node.level else node.module
            if target not in graph_files:
                continue
            there = target if graph_files[target][1] else target.rsplit(".", 1)[0]
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__") and there != here:
                    wrong.append(f"{module} imports {target}.{alias.name}")
    assert not wrong, wrong


def _kind_literals() -> set[str]:
    from rl_trace_observer.merge.formats import FORMATS, UNKNOWN

    return {f.kind for f in FORMATS} | {UNKNOWN}


def _strings(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_strings(e) for e in node.elts)) if node.elts else set()
    return set()


def _names_a_kind(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and "kind" in n.id.lower():
            return True
        if isinstance(n, ast.Attribute) and "kind" in n.attr.lower():
            return True
        if isinstance(n, ast.Constant) and n.value == "kind":
            return True
    return False


def kind_string_uses(source: str, kinds: set[str]) -> list[int]:
    """Lines that compare a kind with a format's kind string, key a dict by one, or look a format up
    by a literal kind: what only a format may know."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            literals = set().union(*(_strings(o) for o in operands))
            if literals & kinds and any(_names_a_kind(o) for o in operands if not _strings(o)):
                lines.append(node.lineno)
        elif isinstance(node, ast.Dict):
            if set().union(*(_strings(k) for k in node.keys if k is not None)) & kinds:
                lines.append(node.lineno)
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name in ("format_for", "format_of") and any(_strings(a) & kinds for a in node.args):
                lines.append(node.lineno)
    return lines


def test_outside_the_formats_no_code_compares_a_kind_string() -> None:
    """What a format is (and does) is asked of the format, through the registry: merge/formats/ only."""
    kinds = _kind_literals()
    found = []
    for folder in ("merge", "cluster", "analysis"):
        for path in sorted((SRC / "rl_trace_observer" / folder).rglob("*.py")):
            rel = path.relative_to(SRC / "rl_trace_observer").as_posix()
            if rel.startswith("merge/formats/"):
                continue
            found += [f"{rel}:{line}" for line in kind_string_uses(path.read_text(), kinds)]
    assert not found, found
    # and the check can fail: each shape it looks for, as it was written before issue 25
    before = (
        'if art.info.kind == "torch":\n    x = {"rl_insight": None}\n    reader_for = format_for("proton")\n'
    )
    assert kind_string_uses(before, kinds) == [1, 2, 3]


def test_modules_stay_small() -> None:
    """A module over ~500 lines is two modules."""
    big = [
        f"{p.relative_to(SRC)}: {n}"
        for p in (SRC / "rl_trace_observer").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 520
    ]
    assert not big, big
