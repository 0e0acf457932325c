"""The step markers of a profiler trace that appeared or changed (torch.profiler's ``ProfilerStep#N``):
the steps of a run that writes no event log, found live as the merge's planner finds them afterwards.

A profiler trace is written whole at the end of each profiling cycle, so its markers arrive with it,
after their steps ended. The file's format is sniffed from its head, as the planner does, and only a
format that marks steps from absolute times (``MarksSteps``, not ``markers_relative``: Kineto's
``baseTimeNanoseconds``) is searched; the search itself is the planner's (``markers_of``). A file
still being written gives what it holds so far and is searched again when it changes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from ...capture.file_names import PROCESS_RECORD_PREFIX
from ...merge.files.sources import discover
from ...merge.formats import format_of
from ...merge.formats.base import MarksSteps
from ...merge.plan.build import markers_of, sniff_source
from ...merge.timeline.steps import Marker
from .follow import is_line_file

if TYPE_CHECKING:
    from .seen import Seen


def profiler_markers(path: str) -> tuple[Marker, ...]:
    """The step markers of the trace at ``path``; none if it is not one that marks steps by itself."""
    if os.path.basename(path).startswith(PROCESS_RECORD_PREFIX):
        return ()
    try:
        (src,) = discover([path])
    except Exception:  # gone again, or unreadable: the next change tries again
        return ()
    fmt = format_of(sniff_source(src).kind)
    if not isinstance(fmt, MarksSteps) or fmt.markers_rank == 0 or fmt.markers_relative:
        return ()
    return markers_of(fmt, src) or ()


def changed_profiles(root: str, changed: Iterable[str]) -> Iterator[tuple[str, tuple[Marker, ...]]]:
    """Each changed file under ``root`` that is not a line file, with its step markers (``()``: none)."""
    for rel in changed:
        if not is_line_file(rel):
            yield rel, profiler_markers(os.path.join(root, rel))


def look_at_profiles(seen: Seen, root: str, changed: Iterable[str]) -> bool:
    """The markers of every changed profiler trace into ``seen``; True if any moved."""
    moved = False
    for rel, markers in changed_profiles(root, changed):
        moved = seen.profile(rel, markers) or moved
    return moved
