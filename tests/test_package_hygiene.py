"""Importing the core pulls in nothing heavy and changes nothing; the README lists every setting."""

from __future__ import annotations

import json
import re

import pytest

from rl_trace_observer import config as config_mod

from .conftest import ROOT, clean_env, run_python

HEAVY = ("torch", "ray", "verl", "rl_insight", "omegaconf", "pandas", "numpy", "viztracer")


@pytest.mark.parametrize(
    "module",
    [
        "rl_trace_observer",
        "rl_trace_observer.config",
        "rl_trace_observer.capture",
        "rl_trace_observer.merge",
        "rl_trace_observer.integrations.rl_insight",
    ],
)
def test_core_import_is_light_and_side_effect_free(module: str) -> None:
    code = f"""
        import json, os, sys, logging
        env_before = dict(os.environ)
        handlers_before = list(logging.getLogger().handlers)
        import {module}
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
        print(json.dumps({{"heavy": heavy, "env_changed": dict(os.environ) != env_before,
                          "logging_changed": logging.getLogger().handlers != handlers_before}}))
    """
    result = json.loads(run_python(code, clean_env()).stdout)
    assert result == {"heavy": [], "env_changed": False, "logging_changed": False}


def test_merge_never_imports_frameworks_anywhere() -> None:
    """Static check: no module under merge/ or capture/ names torch, verl or ray in an import."""
    pattern = re.compile(r"^\s*(import|from)\s+(torch|verl|ray|rl_insight)\b", re.M)
    for folder in ("capture", "merge"):
        for path in (ROOT / "src" / "rl_trace_observer" / folder).rglob("*.py"):
            assert not pattern.search(path.read_text()), f"{path} imports a framework"


def test_readme_lists_every_setting() -> None:
    readme = (ROOT / "README.md").read_text()
    assert config_mod.markdown_table() in readme, "regenerate with: rl-trace config --markdown"


def test_config_validation_is_one_line_per_problem() -> None:
    cfg = config_mod.load(
        {
            "RL_TRACE_OUTPUT_DIR": "rel/dir",
            "RL_TRACE_VIZTRACER": "maybe",
            "RL_TRACE_VIZTRACER_MIN_DURATION_US": "-3",
            "RL_TRACE_RECORD_INTERVAL_S": "nan",
            "RL_TRACE_OUTPT_DIR": "/typo",
        }
    )
    assert cfg.output_dir is None and cfg.viztracer is False
    assert cfg.viztracer_min_duration_us == 100.0 and cfg.record_interval_s == 1.0
    assert len(cfg.problems) == 5
    assert all("\n" not in p for p in cfg.problems)
    assert any("RL_TRACE_OUTPT_DIR is not a known setting" in p for p in cfg.problems)


def test_config_reads_valid_values() -> None:
    cfg = config_mod.load(
        {
            "RL_TRACE_OUTPUT_DIR": "/tmp/x",
            "RL_TRACE_FORWARD_TO_RL_INSIGHT": "1",
            "RL_TRACE_VIZTRACER": "true",
            "RL_TRACE_VIZTRACER_MIN_DURATION_US": "250",
            "RL_TRACE_VIZTRACER_ROLES": "e2e, actor",
        }
    )
    assert cfg.capture_enabled and cfg.forward_to_rl_insight and cfg.viztracer
    assert cfg.viztracer_min_duration_us == 250.0 and cfg.viztracer_roles == ("e2e", "actor")
    assert cfg.problems == ()
