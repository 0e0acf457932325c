"""DEMO WORKLOAD orchestration: ``rl-trace demo`` end to end.

1. a private local Ray cluster (``address="local"``: never someone else's), with the capture
   environment in the job's ``runtime_env`` so every actor writes into ``OUT/run/``;
2. the PPO-shaped loop (:mod:`.driver`);
3. ``collect`` over Ray into ``OUT/collected/`` (what a multi-node run needs), then Ray is shut
   down — always, in ``finally``;
4. ``merge`` into ``OUT/trace.pftrace`` and ``OUT/trace.json.gz`` (+ manifests), the report into
   ``OUT/report.html``/``OUT/report.json``, and ``OUT/steps.pftrace``: the steps only, a view of the
   span shards. The whole run is ~95 % set-up (Ray, actors, the model: ~20 s before ~1 s of steps), so
   Perfetto opens the whole trace on a timeline whose steps are a sliver at its end; Perfetto has no
   "open here" field, so the steps view is what the demo points to first, and the whole trace marks
   its set-up with a ``set-up (not a step)`` slice on the driver's ``set-up`` track. The caller
   prints where everything is.

The driver process's own environment and RL-Insight registration are restored afterwards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .model import DemoConfig

Progress = Callable[[str], None]

RUN_SUBDIR = "run"
COLLECT_SUBDIR = "collected"
TRACE_STEM = "trace"
STEPS_STEM = "steps"


@dataclass
class DemoOutputs:
    """Everything the demo wrote, and how long each phase took (seconds)."""

    out_dir: Path
    run_dir: Path
    run_id: str
    merge_input: Path
    collected_dir: Path | None = None
    pftrace: Path | None = None
    json_trace: Path | None = None
    manifests: list[Path] = field(default_factory=list)
    report_html: Path | None = None
    shards: Path | None = None  # span shards of the .pftrace merge (report, SQL, views)
    steps_view: Path | None = None  # the steps only (no set-up): what Perfetto should open first
    report_json: Path | None = None
    summary: dict[str, Any] | None = None
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    loop: Any = None


def capture_env(run_dir: Path, run_id: str) -> dict[str, str]:
    return {
        "RL_TRACE_OUTPUT_DIR": str(run_dir),
        "RL_TRACE_RUN_ID": run_id,
        "RL_INSIGHT_SERVER_URL": "local://rl-trace-observer",
        "RL_TRACE_METRICS": "1",  # the node's metric sampler: engine /metrics, GPUs, host
        "RL_TRACE_METRICS_INTERVAL_S": "0.1",  # the demo's steps last ~0.3 s: sample at 10 Hz
        # its replicas generate in pure Python, so their /metrics thread waits for the GIL: on a
        # loaded machine a page can take longer than the default 0.5 s
        "RL_TRACE_METRICS_TIMEOUT_S": "2",
        "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled"),
    }


@contextlib.contextmanager
def _patched_environ(values: dict[str, str]) -> Iterator[None]:
    """The capture variables for this process (the driver records too), restored afterwards."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _driver_capture() -> Iterator[None]:
    """The driver's recorder and RL-Insight registration exist only for the demo's duration."""
    from ..capture import reset
    from ..capture.sampler import leave
    from ..integrations.rl_insight import uninstall

    reset()
    try:
        yield
    finally:
        reset()
        leave()  # the sampler stops once the actors are gone too
        uninstall()


def _collect(ray: Any, out: DemoOutputs, progress: Progress) -> None:
    try:
        from ..integrations.ray.collect import collect
    except ImportError as exc:
        out.notes.append(
            f"collection skipped: rl_trace_observer.integrations.ray.collect unavailable ({exc})"
        )
        return
    from rich.console import Console

    progress("collecting artifacts over Ray")
    dest = out.out_dir / COLLECT_SUBDIR
    report = collect(
        dest, output_dir=out.run_dir, run_id=out.run_id, progress=False, console=Console(stderr=True)
    )
    run_dir = Path(str(report.run_dir))
    if run_dir.is_dir() and any(run_dir.iterdir()):
        out.collected_dir = out.merge_input = run_dir  # merge what a multi-node run would have
    problems = report.problems()
    if problems:
        out.notes.append("collection reported: " + "; ".join(problems[:5]))


def run_workload(cfg: DemoConfig, out: DemoOutputs, progress: Progress) -> None:
    """Steps 1-3: Ray up, the loop, collection, Ray down (always)."""
    import ray

    from .driver import run_loop

    env = capture_env(out.run_dir, out.run_id)
    out.run_dir.mkdir(parents=True, exist_ok=True)
    with _patched_environ(env), _driver_capture():
        t0, setup_started_ns = time.monotonic(), time.time_ns()
        progress("starting a local Ray cluster")
        ray.init(
            address="local",
            num_cpus=4,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.WARNING,
            runtime_env={"env_vars": env},
        )
        try:
            out.timings["ray_start"] = time.monotonic() - t0
            out.loop = run_loop(ray, cfg, progress, setup_started_ns=setup_started_ns)
            out.timings["loop"] = out.loop.seconds
            t1 = time.monotonic()
            _collect(ray, out, progress)
            out.timings["collect"] = time.monotonic() - t1
        finally:
            t2 = time.monotonic()
            ray.shutdown()
            out.timings["ray_stop"] = time.monotonic() - t2


def merge_and_report(out: DemoOutputs, progress: Progress) -> None:
    """Step 4: both merged traces (+ manifests) and the report."""
    from ..analysis.report import inputs as report_input
    from ..analysis.report.output import summarize, write_outputs

    t0 = time.monotonic()
    progress("merging into one Perfetto trace (.pftrace and .json.gz)")
    out.pftrace = out.out_dir / f"{TRACE_STEM}.pftrace"
    out.json_trace = out.out_dir / f"{TRACE_STEM}.json.gz"
    out.shards = out.out_dir / "shards"
    for target in (out.pftrace, out.json_trace):  # span shards with the .pftrace: its report reads them
        shards = out.shards if target == out.pftrace else None
        out.manifests.append(report_input.merge([out.merge_input], target, shards=shards))
    out.timings["merge"] = time.monotonic() - t0
    t1 = time.monotonic()
    progress("writing the report")
    out.report_html, out.report_json = out.out_dir / "report.html", out.out_dir / "report.json"
    out.summary = summarize(out.json_trace)
    write_outputs(out.summary, html=out.report_html, json_path=out.report_json)
    out.timings["report"] = time.monotonic() - t1
    t2 = time.monotonic()
    out.steps_view = _steps_view(out, [s["step"] for s in out.summary["steps"] if s["step"] is not None])
    out.timings["steps_view"] = time.monotonic() - t2


def _steps_view(out: DemoOutputs, steps: list[int]) -> Path | None:
    """``OUT/steps.pftrace``: the rows of the steps, from the span shards (the set-up left out)."""
    from ..merge.options import MergeOptions
    from ..merge.pipeline import merge as run_merge

    if out.shards is None or not steps:
        return None
    view = out.out_dir / f"{STEPS_STEM}.pftrace"
    result = run_merge([str(out.shards)], str(view), MergeOptions(steps=((min(steps), max(steps)),)))
    return view if result.written else None


def default_out_dir() -> Path:
    return Path.cwd() / time.strftime("rl-trace-demo-%Y%m%d-%H%M%S")


def run_demo(out_dir: Path, cfg: DemoConfig, progress: Progress) -> DemoOutputs:
    run_id = "demo-" + time.strftime("%Y%m%d-%H%M%S")
    out_dir = out_dir.resolve()
    out = DemoOutputs(
        out_dir=out_dir, run_dir=out_dir / RUN_SUBDIR, run_id=run_id, merge_input=out_dir / RUN_SUBDIR
    )
    t0 = time.monotonic()
    if cfg.engine == "vllm" and not cfg.model_dir:  # the replicas' real vLLM serves a model made here
        from .vllm_engine import build_model

        progress("building the tiny Llama the real vLLM replicas serve")
        cfg = dataclasses.replace(cfg, model_dir=str(build_model(out_dir / "vllm-model")))
    run_workload(cfg, out, progress)
    merge_and_report(out, progress)
    out.timings["total"] = time.monotonic() - t0
    return out
