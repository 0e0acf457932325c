"""Run a callback right after a named module finishes importing (or now, if it already has).

Why: our plugin is imported at ``import verl`` in every VERL process, long before the trainer,
the torch profiler tool or a rollout server module is imported — and importing those eagerly
would drag TransferQueue, vLLM and friends into processes that never use them. A post-import
hook lets us patch a surface exactly when, and only where, it exists.

The finder delegates to the other finders, then wraps the found loader's ``exec_module``; it
never changes what is imported. Callbacks must not raise; if one does, it is logged and the import
goes on.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

log = logging.getLogger("rl_trace_observer")

Callback = Callable[[ModuleType], None]

_lock = threading.RLock()
_pending: dict[str, list[Callback]] = {}


def _run(name: str, module: ModuleType, callbacks: list[Callback]) -> None:
    for callback in callbacks:
        try:
            callback(module)
        except Exception as exc:
            log.error("[rl-trace-observer] hook for %s failed: %s", name, exc)


class _LoaderProxy(importlib.abc.Loader):
    """Executes the module with the original loader, then fires the hooks for it."""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        with _lock:
            callbacks = _pending.pop(self._name, [])
        _run(self._name, module, callbacks)

    def __getattr__(self, item: str) -> Any:  # get_source, is_package, ... for tools that ask
        return getattr(self._loader, item)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _LoaderProxy(spec.loader, fullname)
                return spec
        return None


_FINDER = _PostImportFinder()


def when_imported(name: str, callback: Callback) -> None:
    """Call ``callback(module)`` once ``name`` is imported; immediately if it already is."""
    module = sys.modules.get(name)
    if module is not None:
        _run(name, module, [callback])
        return
    with _lock:
        _pending.setdefault(name, []).append(callback)
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)


def forget(name: str) -> None:
    """Drop the hooks still waiting for ``name`` (tests)."""
    with _lock:
        _pending.pop(name, None)
