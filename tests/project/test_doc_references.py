"""Every ``:mod:`` reference in the package's docstrings and comments names a module that exists.

Why: modules moved between folders several times; a stale reference sends a reader to nothing. A
reference is resolved as Python resolves an import from the module that holds it (``.x`` is a sibling,
``..x`` is in the parent package), or absolutely; a ``.pyx`` twin counts as a module.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "rl_trace_observer"
REFERENCE = re.compile(r":mod:`~?([A-Za-z0-9_.]+)`")


def _module_name(path: Path) -> tuple[str, str]:
    """(module name, the package its relative references start from)."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
        return ".".join(parts), ".".join(parts)
    return ".".join(parts), ".".join(parts[:-1])


def _exists(name: str) -> bool:
    top = name.split(".")[0]
    if not top:
        return False
    if top != "rl_trace_observer":
        return importlib.util.find_spec(top) is not None
    base = SRC.joinpath(*name.split("."))
    return any(p.exists() for p in (base.with_suffix(".py"), base.with_suffix(".pyx"), base / "__init__.py"))


def test_every_mod_reference_resolves() -> None:
    stale = []
    for path in sorted(PACKAGE.rglob("*.py*")):
        if path.suffix not in (".py", ".pyx"):
            continue
        _, package = _module_name(path)
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for ref in REFERENCE.findall(line):
                try:
                    name = importlib.util.resolve_name(ref, package) if ref.startswith(".") else ref
                except ImportError:
                    name = ref
                if not _exists(name):
                    stale.append(f"{path.relative_to(SRC)}:{number}: :mod:`{ref}` ({name} does not exist)")
    assert not stale, "stale :mod: references:\n" + "\n".join(stale)
