"""The optional compiled twins (Cython, built by ``setup.py``), chosen per process: the merger's
``.pftrace`` encoder and the report's GPU loops.

Why a switch and a staleness check: a twin reproduces Python code byte for byte (tested), so a twin
built from another version of its source could write what the source no longer would. Each twin
carries the sha256 of the source it was built from (``SOURCE_SHA256``, compiled in); one that differs
from the source beside it is ignored with one warning. A hash, not file times: a plain ``cp -r`` or a
``git checkout`` changes times but not what the twin computes. ``RL_TRACE_NATIVE=0`` ignores all.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
from functools import cache
from pathlib import Path
from types import ModuleType

from .. import config
from .twin_sources import TWINS

log = logging.getLogger(__name__)

PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def source_hash(name: str) -> str | None:
    """sha256 of the source twin ``name`` is built from, or None where the source is not installed."""
    try:
        return hashlib.sha256((PACKAGE_ROOT / TWINS[name]).read_bytes()).hexdigest()
    except OSError:
        return None


@cache
def twin(name: str) -> ModuleType | None:
    """The compiled module ``name`` if it is enabled, built and built from the source beside it."""
    if not config.load().native:
        return None
    try:
        module = importlib.import_module(name)
    except ImportError:
        return None
    want = source_hash(name)
    built = getattr(module, "SOURCE_SHA256", "")
    if want is not None and built != want:
        log.warning(
            "%s was built from another version of %s: Python path instead (rebuild: scripts/bootstrap.sh)",
            module.__file__,
            TWINS[name],
        )
        return None
    return module


def active() -> dict[str, bool]:
    """Which twins this process uses (for the manifest and the benchmarks)."""
    return {name.rsplit(".", 1)[-1]: twin(name) is not None for name in TWINS}


def reset() -> None:
    """Forget the choice (tests switch ``RL_TRACE_NATIVE`` within one process)."""
    twin.cache_clear()


__all__ = ["TWINS", "active", "reset", "source_hash", "twin"]
