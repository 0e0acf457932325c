"""What a merge is asked for and what it answers: options, result, output formats, usage errors.

A module of its own so that every stage (planning, the run, the manifest) can name the options
without importing the pipeline that calls them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .timeline.model import Problem

# output suffix -> writer format (the INPUT formats are the registry, merge/formats/__init__.py FORMATS)
OUTPUT_FORMATS = {".pftrace": "pftrace", ".pftrace.gz": "pftrace.gz", ".json.gz": "json.gz", ".json": "json"}


class UsageError(ValueError):
    """Bad arguments: exit code 2, nothing written."""


@dataclass
class MergeOptions:
    run: str | None = None
    steps: tuple[tuple[int, int], ...] = ()
    roles: tuple[str, ...] = ()
    time_window: tuple[float | None, float | None] | None = None  # seconds; see selection.window_ns
    min_duration_us: float = 0.0
    strict: bool = False
    workers: int | None = None  # None: 2 (or in-process for small merges); 0: in-process
    manifest: str | None = None
    clock_mode: str = "auto"  # auto | aligned | wall (see merge.clock.hosts)
    clock_tolerance_us: float = 1000.0
    shards: str | None = None  # also write span shards (Parquet) into this directory (.shards)
    # file path (os.path.realpath) -> byte ranges of whole lines its reader may skip when the merge is
    # cut to time windows: lines a caller that followed the file (``rl-trace watch``) knows hold only
    # events ending long before every window, which the window would drop anyway. Why: a step's merge
    # then reads the step's part of a growing run, not the whole run again (see job/read.py)
    skip_lines: dict[str, tuple[tuple[int, int], ...]] | None = field(default=None, repr=False)
    progress: Callable[[int, int], None] | None = field(default=None, repr=False)


@dataclass
class MergeResult:
    output: str
    manifest_path: str
    manifest: dict[str, Any]
    exit_code: int
    problems: list[Problem]

    @property
    def written(self) -> bool:
        return bool(self.manifest["output"]["written"])

    @property
    def usable(self) -> bool:
        """Written with at least one event (a merge that kept nothing leaves the output untouched)."""
        return self.written and self.manifest.get("counts", {}).get("events_kept", 0) > 0


def output_format(output: str) -> str:
    for suffix, fmt in OUTPUT_FORMATS.items():
        if output.endswith(suffix):
            return fmt
    raise UsageError(
        f"{output}: unknown output format; use .json, .json.gz, .pftrace or .pftrace.gz "
        "(.tar: a Perfetto v58+ archive, written from span shards)"
    )


def default_workers() -> int:
    return max(1, min(2, os.cpu_count() or 1))


def step_output(output: str, step: int) -> str:
    """``run.json.gz`` → ``run.step3.json.gz``."""
    for suffix in OUTPUT_FORMATS:
        if output.endswith(suffix):
            return f"{output[: -len(suffix)]}.step{step}{suffix}"
    raise UsageError(f"{output}: unknown output format; use .json, .json.gz, .pftrace or .pftrace.gz")
