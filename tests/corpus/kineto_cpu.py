"""A plain Kineto trace's events, hand-made: the merge's bad-input, hostile-input and output-pair tests
put their bad files beside it."""

from __future__ import annotations

from typing import Any


def kineto_cpu_events(pid: int, n: int) -> list[dict[str, Any]]:
    """Its process label and ``n`` CPU ops, 10 µs apart (µs after the trace's base)."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": "CPU"}}
    ]
    events += [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": f"op{i}",
            "pid": pid,
            "tid": pid,
            "ts": 1000.0 + 10 * i,
            "dur": 5.0,
        }
        for i in range(n)
    ]
    return events
