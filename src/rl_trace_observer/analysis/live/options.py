"""What a watch is asked for (its own module: the loop and the per-step answer both name it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...merge.options import MergeOptions, MergeResult


@dataclass
class WatchOptions:
    run_dir: Path
    out_dir: Path
    settle_s: float = 2.0  # time after a step's marker was read before the step counts as finished
    pad_s: float = 2.0  # merged around the step's window: the samples that bracket it (telemetry)
    poll_s: float = 0.5
    log: Callable[[str], None] | None = None
    # how a step is merged: (output, options) -> result; None: the merge of ``run_dir`` here. A Ray
    # watch gives the merge's Ray executor (``cluster.ray_merge``: converted on the nodes)
    merge: Callable[[str, MergeOptions], MergeResult] | None = None
