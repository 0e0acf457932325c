"""Every artifact of a run → one Perfetto timeline: ``rl_trace_observer.merge(inputs, output, options)``.

An event goes one way, source → format → transform → writer:

- ``files/``      find the input files and read each exactly once (sha256 and inflate in one pass);
- ``formats/``    one folder or module per input format, found through one registry: sniffing, the
                  planning hints, the read onto the timeline, its clock probe, partner and counts;
- ``plan/``       what each file is, which process owns it, what to merge;
- ``clock/``      each host's correction, pair estimates for per-artifact alignment, causality checks;
- ``job/``        one file at a time, forward: read, align on its partner, the passes, counts, emit —
- ``transform/``    correct, filter, remap identities, move what cannot nest, namespace flow ids,
- ``output/``       serialise (Chrome JSON, Perfetto protobuf) into pieces, deflate, spill; the
                    job's stitcher joins them into one file;
- ``shards/``     every kept event also as a row of the span table (``--shards``);
- ``manifest/``   what went in, what came out, what went wrong;
- ``views/``      outputs written from span shards instead of the inputs;
- ``pipeline/``   THE merge, given an executor: this machine's process pool here, a Ray cluster's
                  nodes in :mod:`rl_trace_observer.cluster`.

``timeline/`` is the vocabulary they share (events, identities, times) and ``options`` what a merge is
asked for. ``tests/project/test_package_hygiene.py`` ranks these folders: each imports only lower ones.

This package is callable — ``rl_trace_observer.merge(inputs, output, options)`` — and importing it
imports nothing else (the merger loads on the first call). For type checkers, the same function is
:func:`rl_trace_observer.api.merge`.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .options import MergeOptions, MergeResult

__all__ = ["merge"]


def __getattr__(name: str) -> Any:
    """``merge`` is :func:`.pipeline.local.merge` itself (one definition), imported on first use."""
    if name == "merge":
        from .pipeline.local import merge

        return merge
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _CallableModule(ModuleType):
    """``rl_trace_observer.merge(...)`` calls :func:`merge` (a module's class may be swapped for a
    subclass of ModuleType: the supported way to give a module behaviour)."""

    def __call__(self, inputs: list[str], output: str, options: MergeOptions | None = None) -> MergeResult:
        from .pipeline.local import merge

        return merge(inputs, output, options)


sys.modules[__name__].__class__ = _CallableModule
