"""VERL hooks on VERL's real classes: VizTracer window, torch-trace registration, step markers.

In-process tests use the real ``DistProfiler``, the real torch tool (``torch.profiler`` on CPU),
the real ``relocate_rollout_traces``, real VizTracer and the real V1 trainer classes; every patch
is undone in ``finally`` and checked by identity. Subprocess tests cover what must hold in a fresh
interpreter (nothing patched without the switch; the contract error line).
"""

from __future__ import annotations

import gzip
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trace_observer import config as config_mod
from rl_trace_observer.capture import configure, get_recorder, reset
from rl_trace_observer.integrations.verl import contract, steps, torch_traces, viztracer_window
from rl_trace_observer.integrations.verl.viztracer_window import State, VizTracerWindow

from ..conftest import clean_env, need, run_python

profile = need("verl.utils.profiler.profile")
DistProfiler = profile.DistProfiler
from verl.utils.profiler.config import ProfilerConfig, TorchProfilerToolConfig  # noqa: E402


@pytest.fixture
def recorder(tmp_path: Path) -> Iterator[Any]:
    out = tmp_path / "out"
    out.mkdir()
    reset()
    rec = configure(config_mod.load({"RL_TRACE_OUTPUT_DIR": str(out)}))
    try:
        yield rec
    finally:
        reset()


def artifacts(kind: str) -> list[dict[str, Any]]:
    rec = get_recorder()
    assert rec is not None
    return [a for a in rec.record()["artifacts"] if a["kind"] == kind]


def profiler(rank: int = 0, *, enable: bool = True, prefix: str | None = "actor", **tool: Any) -> Any:
    save = tool.pop("save_path", "/nonexistent")
    tool_name = tool.pop("tool", None)
    cfg = ProfilerConfig(
        tool=tool_name,
        enable=enable,
        all_ranks=True,
        save_path=save,
        tool_config=TorchProfilerToolConfig(**tool),
    )
    return DistProfiler(rank=rank, config=cfg, save_file_prefix=prefix)


def busy(n: int = 3) -> int:
    """Python frames long enough to pass a 0-µs filter, short enough to be fast."""
    total = 0
    for i in range(n):
        total += sum(range(2000)) + i
    return total


# --------------------------------------------------------------------------- VizTracer window
@pytest.fixture
def window(recorder: Any) -> Iterator[VizTracerWindow]:
    names = ("start", "stop")
    before = {n: DistProfiler.__dict__[n] for n in names}
    win = VizTracerWindow(min_duration_us=0.0)
    cfg = config_mod.load({"RL_TRACE_VIZTRACER": "1"})
    assert viztracer_window.install(cfg, window=win)
    try:
        assert all(DistProfiler.__dict__[n] is not before[n] for n in names)
        yield win
    finally:
        viztracer_window.uninstall()
        assert all(DistProfiler.__dict__[n] is before[n] for n in names), "uninstall must restore originals"


def load_trace(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def test_window_lifecycle_writes_anchored_registered_file(window: VizTracerWindow) -> None:
    p = profiler(rank=3)
    assert window.state is State.IDLE
    p.start(role="train", profile_step=7)
    assert window.state is State.STARTED and p.check_this_step()
    busy()
    p.stop()
    assert window.state is State.STOPPED and not p.check_this_step()
    (path,) = window.saved
    assert path.name == f"viztracer_train_step7_rank3_pid{os.getpid()}.json"
    data = load_trace(path)
    assert isinstance(data["viztracer_metadata"]["baseTimeNanoseconds"], int)
    names = {e.get("name", "") for e in data["traceEvents"]}
    assert any("busy" in n for n in names), sorted(names)[:20]
    assert {e["pid"] for e in data["traceEvents"] if e.get("ph") == "X"} == {os.getpid()}
    (art,) = artifacts("viztracer")
    assert (art["path"], art["step"], art["role"], art["rank"]) == (path.name, 7, "train", 3)
    assert "aborted" not in art
    p.start(role="train", profile_step=8)  # stopped -> started again on the next profiled step
    p.stop()
    assert [x.name for x in window.saved][1].endswith(f"step8_rank3_pid{os.getpid()}.json")


def test_second_start_is_ignored_and_one_file_is_written(window: VizTracerWindow) -> None:
    p = profiler()
    p.start(role="train", profile_step=1)
    p.start(role="train", profile_step=2)  # VERL's own torch tool also ignores a second start
    assert window.state is State.STARTED
    p.stop()
    assert len(window.saved) == 1 and "step1" in window.saved[0].name
    assert window.state is State.STOPPED


def test_stop_without_start_touches_nothing_but_verl_still_stops(window: VizTracerWindow) -> None:
    p = profiler()
    p._this_step = True  # VERL's flag, which its own stop() clears
    p.stop()
    assert not p.check_this_step()
    assert window.state is State.IDLE and window.saved == []


def test_nested_windows_and_several_instances_share_one_window(window: VizTracerWindow) -> None:
    outer, inner, late = profiler(0, prefix="actor"), profiler(0, prefix="ref"), profiler(0, prefix="critic")
    outer.start(role="train", profile_step=4)
    inner.start(profile_step=4)
    inner.stop()
    assert window.state is State.STARTED and window.saved == []  # inner close keeps the window
    late.start(profile_step=4)
    outer.stop()  # the opener leaves first; the last owner saves
    assert window.state is State.STARTED and window.saved == []
    late.stop()
    (path,) = window.saved
    assert path.name.startswith("viztracer_train_step4_rank0_")  # named by the window's opener


def test_exception_in_verl_start_closes_the_window_and_propagates(window: VizTracerWindow) -> None:
    p = profiler()

    def broken_start(**_: Any) -> None:
        raise RuntimeError("backend failed")

    p._impl.start = broken_start
    with pytest.raises(RuntimeError, match="backend failed"):
        p.start(role="train", profile_step=5)
    assert window.state is State.STOPPED
    (art,) = artifacts("viztracer")
    assert art["aborted"] == "exception" and art["step"] == 5
    del p._impl.start  # the window works again afterwards
    p.start(role="train", profile_step=6)
    p.stop()
    assert len(window.saved) == 2


def test_exception_in_verl_stop_still_saves(window: VizTracerWindow) -> None:
    p = profiler()
    p.start(role="train", profile_step=2)

    def broken_stop() -> None:
        raise OSError("disk")

    p._impl.stop = broken_stop
    with pytest.raises(OSError, match="disk"):
        p.stop()
    assert window.state is State.STOPPED and len(window.saved) == 1


def test_exception_inside_the_window_with_try_finally(window: VizTracerWindow) -> None:
    p = profiler()
    with pytest.raises(ZeroDivisionError):
        p.start(role="train", profile_step=3)
        try:
            busy(1)
            _ = 1 / 0
        finally:
            p.stop()
    assert len(window.saved) == 1 and window.state is State.STOPPED


def test_roles_and_rank_selection(recorder: Any) -> None:
    win = VizTracerWindow(min_duration_us=0.0, roles=("e2e",))
    viztracer_window.install(config_mod.load({"RL_TRACE_VIZTRACER": "1"}), window=win)
    try:
        p = profiler()
        p.start(role="train", profile_step=1)
        p.stop()
        assert win.saved == []
        p.start(role="e2e", profile_step=1)
        p.stop()
        assert len(win.saved) == 1
        off = profiler(enable=False)
        off.start(role="e2e", profile_step=2)
        off.stop()
        assert len(win.saved) == 1  # VERL does not profile this rank, neither do we
        by_prefix = profiler(prefix="e2e")
        by_prefix.start(profile_step=3)
        by_prefix.stop()
        assert len(win.saved) == 2
    finally:
        viztracer_window.uninstall()


def test_uninstall_saves_an_open_window_and_restores_originals(recorder: Any) -> None:
    before = (DistProfiler.__dict__["start"], DistProfiler.__dict__["stop"])
    win = VizTracerWindow(min_duration_us=0.0)
    viztracer_window.install(config_mod.load({"RL_TRACE_VIZTRACER": "1"}), window=win)
    p = profiler()
    p.start(role="train", profile_step=9)
    viztracer_window.uninstall()
    assert (DistProfiler.__dict__["start"], DistProfiler.__dict__["stop"]) == before
    assert DistProfiler.__dict__["start"] is before[0] and DistProfiler.__dict__["stop"] is before[1]
    (art,) = artifacts("viztracer")
    assert art["aborted"] == "uninstall"
    p.stop()  # the original stop, no window
    assert len(win.saved) == 1


def test_viztracer_failure_never_reaches_training(recorder: Any, caplog: pytest.LogCaptureFixture) -> None:
    class BrokenTracer:
        enable = False

        def start(self) -> None:
            self.enable = True

        def stop(self) -> None:
            self.enable = False

        def save(self, *_: Any, **__: Any) -> None:
            raise OSError("no space left on device")

    win = VizTracerWindow(tracer_factory=lambda _us: BrokenTracer())
    viztracer_window.install(config_mod.load({"RL_TRACE_VIZTRACER": "1"}), window=win)
    try:
        p = profiler()
        p.start(role="train", profile_step=1)
        p.stop()  # must not raise
        assert win.state is State.STOPPED and win.saved == []
        assert "no space left" in caplog.text
        assert list(recorder.output_dir.glob("*.tmp.json")) == []  # no temp file left behind
    finally:
        viztracer_window.uninstall()


def test_without_switch_importing_register_patches_nothing(out_dir: Path) -> None:
    code = """
        from verl.utils.profiler import profile, config, torch_profile
        names = ("start", "stop", "annotate", "step", "__init__")
        before = [profile.DistProfiler.__dict__[n] for n in names]
        import rl_trace_observer.integrations.verl.register as reg
        assert all(profile.DistProfiler.__dict__[n] is b for n, b in zip(names, before))
        # capture on: torch-trace registration wraps the torch tool's module function, not DistProfiler
        assert torch_profile.get_torch_profiler.__wrapped__ is not None
        print(reg.INSTALLED)
    """
    proc = run_python(code, clean_env(RL_TRACE_OUTPUT_DIR=str(out_dir), VERL_USE_EXTERNAL_PLUGINS="none"))
    assert "'viztracer': False" in proc.stdout and "'step_markers': True" in proc.stdout


def test_capture_off_patches_nothing_at_all(tmp_path: Path) -> None:
    code = """
        from verl.utils.profiler import config, torch_profile
        before = (torch_profile.get_torch_profiler, config.relocate_rollout_traces)
        import rl_trace_observer.integrations.verl.register as reg
        import verl.trainer.ppo.v1.trainer_base as tb
        assert (torch_profile.get_torch_profiler, config.relocate_rollout_traces) == before
        assert not hasattr(tb.PPOTrainer._start_profiling, "__wrapped__")
        print(reg.INSTALLED)
    """
    proc = run_python(code, clean_env(VERL_USE_EXTERNAL_PLUGINS="none"), timeout=300)
    assert "'step_markers': False" in proc.stdout


# ----------------------------------------------------------------------- torch trace registration
@pytest.fixture
def torch_hooks(recorder: Any) -> Iterator[None]:
    import verl.utils.profiler as package
    from verl.utils.profiler import config as pconfig
    from verl.utils.profiler import torch_profile

    before = (
        torch_profile.get_torch_profiler,
        pconfig.relocate_rollout_traces,
        package.relocate_rollout_traces,
    )
    assert torch_traces.install()
    try:
        yield
    finally:
        torch_traces.uninstall()
        after = (
            torch_profile.get_torch_profiler,
            pconfig.relocate_rollout_traces,
            package.relocate_rollout_traces,
        )
        assert all(a is b for a, b in zip(after, before, strict=True))


def test_continuous_torch_trace_is_registered_with_step_role_rank(torch_hooks: None, tmp_path: Path) -> None:
    import torch

    p = profiler(rank=1, tool="torch", save_path=str(tmp_path / "profile"))
    p.start(role="train", profile_step=2)
    torch.ones(64, 64) @ torch.ones(64, 64)
    p.stop()
    (art,) = artifacts("torch")
    written = list((tmp_path / "profile").glob("*.json.gz"))
    assert len(written) == 1 and f"_pid{os.getpid()}_" in written[0].name
    assert art["path"] == str(written[0].resolve()) and art["outside_output_dir"] is True
    assert (art["step"], art["role"], art["rank"], art["scope"]) == (2, "actor", 1, "train")
    with gzip.open(written[0]) as fh:
        assert "baseTimeNanoseconds" in json.load(fh)


def test_discrete_torch_traces_one_per_stage(torch_hooks: None, recorder: Any) -> None:
    import torch

    save = recorder.output_dir / "profile"  # inside the output dir: registered with a relative path

    class Worker:
        def __init__(self) -> None:
            self.profiler = profiler(rank=0, tool="torch", save_path=str(save), discrete=True)

        @DistProfiler.annotate(role="actor_update")
        def update(self) -> Any:
            return torch.ones(8, 8).sum()

        @DistProfiler.annotate(role="actor_compute_log_prob")
        def log_prob(self) -> Any:
            return torch.ones(8, 8).mean()

    w = Worker()
    w.profiler.start(role="train", profile_step=3)
    w.log_prob()
    w.update()
    w.profiler.stop()
    arts = sorted(artifacts("torch"), key=lambda a: a["scope"])
    assert [(a["scope"], a["step"], a["role"], a["rank"]) for a in arts] == [
        ("actor_compute_log_prob", 3, "actor", 0),
        ("actor_update", 3, "actor", 0),
    ]
    assert all(a["path"].startswith("profile/") and "outside_output_dir" not in a for a in arts)


def test_relocated_and_unrelocated_rollout_traces(torch_hooks: None, tmp_path: Path) -> None:
    from verl.utils.profiler import relocate_rollout_traces  # the package re-export the servers import
    from verl.utils.profiler.config import rollout_trace_dir

    for relocate, replica in ((True, 1), (False, 2)):
        cfg = ProfilerConfig(
            tool="torch",
            enable=True,
            save_path=str(tmp_path / "p"),
            tool_config=None,
            relocate_results=relocate,
        )
        src = Path(rollout_trace_dir(cfg, replica))
        src.mkdir(parents=True)
        (src / "engine-rank-0.123.pt.trace.json.gz").write_bytes(b"x")
        relocate_rollout_traces(cfg, replica, 1)
    arts = {a["replica"]: a for a in artifacts("torch")}
    assert arts[1]["relocated"] is True and arts[1]["path"].endswith(
        "/p/rollout-replica1_engine-rank-0.123.pt.trace.json.gz"
    )
    assert arts[2]["relocated"] is False and "agent_loop_rollout_replica_2/" in arts[2]["path"]
    assert {(a["role"], a["rank"], a["step"]) for a in arts.values()} == {
        ("rollout", 1, None),
        ("rollout", 2, None),
    }


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "actor_train_step2_rank1-of-2_pid42_20260101120000123.json.gz",
            {"step": 2, "rank": 1, "world_size": 2, "pid": 42},
        ),
        (
            "actor_actor_update_step3_rank0-of-4_tp0-pp0-dp0_pid7_20260101120000123_mb0-1.json.gz",
            {"step": 3, "rank": 0, "world_size": 4, "pid": 7},
        ),
        ("ref_rank5_pid9_20260101120000123_part1.json.gz", {"rank": 5, "pid": 9}),
    ],
)
def test_trace_name_parsing(name: str, expected: dict[str, int]) -> None:
    assert torch_traces.parse_trace_name(name) == expected


def test_rollout_name_parsing() -> None:
    assert torch_traces.parse_rollout_name("rollout-replica4-globalrank8_x.json.gz") == {
        "replica": 4,
        "global_rank": 8,
    }
    assert torch_traces.parse_rollout_name("rollout-replica0_x.json.gz") == {"replica": 0}
    assert torch_traces.parse_rollout_name("actor_train_step1_rank0_pid1_1.json.gz") == {}


# --------------------------------------------------------------------------------- step markers
class _WorkerGroup:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def start_profile(self, **kw: Any) -> None:
        self.calls.append(("start", kw))

    def stop_profile(self, **kw: Any) -> None:
        self.calls.append(("stop", kw))


def _bare_trainer(cls: type, mode: str) -> Any:
    """A trainer object with just what ``_start/_stop_profiling`` read (no Ray, no model)."""
    from omegaconf import OmegaConf

    t = object.__new__(cls)
    t.config = OmegaConf.create({"global_profiler": {"steps": [2], "profile_continuous_steps": False}})
    t.trainer_mode, t.use_reference_policy, t.use_critic = mode, False, False
    t.actor_rollout_wg, t.total_training_steps = _WorkerGroup(), 3
    t.prev_step_profile, t.curr_step_profile = False, False
    t._rollout_server_managers = lambda: []
    return t


def test_step_markers_in_every_trainer_mode(recorder: Any) -> None:
    from verl.trainer.ppo.v1 import trainer_base

    originals = {
        n: trainer_base.PPOTrainer.__dict__[n] for n in ("_start_profiling", "_stop_profiling", "fit")
    }
    ticks: list[Any] = []
    hooks = steps._state["clock_hooks"]
    saved = dict(hooks)
    hooks["on_step"] = ticks.append  # the Ray clock sync's periodic measurement at unprofiled steps
    assert steps.install() and steps.installed()
    try:
        assert trainer_base.PPOTrainer.fit.__wrapped__ is originals["fit"]
        modes = dict(trainer_base.TRAINER_REGISTRY)
        assert {"sync", "colocate_async", "separate_async"} <= set(modes)
        for mode, cls in modes.items():  # one shared fit() loop calls the wrapped pair in every mode
            assert "fit" not in vars(cls) and "_start_profiling" not in vars(cls), mode
            t = _bare_trainer(cls, mode)
            for step in (1, 2, 3):  # what fit() does around self.step(); VERL updates curr_step_profile
                t.global_steps = step
                t._start_profiling()
                time.sleep(0.002)
                t._stop_profiling()
            assert [c[0] for c in t.actor_rollout_wg.calls] == ["start", "stop"]  # VERL's own logic ran
        recorder.events.flush()  # the event log batches lines for up to 100 ms
        logs = recorder.output_dir.glob("rl-insight-*.chrome.jsonl")
        events = [json.loads(line) for p in logs for line in p.read_text().splitlines()]
        marks = [e for e in events if e.get("name") == "global_step"]
        assert len(marks) == 3 * len(modes)
        by_mode = {
            m: [(e["args"]["step"], e["args"]["profiled"]) for e in marks if e["args"]["trainer_mode"] == m]
            for m in modes
        }
        assert all(v == [(1, False), (2, True), (3, False)] for v in by_mode.values()), by_mode
        assert all(e["dur_ns"] >= 2_000_000 and e["cat"] == "verl" for e in marks)
        snaps = [s for s in recorder.record()["clock_snapshots"] if s["reason"] in ("step_begin", "step_end")]
        assert [(s["reason"], s["step"]) for s in snaps] == [("step_begin", 2), ("step_end", 2)] * len(modes)
        assert recorder.record()["role"] == "trainer"
        assert ticks == [1, 3] * len(modes)  # the unprofiled steps
    finally:
        steps.uninstall()
        hooks.clear()
        hooks.update(saved)
    assert all(trainer_base.PPOTrainer.__dict__[n] is f for n, f in originals.items())


def test_fit_measures_clocks_at_its_start_and_end_however_it_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wrapped ``fit`` queues the capture-start measurement, then always the end-of-training
    one, even when training raises; a failing hook never reaches training."""
    calls: list[str] = []
    monkeypatch.setitem(steps._state, "clock_hooks", {
        "on_capture_start": lambda: calls.append("start"),
        "on_training_end": lambda: calls.append("end"),
    })  # fmt: skip

    def fit(self: Any, agent_loop_manager: Any) -> str:
        calls.append(f"fit {agent_loop_manager}")
        if agent_loop_manager == "boom":
            raise RuntimeError("training failed")
        return "done"

    wrapped = steps._wrap_fit(fit)
    assert wrapped(object(), "alm") == "done" and calls == ["start", "fit alm", "end"]
    calls.clear()
    with pytest.raises(RuntimeError, match="training failed"):
        wrapped(object(), agent_loop_manager="boom")
    assert calls == ["start", "fit boom", "end"]

    def broken() -> None:
        raise OSError("no clock today")

    monkeypatch.setitem(steps._state, "clock_hooks", {"on_capture_start": broken, "on_training_end": broken})
    assert wrapped(object(), "alm") == "done"


# ------------------------------------------------------------------------------------ contract
def test_contract_holds_for_the_installed_verl() -> None:
    assert contract.check_all() == []


def test_contract_mismatch_is_one_clear_error_and_import_verl_survives(tmp_path: Path) -> None:
    code = """
        import logging, sys
        logging.basicConfig(level=logging.INFO, stream=sys.stdout)
        from verl.utils.profiler import torch_profile
        def get_torch_profiler(contents, save_path):  # an incompatible future VERL
            raise AssertionError("never called")
        torch_profile.get_torch_profiler = get_torch_profiler
        import rl_trace_observer.integrations.verl.register  # what VERL's plugin loading imports
        import verl.trainer.main_ppo  # and VERL goes on working
        assert torch_profile.get_torch_profiler is get_torch_profiler  # left alone
        print("IMPORT-OK")
    """
    env = clean_env(RL_TRACE_OUTPUT_DIR=str(tmp_path), VERL_USE_EXTERNAL_PLUGINS="none")
    proc = run_python(code, env)
    errors = [line for line in proc.stdout.splitlines() if "does not have the surface" in line]
    assert "IMPORT-OK" in proc.stdout and len(errors) == 1, proc.stdout
    assert "verl 0.9.1" in errors[0] and "get_torch_profiler: has no parameter" in errors[0]
    assert "torch trace registration is off" in errors[0]


@settings(max_examples=200, deadline=None)
@given(
    rank=st.integers(0, 4096),
    world=st.one_of(st.none(), st.integers(1, 4096)),
    step=st.one_of(st.none(), st.integers(0, 10**6)),
    role=st.one_of(st.none(), st.text(min_size=1, max_size=12)),
    prefix=st.one_of(
        st.none(), st.sampled_from(["actor", "ref", "critic", "actor_rollout", "x_step9_rank3"])
    ),
    parallel=st.booleans(),
)
def test_trace_names_from_verls_own_builder_round_trip(
    rank: int, world: int | None, step: int | None, role: str | None, prefix: str | None, parallel: bool
) -> None:
    """Our parser against VERL's real ``build_trace_basename``, whatever the role text contains."""
    from verl.utils.profiler.torch_profile import build_trace_basename

    topology: dict[str, int] = {"rank": rank} | ({"world_size": world} if world else {})
    if parallel:
        topology |= {"tp": 1, "pp": 0, "dp": 3, "cp": 0}
    name = build_trace_basename(
        rank, role=role, save_file_prefix=prefix, topology=topology, profile_step=step
    )
    parsed = torch_traces.parse_trace_name(name + "_part1.json.gz")
    expected = {"rank": rank, "pid": os.getpid()} | ({"world_size": world} if world else {})
    if step is not None:
        expected["step"] = step
    assert {k: parsed.get(k) for k in expected} == expected, name


def test_post_import_hook_fires_once_and_never_breaks_the_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib
    import sys

    from rl_trace_observer.integrations.verl import import_hooks

    (tmp_path / "rlto_probe_mod.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[int] = []
    try:
        import_hooks.when_imported("rlto_probe_mod", lambda m: seen.append(m.VALUE))
        import_hooks.when_imported("rlto_probe_mod", lambda m: 1 / 0)  # a broken hook is only logged
        module = importlib.import_module("rlto_probe_mod")
        assert module.VALUE == 41 and seen == [41]
        importlib.reload(module)
        assert seen == [41]  # once
        import_hooks.when_imported("rlto_probe_mod", lambda m: seen.append(m.VALUE + 1))
        assert seen == [41, 42]  # already imported: immediately
    finally:
        sys.modules.pop("rlto_probe_mod", None)
        import_hooks.forget("rlto_probe_mod")
