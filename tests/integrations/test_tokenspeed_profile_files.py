"""TokenSpeed profile windows on disk: which names are which, and when a window is complete."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trace_observer import config as config_mod
from rl_trace_observer.integrations.tokenspeed.launcher import ServeSpec
from rl_trace_observer.integrations.tokenspeed.profile_files import (
    WindowWait,
    expected_kinds,
    parse,
    writer_pid,
)
from rl_trace_observer.testing.tokenspeed import TokenSpeedSpec, write_profile

from ..conftest import requires

SUFFIXES = {
    ".viztracer.json": "viztracer",
    ".proton.chrome_trace": "proton",
    ".proton.part_3.chrome_trace": "proton",
    ".proton.hatchet": "proton",
    ".trace.json.gz": "torch",
    ".expert-load.pt": "tokenspeed_expert_load",
}


@settings(max_examples=200, deadline=None)
@given(
    profile_id=st.from_regex(r"[0-9A-Za-z][0-9A-Za-z_.-]{0,20}", fullmatch=True),
    tp=st.integers(0, 63),
    dp=st.none() | st.integers(0, 7),
    suffix=st.sampled_from(sorted(SUFFIXES)),
)
def test_names_parse_back(profile_id: str, tp: int, dp: int | None, suffix: str) -> None:
    tag = (f"DP{dp}-" if dp is not None else "") + f"TP{tp}"
    info = parse(Path(f"{profile_id}-{tag}{suffix}"))
    assert info is not None
    assert (info.kind, info.tag, info.tp, info.dp) == (SUFFIXES[suffix], tag, tp, dp)
    assert parse(Path(f".{profile_id}-{tag}{suffix}.tmp")) is None  # a file still being written elsewhere
    mem = parse(Path(f"{profile_id}-{tag}-memory.pickle"))
    assert mem is not None and mem.kind == "tokenspeed_memory"


@given(name=st.text(max_size=40))
def test_other_names_are_not_profile_files(name: str) -> None:
    info = parse(Path(name.replace("/", "_") or "x"))
    assert info is None or "TP" in name


def test_expected_kinds_follow_the_activities() -> None:
    assert expected_kinds(["VIZTRACER", "PROTON"]) == {"viztracer", "proton"}
    assert expected_kinds(["CPU", "GPU", "CUDA_PROFILER"]) == {"torch"}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_window_completes_only_when_every_rank_is_closed_and_stable(tmp_path: Path) -> None:
    clock = Clock()
    wait = WindowWait(tmp_path, {"viztracer", "proton"}, ranks=2, stall_timeout_s=30, clock=clock)
    files = write_profile(
        tmp_path, TokenSpeedSpec(profile_id="20260101-000000", ranks=2, events_per_rank=200)
    )
    viz1 = files[1].viztracer
    whole = viz1.read_bytes()
    viz1.write_bytes(whole[: len(whole) // 2])  # rank 1 still saving its report
    assert wait.poll() == []  # first sight: sizes recorded, nothing trusted yet
    done = {f.path.name for f in wait.poll()}
    assert done == {files[0].viztracer.name, files[0].proton[0].name, files[1].proton[0].name}
    assert "viztracer: 1 of 2 ranks" in wait.missing() and not wait.done
    clock.now = 29
    assert not wait.stalled
    viz1.write_bytes(whole)
    assert wait.poll() == [] and wait.poll()[0].path == viz1
    assert wait.done
    assert writer_pid(viz1) == files[1].pid


def test_a_stalled_window_says_what_is_missing(tmp_path: Path) -> None:
    clock = Clock()
    wait = WindowWait(tmp_path, {"viztracer", "proton"}, ranks=2, stall_timeout_s=30, clock=clock)
    write_profile(tmp_path, TokenSpeedSpec(profile_id="p", ranks=1, events_per_rank=100))
    wait.poll(), wait.poll()
    clock.now = 31
    assert wait.stalled and wait.missing() == ["proton: 1 of 2 ranks", "viztracer: 1 of 2 ranks"]


def test_settings_and_command_line() -> None:
    cfg = config_mod.load(
        {
            "RL_TRACE_TOKENSPEED_COMMAND": "/venv/bin/python -m tokenspeed.cli serve",
            "RL_TRACE_TOKENSPEED_ARGS": "--enforce-eager --max-model-len 4096",
            "RL_TRACE_TOKENSPEED_PROFILE_ACTIVITIES": "viztracer,PROTON,bogus",
            "RL_TRACE_TOKENSPEED_STARTUP_TIMEOUT_S": "-1",
        }
    )
    assert cfg.tokenspeed_profile_activities == ("VIZTRACER", "PROTON")
    assert cfg.tokenspeed_startup_timeout_s == 1800.0 and len(cfg.problems) == 2
    argv = ServeSpec(
        model="/m",
        tp=2,
        port=1,
        control_port=2,
        command=cfg.tokenspeed_command,
        extra_args=cfg.tokenspeed_args,
    ).argv()
    assert argv[:4] == ["/venv/bin/python", "-m", "tokenspeed.cli", "serve"]
    assert argv[-3:] == ["--enforce-eager", "--max-model-len", "4096"]
    assert "--enable-output-logprobs" in argv and argv[argv.index("--tp") + 1] == "2"
    assert config_mod.load({"RL_TRACE_TOKENSPEED_PROFILE_ACTIVITIES": ""}).tokenspeed_profile_activities == ()


@requires("torch")
@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(1, 64), max_size=30), limit=st.integers(1, 100))
def test_weight_buckets_keep_order_and_respect_the_limit(sizes: list[int], limit: int) -> None:
    import asyncio

    import torch

    from rl_trace_observer.integrations.tokenspeed.weights import bucket_body, buckets, nbytes

    tensors = [(f"w{i}", torch.zeros(n, dtype=torch.uint8)) for i, n in enumerate(sizes)]

    async def source() -> Any:
        for item in tensors:
            yield item

    async def collect() -> list[list[tuple[str, Any]]]:
        return [b async for b in buckets(source(), limit)]

    out = asyncio.run(collect())
    assert [name for b in out for name, _ in b] == [name for name, _ in tensors]
    assert all(b for b in out)
    assert all(len(b) == 1 or sum(nbytes(t) for _, t in b) <= limit for b in out)
    for b in out:
        body = bucket_body(b, "g", 3)
        assert body["dtypes"] == ["uint8"] * len(b) and body["weight_version"] == "3"
        assert body["shapes"] == [[nbytes(t)] for _, t in b] and body["flush_cache"] is False
