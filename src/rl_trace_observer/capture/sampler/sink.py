"""Where the sampler's lines go: the ONE place that names the capture writer.

The sampler appends whole JSON lines — the lines that describe (the ``meta`` line, sources, series)
as headers, so that a new file started after the old one was removed or replaced reads on its own —
and, at exit, waits a bounded time for them to be on disk; that is the whole interface
(:class:`LineSink`). Behind it is the capture layer's stream (:func:`~..streams.open_stream`), the
same never-stall writer the RL-Insight spans of every process go through: an append is a deque
append, a drain process does the file writes.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("rl_trace_observer")


class LineSink(Protocol):
    def append(self, line: bytes) -> None: ...

    def append_header(self, line: bytes) -> None: ...

    def flush(self, timeout_s: float) -> bool: ...

    def close(self, timeout_s: float) -> bool: ...

    @property
    def counts(self) -> tuple[int, int]:
        """(written, dropped) lines as the writer last confirmed them."""
        ...


class _StreamSink:
    def __init__(self, path: Path, config: Any) -> None:
        from ..streams import open_stream

        self._warned: set[str] = set()
        self._stream = open_stream(path, on_problem=self._problem, config=config)

    def append(self, line: bytes) -> None:
        self._stream.append(line)

    def append_header(self, line: bytes) -> None:
        self._stream.append_header(line)

    def _problem(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("[rl-trace-observer] sampler: %s", message)

    def flush(self, timeout_s: float) -> bool:
        return self._stream.flush(timeout_s)

    def close(self, timeout_s: float) -> bool:
        return self._stream.close(timeout_s)

    @property
    def counts(self) -> tuple[int, int]:
        return self._stream.written, self._stream.dropped


def open_sink(path: Path, config: Any = None) -> LineSink:
    """A never-blocking, never-raising line writer appending to ``path`` (absolute; folders created
    by the writer on the first line); ``config`` sets its buffer cap and exit wait."""
    return _StreamSink(path, config)
