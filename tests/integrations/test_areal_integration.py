"""The AReaL anchor, in-process, on AReaL's own ``perf_tracer`` module: off unless enabled,
reversible, exact, and never AReaL's problem."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from rl_trace_observer import config as config_mod
from rl_trace_observer.capture import configure, get_recorder, reset
from rl_trace_observer.integrations.areal import anchor
from rl_trace_observer.testing.areal import WHEEL_MISSING as AREAL_WHEEL_MISSING
from rl_trace_observer.testing.areal import PerfTracerConfig, find_wheel, load_tracer, unpack_tracer

WHEEL = find_wheel()
pytestmark = pytest.mark.skipif(WHEEL is None, reason=AREAL_WHEEL_MISSING)


@pytest.fixture
def perf_tracer(tmp_path: Path) -> Iterator[ModuleType]:
    """AReaL's module, imported fresh (the import hook must see the import)."""
    assert WHEEL is not None
    root = unpack_tracer(WHEEL, tmp_path / "tracer")
    for name in [n for n in sys.modules if n == "areal" or n.startswith("areal.")]:
        del sys.modules[name]
    out = tmp_path / "out"
    out.mkdir()
    reset()
    configure(config_mod.load({"RL_TRACE_OUTPUT_DIR": str(out), "RL_TRACE_METRICS": "0"}))
    try:
        yield root  # type: ignore[misc]
    finally:
        anchor.uninstall()
        module = sys.modules.get(anchor.MODULE)
        if module is not None:
            module.reset()
        for name in [n for n in sys.modules if n == "areal" or n.startswith("areal.")]:
            del sys.modules[name]
        reset()


def _config(tmp: Path) -> PerfTracerConfig:
    return PerfTracerConfig(experiment_name="e", trial_name="t", fileroot=str(tmp / "areal"), enabled=True)


def test_the_setting_is_off_by_default_and_read_in_config() -> None:
    assert config_mod.load({}).areal is False
    assert config_mod.load({"RL_TRACE_AREAL": "1"}).areal is True
    assert config_mod.load({"RL_TRACE_AREAL": "maybe"}).problems


def test_off_nothing_is_patched(perf_tracer: Any, tmp_path: Path) -> None:
    assert anchor.install(False) is False
    pt = load_tracer(perf_tracer)
    assert not hasattr(pt.configure, "__rl_trace_wrapped__")


def test_on_configure_records_the_origin_exactly_and_uninstall_puts_it_back(
    perf_tracer: Any, tmp_path: Path
) -> None:
    assert anchor.install(True)
    pt = load_tracer(perf_tracer)  # imported after install: the hook patches it on import
    original = pt.configure.__rl_trace_wrapped__
    tracer = pt.configure(_config(tmp_path), rank=2, role="actor")
    p0 = time.perf_counter_ns()
    wall = time.time_ns()
    truth = wall - (p0 - tracer._origin_ns)
    rec = get_recorder()
    assert rec is not None
    (snap,) = [s for s in rec.record()["clock_snapshots"] if s["reason"] == anchor.SNAPSHOT_REASON]
    assert (snap["rank"], snap["role"], snap["perf_origin_ns"]) == (2, "actor", tracer._origin_ns)
    assert abs(snap["anchor_ns"] - truth) < 2_000_000  # the same instant, read twice (a loaded machine)
    (art,) = [a for a in rec.record()["artifacts"] if a["kind"] == anchor.PERF_KIND]
    assert (
        art["anchor_ns"] == snap["anchor_ns"] and art["optional"] and art["path"].endswith("traces-r2.jsonl")
    )
    assert rec.record()["rank"] == 2
    anchor.uninstall()
    assert pt.configure is original


def test_a_failing_recorder_never_reaches_areal(perf_tracer: Any, tmp_path: Path, monkeypatch: Any) -> None:
    def broken() -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(anchor, "get_recorder", broken)
    anchor.install(True)
    pt = load_tracer(perf_tracer)
    tracer = pt.configure(_config(tmp_path), rank=0, role="rollout")
    assert tracer is pt.get_tracer()


def test_a_disabled_tracer_gets_its_anchor_but_registers_no_file(perf_tracer: Any, tmp_path: Path) -> None:
    """AReaL configures its tracer whenever the config has a perf_tracer section, enabled or not."""
    anchor.install(True)
    pt = load_tracer(perf_tracer)
    config = _config(tmp_path)
    config.enabled = False
    pt.configure(config, rank=0, role="master")
    rec = get_recorder()
    assert rec is not None
    assert [s for s in rec.record()["clock_snapshots"] if s["reason"] == anchor.SNAPSHOT_REASON]
    assert not [a for a in rec.record()["artifacts"] if a["kind"] == anchor.PERF_KIND]
