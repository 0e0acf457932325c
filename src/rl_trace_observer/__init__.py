"""RL Trace Observer: one correct timeline for distributed RL training runs.

Importing this package (or ``capture`` and ``merge``) imports nothing heavy and changes nothing:
framework integrations live in ``rl_trace_observer.integrations.*`` and load their framework lazily.
The library's entry points are here too, loaded when first asked for (:mod:`.api`)::

    import rl_trace_observer as rto
    rto.merge(inputs, output, rto.MergeOptions(...))     # rl-trace merge
    rto.report(path, html="report.html")                 # rl-trace report
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_API = ("MergeOptions", "MergeResult", "UsageError", "merge_steps", "ray_merge", "report")


def __getattr__(name: str) -> Any:
    """The public API, imported on first use (PEP 562), so that a training process that imports only
    the capture layer never loads the merger."""
    if name == "merge":  # the sub-package itself, which is callable (it becomes this attribute)
        # import_module, not ``from . import merge``: that asks this module for ``merge`` first, which
        # lands here again before the import has set the attribute (a RecursionError on first use)
        return importlib.import_module(f"{__name__}.merge")
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), "merge", *_API])
