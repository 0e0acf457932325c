"""An engine's own profile, registered by its rollout server, is drawn as that server's process.

vLLM's torch profiler runs in the engine's worker process (another OS pid than the server actor that
registered the trace, with ``engine_of_owner``: ``integrations/verl/torch_traces.py``). Records by the
real capture layer, the Kineto file hand-written (the reader's fields); the real merge."""

from __future__ import annotations

import json
from pathlib import Path

from rl_trace_observer.capture import Recorder
from rl_trace_observer.config import Config
from rl_trace_observer.merge.options import MergeOptions
from rl_trace_observer.merge.pipeline import merge

from ..clock.test_clock_pipeline import MS, T, write_kineto
from ..corpus.recorded import FixedClock

SERVER, WORKER = 4100, 4200


def _run(folder: Path, fold: bool) -> list[dict[str, object]]:
    rec = Recorder(
        Config(output_dir=folder.resolve(), run_id="r", role="rollout"), FixedClock(T), host="h", pid=SERVER
    )
    rec.span("engine_request", T + 1 * MS, T + 9 * MS, lane="replica_0")
    folder.mkdir(parents=True, exist_ok=True)
    trace = folder / "rollout-replica0_rank0.pt.trace.json"
    write_kineto(trace, WORKER, [("execute_model", T + 2 * MS, T + 8 * MS, 7)])  # the worker's pid
    extra = {"engine_of_owner": True} if fold else {}
    rec.register_artifact(trace, "torch", step=None, role="rollout", rank=0, replica=0, **extra)
    rec.close()
    out = folder / "merged.json"
    merge([str(folder)], str(out), MergeOptions())
    data = json.loads(out.read_text())
    return data["traceEvents"] if isinstance(data, dict) else data


def _pid_of(events: list[dict[str, object]], name: str) -> object:
    (pid,) = {e["pid"] for e in events if e.get("name") == name and e.get("ph") == "X"}
    return pid


def test_engine_worker_trace_is_drawn_as_the_registering_server(tmp_path: Path) -> None:
    events = _run(tmp_path / "fold", fold=True)
    assert _pid_of(events, "execute_model") == _pid_of(events, "engine_request")
    names = [e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"]
    assert not any(str(WORKER) in str(n) for n in names), names  # no process of its own for the worker


def test_without_the_mark_the_worker_stays_a_process_of_its_own(tmp_path: Path) -> None:
    events = _run(tmp_path / "plain", fold=False)
    assert _pid_of(events, "execute_model") != _pid_of(events, "engine_request")
