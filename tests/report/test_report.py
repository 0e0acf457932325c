"""``rl-trace report``: every number checked exactly against a constructed merged trace.

The trace (:func:`write_fixture`) is shaped like the merger's output (process names
``host · pid N · role rank R``, ``RL-Insight · <lane>`` threads, labelled counters) with known
durations: step 1 is synchronous with a straggling rank and replica, step 2 overlaps rollout and
training and has a generation span that crosses the end of the last step. Times are written with
3 decimals (as writers emit) on an offset whose float sum is not exact, and one span lasts a
non-integer number of µs, so any float arithmetic in the report would show.
"""

from __future__ import annotations

import ast
import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trace_observer.analysis.answers import intervals as iv
from rl_trace_observer.analysis.report.compute import SCHEMA, build_summary
from rl_trace_observer.analysis.report.inputs import artifacts_section, clock_section
from rl_trace_observer.analysis.report.load import TraceError, load_trace, split_labels
from rl_trace_observer.analysis.report.output import summarize, write_outputs
from rl_trace_observer.analysis.report.stages import (
    CATEGORIES,
    STAGE_TABLE,
    classify,
    is_sync_root,
    is_weight_load,
)

MS = 1_000_000  # ns
T0_US = 5_000_000.001  # an offset that makes float sums inexact
XSS = "<script>alert(1)</script>"
MARKUP = "[bold red]not markup[/bold red]"

PROCESSES = {
    256: "node-a · pid 100 · driver",
    512: "node-a · pid 200 · trainer rank 0 (trainer_0)",
    768: "node-a · pid 201 · trainer rank 1 (trainer_1)",
    1024: "node-b · pid 300 · trainer rank 2 (trainer_2)",
    1280: "node-b · pid 301 · rollout replica 0 (rollout_0)",
    1536: "node-b · pid 302 · rollout replica 1 (rollout_1)",
    642: "node-a · pid 200 · trainer rank 0 (trainer_0) · Spans",
}
LANES = {
    256: "global_step",
    512: "rank_0",
    768: "rank_1",
    1024: "rank_2",
    1280: "replica_0",
    1536: "replica_1",
}
RL_TID = 268435457
TORCH_TID = 536901907

# (pid, name, start ms, duration ms) on the process's RL-Insight lane.
STAGES: list[tuple[int, str, float, float]] = [
    # step 1: [0, 1000) ms, synchronous
    (512, "update_weights", 0, 10),
    (1280, "update_weights", 2, 6.000001),  # 6 ms + 1 ns
    (1536, "update_weights", 2, 7),
    (1280, "vllm_generate", 10, 400),
    (1536, "vllm_generate", 10, 500),  # straggling replica
    (512, "actor_compute_log_prob", 520, 50),
    (768, "actor_compute_log_prob", 520, 50),
    (1024, "actor_compute_log_prob", 520, 100),  # straggling rank
    (512, "actor_update", 620, 280),
    (768, "actor_update", 620, 280),
    (1024, "actor_update", 620, 330),
    (512, "my_custom_stage", 950, 10),  # unknown name: "other"
    # step 2: [1000, 2000) ms, rollout overlaps training
    (1280, "vllm_generate", 1000, 600),
    (1536, "vllm_generate", 1000, 500),
    (512, "actor_compute_log_prob", 1100, 100),
    (768, "actor_compute_log_prob", 1100, 100),
    (1024, "actor_compute_log_prob", 1100, 100),
    (512, "actor_update", 1200, 500),
    (768, "actor_update", 1200, 500),
    (1024, "actor_update", 1200, 500),
    (512, XSS, 1750, 10),
    (768, XSS, 1750, 10),  # on two lanes, so it is listed among the stragglers too
    (768, MARKUP, 1750, 5),
    (1536, "vllm_generate", 1900, 200),  # crosses the end of the last step: 100 ms inside
]


def _us(ms: float) -> float:
    return float(f"{T0_US + ms * 1000:.3f}")


def _dur(ms: float) -> float:
    return float(f"{ms * 1000:.3f}")


def fixture_events() -> list[dict[str, Any]]:
    ev: list[dict[str, Any]] = []
    for pid, name in PROCESSES.items():
        ev.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
    for pid, lane in LANES.items():
        ev.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": pid,
                "tid": RL_TID,
                "args": {"name": f"RL-Insight · {lane}"},
            }
        )
    ev.append(
        {
            "ph": "M",
            "name": "thread_name",
            "pid": 512,
            "tid": TORCH_TID,
            "args": {"name": "Torch · thread 200"},
        }
    )
    for step, (lo, mode) in enumerate([(0, "sync"), (1000, "async")], start=1):
        args = {"step": step, "profiled": step == 2, "mode": mode}
        ev.append(
            {
                "ph": "X",
                "name": "global_step",
                "cat": "rl_insight",
                "pid": 256,
                "tid": RL_TID,
                "ts": _us(lo),
                "dur": _dur(1000),
                "args": {**args, "state_lane_id": "global_step"},
            }
        )
    for pid, name, start, dur in STAGES:
        args = {"state_lane_id": LANES[pid], "state_name": name, "monitor.trace_segment": "state_interval"}
        ev.append(
            {
                "ph": "X",
                "name": name,
                "cat": "rl_insight",
                "pid": pid,
                "tid": RL_TID,
                "ts": _us(start),
                "dur": _dur(dur),
                "args": args,
            }
        )
    # Profiler spans: never part of the breakdown, even when named like a stage.
    ev.append(
        {
            "ph": "X",
            "name": "aten::mm",
            "cat": "cpu_op",
            "pid": 512,
            "tid": TORCH_TID,
            "ts": _us(50),
            "dur": _dur(1900),
            "args": {"External id": 1},
        }
    )
    ev.append(
        {
            "ph": "X",
            "name": "actor_update",
            "cat": "user_annotation",
            "pid": 512,
            "tid": TORCH_TID,
            "ts": _us(600),
            "dur": _dur(390),
        }
    )
    ev.append({"ph": "B", "name": "ProfilerStep#2", "pid": 642, "tid": 1, "ts": _us(1000)})
    ev.append({"ph": "E", "pid": 642, "tid": 1, "ts": _us(1800)})
    for value, rank, step, at in [(0.5, 0, 1, 900), (1.5, 1, 1, 901), (2.0, 0, 2, 1700)]:
        ev.append(
            {
                "ph": "C",
                "name": f"actor/pg_loss{{rank={rank},step={step}}}",
                "cat": "rl_insight.gauge",
                "pid": 512 + 256 * rank,
                "tid": 268435456,
                "ts": _us(at),
                "args": {"value": value},
            }
        )
    ev.append(
        {
            "ph": "C",
            "name": "critic/score",
            "pid": 256,
            "tid": 268435456,
            "ts": _us(1500),
            "args": {"value": 3},
        }
    )
    ev.append(
        {
            "ph": "C",
            "name": "critic/score",
            "pid": 256,
            "tid": 268435456,
            "ts": _us(2500),
            "args": {"value": 9},
        }
    )
    return ev


def write_fixture(path: Path, layout: str = "lines", manifest: dict[str, Any] | None = None) -> Path:
    """Write the constructed trace: ``lines`` (one event per line, like streaming writers),
    ``oneline`` (one JSON document on one line) or ``array`` (a bare ``[`` array, no closing)."""
    events = fixture_events()
    top = {"rl_trace_observer": {"schema": "rl-trace-merge/1", "base_ns": 0, "clock": "wall"}}
    if layout == "lines":
        body = (
            json.dumps(top)[:-1] + ',"traceEvents":[\n' + ",\n".join(json.dumps(e) for e in events) + "\n]}\n"
        )
    elif layout == "oneline":
        body = json.dumps({**top, "traceEvents": events})
    elif layout == "array":
        body = "[\n" + ",\n".join(json.dumps(e) for e in events) + ",\n"
    else:
        raise ValueError(layout)
    data = body.encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    if manifest is not None:
        Path(f"{path}.manifest.json").write_text(json.dumps(manifest))
    return path


def fixture_manifest() -> dict[str, Any]:
    return {
        "schema": "rl-trace-merge-manifest/1",
        "status": "partial",
        "timeline": {
            "clock": {
                "mode": "aligned",
                "reference": {"host": "node-a", "pid": 100},
                "tolerance_us": 1000.0,
                "worst_uncertainty_ns": 150_000,
                "hosts": {
                    "node-a": {"method": "reference", "applied": False, "offset_ns": 0, "uncertainty_ns": 0},
                    "node-b": {
                        "method": "ray_ntp",
                        "applied": True,
                        "offset_ns": -120_004_000,
                        "uncertainty_ns": 150_000,
                        "drift_ppm": 1.5,
                    },
                },
                "causality": {"checked": 12, "failed": 0},
            }
        },
        "artifacts": [
            {"path": "a/rl-insight-1.jsonl", "kind": "rl_insight", "complete": True, "selected": True},
            {"path": "a/rl-insight-2.jsonl", "kind": "rl_insight", "complete": False, "selected": True},
            {"path": "a/torch.json.gz", "kind": "torch", "complete": True, "selected": True},
            {
                "path": "a/old.json.gz",
                "kind": "torch",
                "complete": True,
                "selected": False,
                "skip_reason": "step 9",
            },
            {"path": "a/rec.json", "kind": "process_record", "complete": True, "selected": False},
        ],
        "problems": [
            {"kind": "incomplete", "path": "a/rl-insight-2.jsonl", "detail": "last line cut"},
            {"kind": "missing", "path": "a/rec.json", "detail": "registers b.json.gz"},
        ],
        "counts": {"events_kept": 10},
    }


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = write_fixture(tmp_path_factory.mktemp("rep") / "merged.json.gz", manifest=fixture_manifest())
    return summarize(path)


def _rank(step: dict[str, Any], lane: str) -> dict[str, int]:
    return next(r["time_ns"] for r in step["ranks"] if r["lane"] == lane)


# ----------------------------------------------------------------------------- exact numbers
def test_steps_come_from_markers(summary: dict[str, Any]) -> None:
    steps = summary["steps"]
    assert [s["step"] for s in steps] == [1, 2]
    assert [s["dur_ns"] for s in steps] == [1000 * MS, 1000 * MS]
    assert [s["profiled"] for s in steps] == [False, True]
    assert [s["mode"] for s in steps] == ["sync", "async"]
    assert summary["source"]["stage_source"] == "rl_insight"
    assert summary["schema"] == SCHEMA


def test_per_rank_breakdown_step1(summary: dict[str, Any]) -> None:
    s1 = summary["steps"][0]
    assert _rank(s1, "rank_0") == {
        "generation": 0,
        "log_prob": 50 * MS,
        "update": 280 * MS,
        "weight_sync": 10 * MS,
        "other": 10 * MS,
        "idle": 650 * MS,
    }
    assert _rank(s1, "rank_2") == {
        "generation": 0,
        "log_prob": 100 * MS,
        "update": 330 * MS,
        "weight_sync": 0,
        "other": 0,
        "idle": 570 * MS,
    }
    r0 = _rank(s1, "replica_0")
    assert r0["weight_sync"] == 6 * MS + 1 and r0["generation"] == 400 * MS
    assert r0["idle"] == 1000 * MS - 400 * MS - 6 * MS - 1  # exact to the nanosecond
    assert [r["role"] for r in s1["ranks"]] == ["rollout", "rollout", "trainer", "trainer", "trainer"]


def test_profiler_spans_named_like_stages_do_not_count(summary: dict[str, Any]) -> None:
    # aten::mm (1.9 s) and a Torch "actor_update" annotation sit on rank 0's process.
    assert _rank(summary["steps"][0], "rank_0")["update"] == 280 * MS
    assert {r["lane"] for s in summary["steps"] for r in s["ranks"]} == {
        "rank_0",
        "rank_1",
        "rank_2",
        "replica_0",
        "replica_1",
    }


def test_role_means(summary: dict[str, Any]) -> None:
    trainer = next(r for r in summary["steps"][0]["roles"] if r["role"] == "trainer")
    assert trainer["ranks"] == 3
    assert trainer["total_ns"]["update"] == (280 + 280 + 330) * MS
    assert trainer["mean_ns"]["log_prob"] == pytest.approx(200 * MS / 3)


def test_window_clipping_and_idle_step2(summary: dict[str, Any]) -> None:
    s2 = summary["steps"][1]
    assert _rank(s2, "replica_1") == {
        **dict.fromkeys(CATEGORIES, 0),
        "generation": 600 * MS,
        "idle": 400 * MS,
    }
    assert _rank(s2, "rank_0")["other"] == 10 * MS  # the XSS-named span, counted like any unknown name


def test_overlap(summary: dict[str, Any]) -> None:
    assert summary["steps"][0]["overlap"] == {
        "generation_only_ns": 500 * MS,
        "training_only_ns": 430 * MS,
        "both_ns": 0,
        "neither_ns": 70 * MS,
    }
    assert summary["steps"][1]["overlap"] == {
        "generation_only_ns": 200 * MS,
        "training_only_ns": 100 * MS,
        "both_ns": 500 * MS,
        "neither_ns": 200 * MS,
    }
    run = summary["overlap"]
    assert run["both_ns"] == 500 * MS and sum(run.values()) == 2000 * MS


def test_stragglers(summary: dict[str, Any]) -> None:
    rows = {(r["step"], r["stage"]): r for r in summary["stragglers"]}
    lp = rows[(1, "actor_compute_log_prob")]
    assert (lp["slowest_lane"], lp["slowest_ns"], lp["median_ns"], lp["lag_ns"], lp["lanes"]) == (
        "rank_2",
        100 * MS,
        50 * MS,
        50 * MS,
        3,
    )
    assert lp["lag_pct"] == 100.0
    gen = rows[(1, "vllm_generate")]
    assert (gen["slowest_lane"], gen["median_ns"], gen["lag_ns"]) == ("replica_1", 450 * MS, 50 * MS)
    up2 = rows[(2, "actor_update")]
    assert up2["lag_ns"] == 0 and up2["slowest_lane"] == "rank_0"  # ties: the first lane in natural order
    lags = [r["lag_ns"] for r in summary["stragglers"]]
    assert lags == sorted(lags, reverse=True)


def test_longest_spans_any_source(summary: dict[str, Any]) -> None:
    top = summary["longest_spans"][0]
    assert (top["name"], top["dur_ns"], top["cat"]) == ("aten::mm", 1900 * MS, "cpu_op")
    assert top["process"] == PROCESSES[512] and top["thread"] == "Torch · thread 200" and top["step"] == 1
    names = [s["name"] for s in summary["longest_spans"]]
    assert "ProfilerStep#2" in names  # B/E pairs become spans too
    assert len(names) == 10


def test_metrics_per_step(summary: dict[str, Any]) -> None:
    by_name = {m["name"]: {r["step"]: r for r in m["steps"]} for m in summary["metrics"]}
    loss = by_name["actor/pg_loss"]
    assert loss[1]["mean"] == 1.0 and loss[1]["count"] == 2 and loss[1]["last"] == 1.5
    assert loss[2]["mean"] == 2.0
    assert set(by_name["critic/score"]) == {2}  # by window; the sample after the last step is dropped


def test_clock_and_artifacts(summary: dict[str, Any]) -> None:
    clock = summary["clock"]
    assert clock["quality"] == "good" and clock["worst_uncertainty_ns"] == 150_000
    assert [h["host"] for h in clock["hosts"]] == ["node-a", "node-b"]
    arts = summary["artifacts"]
    assert arts["by_kind"]["rl_insight"] == {"files": 2, "complete": 1, "incomplete": 1, "skipped": 0}
    assert arts["by_kind"]["torch"]["skipped"] == 1 and arts["missing"] == 1 and arts["problem_count"] == 2


def test_gantt_is_the_profiled_step(summary: dict[str, Any]) -> None:
    g = summary["gantt"]
    assert g["step"] == 2
    r1 = next(lane for lane in g["lanes"] if lane["lane"] == "replica_1")
    assert r1["spans"] == [
        [0, 500 * MS, "vllm_generate", "generation"],
        [900 * MS, 100 * MS, "vllm_generate", "generation"],
    ]


# ----------------------------------------------------------------------------- loader
def _key_numbers(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: summary[k] for k in ("steps", "stragglers", "longest_spans", "metrics", "gantt", "overlap")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = write_fixture(tmp_path_factory.mktemp("ref") / "ref.json", "oneline")
    return _key_numbers(build_summary(load_trace(path, mode="document")))


@pytest.mark.parametrize("layout", ["lines", "oneline", "array"])
@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_every_layout_streams_to_the_same_summary(
    tmp_path: Path, reference: dict[str, Any], layout: str, suffix: str
) -> None:
    data = load_trace(write_fixture(tmp_path / f"t{suffix}", layout), chunk_bytes=256)
    assert data.mode == "stream" and data.dropped == 0
    assert _key_numbers(build_summary(data)) == reference


NASTY_ARGS = {"list": [{"a": 1}, {"b": "},{"}], "text": '}, {"ph": "X"} ] [', "nl": "a\nb"}


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4096), st.sampled_from([None, 1, 2]), st.booleans())
def test_any_chunk_size_and_layout_gives_the_same_events(chunk: int, indent: int | None, gz: bool) -> None:
    """Cuts land inside nested arrays of objects and inside strings that look like boundaries."""
    import tempfile

    events = fixture_events()
    for e in events[::3]:
        e["args"] = {**e.get("args", {}), **NASTY_ARGS}
    text = json.dumps({"displayTimeUnit": "ms", "traceEvents": events, "metadata": {"x": [1]}}, indent=indent)
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / ("t.json.gz" if gz else "t.json")
        p.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
        streamed = load_trace(p, mode="stream", chunk_bytes=chunk)
        whole = load_trace(p, mode="document")
    assert streamed.events == whole.events == len(events)
    assert streamed.metadata == whole.metadata == {"displayTimeUnit": "ms", "metadata": {"x": [1]}}
    assert [(s.name, s.start_ns, s.dur_ns, s.args) for s in streamed.spans] == [
        (s.name, s.start_ns, s.dur_ns, s.args) for s in whole.spans
    ]
    assert [(s.name, s.dur_ns) for s in streamed.longest] == [(s.name, s.dur_ns) for s in whole.longest]
    assert streamed.counters == whole.counters and streamed.thread_names == whole.thread_names


def test_unstreamable_layout_falls_back(tmp_path: Path, reference: dict[str, Any]) -> None:
    # Valid JSON the chunker cannot find: the key is written with a unicode escape.
    p = tmp_path / "escaped.json"
    p.write_text('{"trace\\u0045vents": ' + json.dumps(fixture_events()) + "}")
    data = load_trace(p)
    assert data.mode == "document"
    assert _key_numbers(build_summary(data)) == reference
    with pytest.raises(TraceError, match="cannot stream"):
        load_trace(p, mode="stream")


def test_events_with_odd_types_are_dropped_and_counted(tmp_path: Path) -> None:
    events = [*fixture_events(), {"ph": "X", "name": "bad", "ts": "soon", "dur": 1}, {"ph": 7}]
    p = tmp_path / "odd.json"
    p.write_text(json.dumps({"traceEvents": events}))
    data = load_trace(p)
    assert data.dropped == 2 and data.events == len(events) - 2


@pytest.mark.parametrize("content", [b"", b"not json", b'{"traceEvents": 3}', b"\x1f\x8b\x08garbage"])
def test_bad_files_are_one_line_errors(tmp_path: Path, content: bytes) -> None:
    p = tmp_path / "bad.json"
    p.write_bytes(content)
    with pytest.raises(TraceError) as err:
        load_trace(p)
    assert str(p) in str(err.value) and "\n" not in str(err.value)


def test_split_labels() -> None:
    assert split_labels("a/b{rank=0,step=12}") == ("a/b", {"rank": "0", "step": "12"})
    assert split_labels("plain") == ("plain", {})
    assert split_labels("odd{x}") == ("odd{x}", {})


# ----------------------------------------------------------------------------- stage table
@pytest.mark.parametrize(
    ("name", "category"),
    [
        ("vllm_generate", "generation"),
        ("sglang_generate", "generation"),
        ("generate_sequences", "generation"),
        ("actor_compute_log_prob", "log_prob"),
        ("ref_compute_log_prob", "log_prob"),
        ("actor_update", "update"),
        ("critic_update", "update"),
        ("update_actor", "update"),
        ("forward_backward", "update"),
        ("update_weights", "weight_sync"),
        ("vllm_wake_up", "weight_sync"),
        ("vllm_sleep", "weight_sync"),
        ("global_step", "step"),
        ("train_batch", "step"),
        ("compute_advantage", "other"),
        ("my_custom_stage", "other"),
        (XSS, "other"),
        ("", "other"),
    ],
)
def test_classify(name: str, category: str) -> None:
    assert classify(name) == category


VERL_WORDS = ("vllm_generate", "actor_update", "compute_log_prob", "update_weights", "load_weights")


def _code_strings(path: Path) -> list[str]:
    """Every string literal of a module's code (f-string parts included), docstrings left out."""
    tree = ast.parse(path.read_text())
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


def test_stage_table_is_the_only_vocabulary() -> None:
    """The report modules name no VERL stage in their code: everything goes through the table."""
    package = Path(__file__).resolve().parents[2] / "src" / "rl_trace_observer" / "analysis" / "report"
    modules = sorted(p for p in package.glob("*.py") if p.name != "stages.py")
    assert len(modules) >= 10, modules  # the package is there: the loop below cannot pass on nothing
    for path in modules:
        for text in _code_strings(path):
            for word in VERL_WORDS:
                assert word not in text, f"{path.name} hard-codes {word}: {text!r}"
    assert {r.category for r in STAGE_TABLE} <= {*CATEGORIES, "step"}


@pytest.mark.parametrize(
    ("name", "root", "load"), [("update_weights", True, False), ("load_weights", False, True)]
)
def test_weight_sync_roles_are_weight_sync_rows(name: str, root: bool, load: bool) -> None:
    assert (is_sync_root(name), is_weight_load(name), classify(name)) == (root, load, "weight_sync")
    assert not is_sync_root("pause") and not is_weight_load("update_weights")


def test_no_markers_means_one_window(tmp_path: Path) -> None:
    ev = [e for e in fixture_events() if e.get("name") != "global_step"]
    p = tmp_path / "nomark.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    s = build_summary(load_trace(p))
    assert [st["step"] for st in s["steps"]] == [None]
    assert s["steps"][0]["dur_ns"] == 2100 * MS  # first stage start (0 ms) to the last end (2100 ms)


def test_names_fallback_without_rl_insight_spans(tmp_path: Path) -> None:
    ev = [
        {"ph": "X", "name": "vllm_generate", "pid": 1, "tid": 7, "ts": 0, "dur": 100},
        {"ph": "X", "name": "actor_update", "pid": 2, "tid": 8, "ts": 50, "dur": 100},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "worker"}},
    ]
    p = tmp_path / "plain.json"
    p.write_text(json.dumps(ev))
    s = build_summary(load_trace(p))
    assert s["source"]["stage_source"] == "names"
    assert s["steps"][0]["overlap"]["both_ns"] == 50_000
    assert {r["lane"] for r in s["steps"][0]["ranks"]} == {"worker", "tid 8"}


# ----------------------------------------------------------------------------- intervals (properties)
_ivals = st.lists(
    st.tuples(st.integers(0, 1000), st.integers(0, 200)).map(lambda t: (t[0], t[0] + t[1])), max_size=30
)


@settings(max_examples=200, deadline=None)
@given(_ivals, _ivals, st.integers(0, 600), st.integers(0, 600))
def test_interval_algebra_matches_point_sets(
    a: list[iv.Interval], b: list[iv.Interval], lo: int, span: int
) -> None:
    def points(xs: list[iv.Interval]) -> set[int]:
        return {p for s, e in xs for p in range(s, e)}

    ua, ub = iv.union(a), iv.union(b)
    assert iv.length(ua) == len(points(a))
    assert all(ua[i][1] < ua[i + 1][0] for i in range(len(ua) - 1))
    assert iv.length(iv.intersect(ua, ub)) == len(points(a) & points(b))
    hi = lo + span
    assert iv.covered(a, lo, hi) == len(points(a) & set(range(lo, hi)))


# ----------------------------------------------------------------------------- manifest sections
def test_clock_verdicts() -> None:
    m = fixture_manifest()
    assert clock_section(None, {"rl_trace_observer": {"clock": "wall"}})["quality"] == "unknown"
    m["timeline"]["clock"]["causality"] = {"checked": 3, "failed": 1}
    assert clock_section(m, {})["quality"] == "poor"
    m = fixture_manifest()
    m["timeline"]["clock"]["worst_uncertainty_ns"] = 5_000_000
    assert clock_section(m, {})["quality"] == "poor"
    m["timeline"]["clock"]["hosts"] = {"solo": {"method": "reference", "uncertainty_ns": 0}}
    assert clock_section(m, {})["quality"] == "exact"
    assert artifacts_section(None) is None


# ----------------------------------------------------------------------------- outputs and CLI
def test_json_output_is_the_summary(tmp_path: Path, summary: dict[str, Any]) -> None:
    write_outputs(summary, json_path=tmp_path / "r.json", html=tmp_path / "r.html")
    assert json.loads((tmp_path / "r.json").read_text()) == json.loads(json.dumps(summary))
    html = (tmp_path / "r.html").read_text()
    assert XSS not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<script" not in html.lower() and "http://" not in html.replace("http://www.w3.org/2000/svg", "")


def test_terminal_output_prints_names_verbatim(tmp_path: Path) -> None:
    """Rich markup in a span name is text, not styling."""
    from rich.console import Console

    from rl_trace_observer.analysis.report.terminal import render

    ev = fixture_events()
    ev.append(
        {"ph": "X", "name": MARKUP, "cat": "x", "pid": 512, "tid": TORCH_TID, "ts": _us(0), "dur": _dur(5000)}
    )
    p = tmp_path / "markup.json"
    p.write_text(json.dumps(ev))
    console = Console(width=300)
    with console.capture() as captured:
        render(build_summary(load_trace(p)), console, top=50)
    text = captured.get()
    assert MARKUP in text and "Where each step's time went" in text and "Stragglers" in text


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rl_trace_observer.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_report(tmp_path: Path) -> None:
    trace = write_fixture(tmp_path / "m.json.gz", manifest=fixture_manifest())
    res = _cli("report", str(trace), "--html", str(tmp_path / "r.html"), "--json", str(tmp_path / "r.json"))
    assert res.returncode == 0, res.stderr
    assert "Where each step's time went" in res.stdout and "rank_2" in res.stdout
    assert json.loads((tmp_path / "r.json").read_text())["schema"] == SCHEMA
    assert f"next: rl-trace view {trace}" in res.stderr


def test_cli_errors(tmp_path: Path) -> None:
    res = _cli("report", str(tmp_path / "missing.json"))
    # a missing input is a usage error in every subcommand (cli/errors.py)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "missing.json" in res.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    res = _cli("report", str(bad))
    assert res.returncode == 1 and "bad.json" in res.stderr
    assert _cli("report").returncode == 2
