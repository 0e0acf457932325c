"""Empty stand-ins for TokenSpeed's GPU kernel packages, so its pure-Python parts import on a CPU.

``tokenspeed_kernel``, ``tokenspeed_triton`` and ``tokenspeed_scheduler`` are compiled for GPUs
(``tokenspeed_kernel`` raises "requires an NVIDIA CUDA, AMD ROCm, or Ascend NPU device" at import).
Every module under them becomes a permissive placeholder (any attribute is a callable mock), except
``tokenspeed_kernel.profiling``, TokenSpeed's Proton glue, which is :mod:`.proton_standin`.
Install before anything imports ``tokenspeed.runtime``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any
from unittest.mock import MagicMock

ROOTS = ("tokenspeed_kernel", "tokenspeed_triton", "tokenspeed_scheduler")


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        module = MagicMock(name=spec.name)
        module.__name__, module.__path__, module.__spec__, module.__file__ = spec.name, [], spec, None
        return module

    def exec_module(self, module: Any) -> None:
        return None


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name.split(".")[0] in ROOTS:
            return importlib.machinery.ModuleSpec(name, _Loader(), is_package=True)
        return None


def install() -> None:
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder())
    from . import proton_standin

    sys.modules["tokenspeed_kernel.profiling"] = proton_standin
