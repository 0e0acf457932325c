"""The optional compiled twins (Cython, built by ``setup.py`` at install), chosen per process: the
merger's ``.pftrace`` encoder and the report's GPU loops.

Why a switch and a staleness check: a twin reproduces Python code byte for byte (tested), so a twin
older than its source could write what the source no longer would. Such a twin is ignored with one
warning; ``RL_TRACE_NATIVE=0`` ignores all of them.
"""

from __future__ import annotations

import importlib
import logging
from functools import cache
from pathlib import Path
from types import ModuleType

from ... import config

log = logging.getLogger(__name__)

# twin module -> the source it is built from, relative to this folder (the report's GPU loops too)
TWINS = {
    "rl_trace_observer.merge.writers._pftrace_native": "_pftrace_native.pyx",
    "rl_trace_observer.analysis.gpu._gpu_native": "../../analysis/gpu/_gpu_native.pyx",
}


@cache
def twin(name: str) -> ModuleType | None:
    """The compiled module ``name`` if it is enabled, built and not older than its source; else None."""
    if not config.load().native:
        return None
    try:
        module = importlib.import_module(name)
    except ImportError:
        return None
    source = Path(__file__).parent / TWINS[name]
    built = Path(module.__file__ or "")
    try:
        stale = source.exists() and built.stat().st_mtime < source.stat().st_mtime
    except OSError:
        stale = True
    if stale:
        log.warning("%s is older than %s: Python path instead (rebuild: scripts/bootstrap.sh)", built, source)
        return None
    return module


def active() -> dict[str, bool]:
    """Which twins this process uses (for the manifest and the benchmarks)."""
    return {name.rsplit(".", 1)[-1]: twin(name) is not None for name in TWINS}


def reset() -> None:
    """Forget the choice (tests switch ``RL_TRACE_NATIVE`` within one process)."""
    twin.cache_clear()


__all__ = ["TWINS", "active", "reset", "twin"]
