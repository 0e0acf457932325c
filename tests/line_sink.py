"""An in-memory :class:`~rl_trace_observer.capture.sampler.sink.LineSink` for the sampler's tests."""

from __future__ import annotations


class ListSink:
    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.headers: list[bytes] = []

    def append(self, line: bytes) -> None:
        self.lines.append(line)

    def append_header(self, line: bytes) -> None:
        self.lines.append(line)
        self.headers.append(line)

    def flush(self, timeout_s: float) -> bool:
        return True

    def close(self, timeout_s: float) -> bool:
        return True

    @property
    def counts(self) -> tuple[int, int]:
        return len(self.lines), 0
