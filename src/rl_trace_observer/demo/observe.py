"""DEMO WORKLOAD: capture set-up inside each demo process, exactly as a VERL process gets it.

The environment (``RL_TRACE_OUTPUT_DIR``, ``RL_TRACE_RUN_ID``, ``RL_INSIGHT_SERVER_URL=local://…``)
reaches every actor through the job's ``runtime_env``. Each process then registers our RL-Insight
backend and calls ``rl_insight.init()`` with no arguments, as VERL's workers do, so every
``rl_insight.trace_state``/``metric_gauge`` below lands in the process's own JSONL event log.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..capture import get_recorder


def start(role: str, **identity: Any) -> None:
    """Register the backend, initialise RL-Insight and tell the recorder who this process is."""
    from ..integrations.rl_insight import install

    if not install():
        raise RuntimeError("could not register the rl_trace_observer RL-Insight backend (see the log)")
    import rl_insight

    rl_insight.init()
    rec = get_recorder()
    if rec is None:
        raise RuntimeError("RL_TRACE_OUTPUT_DIR is not set in this demo process")
    rec.update_identity(role=role, **identity)


def finish() -> None:
    import rl_insight

    rl_insight.finish()
    rec = get_recorder()
    if rec is not None:
        rec.flush()  # the demo collects right after: every event and the record on disk first


@contextlib.contextmanager
def stage(name: str, lane: str, **labels: Any) -> Iterator[None]:
    """One RL-Insight state span (``rl_insight.trace_state``) on ``lane``."""
    import rl_insight

    with rl_insight.trace_state(name, state_lane_id=lane, **labels):
        yield


def gauge(name: str, value: float, **labels: Any) -> None:
    import rl_insight

    rl_insight.metric_gauge(name, float(value), **labels)


def profiling(on: bool) -> None:
    """A profiled step begins (``True``) or ends here: the node's metric sampler samples faster."""
    from ..capture.sampler import mark_profiling

    mark_profiling(on)


def artifact_dir(kind: str) -> Path:
    """``<RL_TRACE_OUTPUT_DIR>/<kind>/``, created on demand."""
    rec = get_recorder()
    if rec is None:
        raise RuntimeError("RL_TRACE_OUTPUT_DIR is not set in this demo process")
    path = rec.output_dir / kind
    path.mkdir(parents=True, exist_ok=True)
    return path


def register(path: Path, kind: str, **fields: Any) -> None:
    rec = get_recorder()
    if rec is not None:
        rec.register_artifact(path, kind, **fields)
