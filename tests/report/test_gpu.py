"""GPU truth per RL stage (``analysis/gpu``): exact ns on a hand-built two-rank trace, the report and
the SQL tables agreeing, honest reports for the real profiler-only traces, and invariants.

The hand-built trace is a merged Chrome JSON (our writer's pid layout: ``(index + 1) << 8`` per OS
process, its GPU sub-process at ``+ 1 + device``) with RL-Insight stage spans, Kineto-shaped launches
(``cuda_runtime`` with ``args.correlation``) and kernels (``args.stream``/``correlation``), laid out so
that every definition of docs/FORMATS.md §10 ``gpu`` shows: two streams, NCCL under compute, a host-wait
gap, a kernel-wait gap, a queued ("other") gap, a kernel whose launch is missing, and a stage.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trace_observer.analysis.answers import intervals as iv
from rl_trace_observer.analysis.gpu import attribute as attr
from rl_trace_observer.analysis.gpu import breakdown
from rl_trace_observer.analysis.gpu.section import analyze
from rl_trace_observer.analysis.gpu.store import KernelStore
from rl_trace_observer.analysis.report.output import summarize
from rl_trace_observer.analysis.report.stages import guessable

from ..conftest import ROOT, need

REAL = next(
    (p for p in (ROOT.parent / "shared" / "real-traces", Path("/work/shared/real-traces")) if p.is_dir()),
    ROOT.parent / "shared" / "real-traces",
)  # a worktree sits one level deeper than the checkout CI uses
US = 1000  # ns per µs
NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"


def _x(name: str, cat: str, pid: int, tid: int, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _names(pid: int, label: str, threads: dict[int, str]) -> list[dict[str, Any]]:
    out = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}}]
    out += [
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": t, "args": {"name": n}}
        for t, n in threads.items()
    ]
    return out


def _kernel(
    pid: int, stream: int, name: str, start: float, dur: float, corr: int, launch: float | None
) -> list[dict[str, Any]]:
    """A kernel on GPU sub-process ``pid + 1`` and (unless ``launch`` is None) its 5 µs launch call."""
    cat = "gpu_memcpy" if name.startswith("Memcpy") else "kernel"
    out = [_x(name, cat, pid + 1, stream, start, dur, device=0, stream=stream, correlation=corr)]
    if launch is not None:
        out.append(_x("cudaLaunchKernel", "cuda_runtime", pid, 2, launch, 5, correlation=corr))
    return out


def hand_built() -> dict[str, Any]:
    """Times in µs from the trace's base. Rank 0 (pid 256): log-prob [100, 300), update [400, 900);
    rank 1 (pid 512): update [400, 900); the driver's global_step 1 is [0, 1000)."""
    ev: list[dict[str, Any]] = []
    for pid, rank in ((256, 0), (512, 1)):
        label = f"node-a · pid {100 + rank} · trainer rank {rank}"
        ev += _names(pid, label, {1: "RL-Insight · rank_" + str(rank), 2: "Torch · thread 7"})
        ev += _names(pid + 1, label + " · GPU 0", {7: "Torch · stream 7", 13: "Torch · stream 13"})
    ev += _names(768, "node-a · pid 99 · driver", {1: "RL-Insight · global_step"})
    ev.append(_x("global_step", "verl", 768, 1, 0, 1000, step=1))
    ev.append(_x("actor_compute_log_prob", "rl_insight", 256, 1, 100, 200, state_lane_id="rank_0"))
    for pid, rank in ((256, 0), (512, 1)):
        ev.append(_x("actor_update", "rl_insight", pid, 1, 400, 500, state_lane_id=f"rank_{rank}"))
    ev += _kernel(256, 7, GEMM, 150, 100, 1, 120)  # K1 log-prob; [0, 150) host wait (launched at 120)
    ev += _kernel(256, 7, GEMM, 410, 90, 2, 405)  # K2 update
    ev += _kernel(256, 13, NCCL, 450, 150, 3, 440)  # K3 NCCL on another stream, 50 µs under K2
    ev += _kernel(256, 7, GEMM, 650, 50, 4, 640)  # K4: [600, 650) host wait (launched at 640)
    ev += _kernel(256, 7, GEMM, 710, 50, 5, 645)  # K5: [700, 710) kernel wait (queued, < 30 µs)
    ev += _kernel(256, 7, "Memcpy DtoH (Device -> Pageable)", 800, 50, 6, 650)  # K6: [760, 800) other
    ev += _kernel(256, 7, GEMM, 950, 10, 7, None)  # K7: no launch in the trace; in no stage span
    ev += _kernel(512, 13, NCCL, 420, 460, 1, 410)  # rank 1: NCCL [420, 880)
    ev += _kernel(512, 7, GEMM, 500, 100, 2, 450)  # compute [500, 600) under it
    header = {"schema": "rl-trace-merge/1", "base_ns": 1_700_000_000_000_000_000, "clock": "wall"}
    return {"traceEvents": ev, "rl_trace_observer": header, "displayTimeUnit": "ms"}


def _row(gpu: dict[str, Any], scope: str, rank: int, stage: str = "all") -> dict[str, Any]:
    rows = [r for r in gpu["rows"] if r["scope"] == scope and r["rank"] == rank and r["stage"] == stage]
    assert len(rows) == 1, rows
    return rows[0]


def _us(row: dict[str, Any], *keys: str) -> tuple[float, ...]:
    return tuple(row[k] / US for k in keys)


FIG = ("wall_ns", "busy_ns", "compute_ns", "comm_ns", "memory_ns", "overlap_ns", "idle_ns",
       "host_wait_ns", "kernel_wait_ns", "other_wait_ns")  # fmt: skip


@pytest.fixture(scope="module")
def hand(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    path = tmp_path_factory.mktemp("gpu") / "hand.json"
    path.write_text(json.dumps(hand_built()))
    return path, summarize(path)


def test_hand_built_trace_gives_exact_ns(hand: tuple[Path, dict[str, Any]]) -> None:
    gpu = hand[1]["gpu"]
    assert gpu["kernels"] == 9 and gpu["rules"] == {"launch": 8, "window": 1}
    step = _row(gpu, "step", 0)
    assert step["step"] == 1 and step["role"] == "trainer" and step["device"] == "GPU 0"
    # busy [150,250) [410,600) [650,700) [710,760) [800,850) [950,960); compute K1 K2 K4 K5 K7 = 300;
    # comm K3 150 of which 50 under K2; idle: host [0,150) [250,410) [600,650) [960,1000) = 400,
    # kernel [700,710) = 10, other [760,800) + [850,950) (K7's launch unknown) = 140
    assert _us(step, *FIG) == (1000, 450, 300, 100, 50, 50, 550, 400, 10, 140)
    assert (step["launch_delay_p50_ns"], step["launch_delay_p95_ns"], step["launch_delay_max_ns"]) == (
        15 * US, 123_750, 145 * US)  # delays 25, 0, 5, 5, 60, 145 µs  # fmt: skip
    assert _us(_row(gpu, "stage", 0, "log_prob"), *FIG) == (200, 100, 100, 0, 0, 0, 100, 100, 0, 0)
    assert _us(_row(gpu, "stage", 0, "update"), *FIG) == (500, 340, 190, 100, 50, 50, 160, 110, 10, 40)
    # stage "none": K7 in the step window's time outside every stage span of rank 0
    assert _us(_row(gpu, "stage", 0, "none"), *FIG) == (300, 10, 10, 0, 0, 0, 290, 40, 0, 250)
    run = _row(gpu, "run", 0)  # HTA's view: first kernel start to last kernel end
    assert _us(run, "span_ns", "wall_ns", "busy_ns", "idle_ns") == (810, 810, 450, 360)
    assert _us(run, "host_wait_ns", "kernel_wait_ns", "other_wait_ns") == (210, 10, 140)
    assert _us(_row(gpu, "step", 1), *FIG) == (1000, 460, 100, 360, 0, 100, 540, 540, 0, 0)
    streams = next(d for d in gpu["devices"] if d["rank"] == 0)["streams"]
    assert [(s["stream"], s["host_wait_ns"] // US, s["kernel_wait_ns"] // US, s["other_wait_ns"] // US)
            for s in streams] == [(7, 310, 10, 140), (13, 0, 0, 0)]  # HTA's per-stream table  # fmt: skip


def test_sql_tables_equal_the_report(hand: tuple[Path, dict[str, Any]]) -> None:
    need("duckdb")
    from rl_trace_observer.analysis.query.sql import open_run

    path, summary = hand
    with open_run(path) as db:
        cols = [d[0] for d in db.execute("SELECT * FROM gpu_time").description]
        got = [dict(zip(cols, r, strict=True)) for r in db.execute("SELECT * FROM gpu_time").fetchall()]
        kernels = db.execute(
            "SELECT correlation, step, rank, stage, stage_name, kind, rule, (ts_ns - t.base_ns) / 1000, "
            "(launch_ts_ns - t.base_ns) / 1000, stream FROM kernels, trace t ORDER BY rank, correlation"
        ).fetchall()
        steps = db.execute("SELECT step, dur_ns FROM steps").fetchall()
        stages = db.execute("SELECT lane, stage, step FROM stage_spans ORDER BY ALL").fetchall()
    assert sorted(got, key=repr) == sorted(summary["gpu"]["rows"], key=repr)
    assert kernels[:3] == [
        (1, 1, 0, "log_prob", "actor_compute_log_prob", "compute", "launch", 150, 120, 7),
        (2, 1, 0, "update", "actor_update", "compute", "launch", 410, 405, 7),
        (3, 1, 0, "update", "actor_update", "comm", "launch", 450, 440, 13),
    ]
    assert kernels[5][5] == "memory" and kernels[6] == (
        7,
        1,
        0,
        "none",
        None,
        "compute",
        "window",
        950,
        None,
        7,
    )
    assert steps == [(1, 1000 * US)]
    assert stages == [("rank_0", "log_prob", 1), ("rank_0", "update", 1), ("rank_1", "update", 1)]


def test_report_shows_the_gpu_section(hand: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    from rich.console import Console

    from rl_trace_observer.analysis.report import html, terminal

    console = Console(width=80, record=True)
    terminal.render(hand[1], console)
    text = console.export_text()
    assert "GPU per step and device" in text and "0·GPU0" in text and "GPU per stage" in text
    assert max(len(line) for line in text.splitlines()) <= 80
    page = html.render(hand[1])
    assert 'class="chart gpu"' in page and "GPU busy per stage" in page


# ------------------------------------------------------------------------ traces without RL-Insight
def _merged(name: str, tmp: Path) -> Path:
    from rl_trace_observer.merge.options import MergeOptions
    from rl_trace_observer.merge.pipeline import merge

    out = tmp / f"{name}.json.gz"
    merge([str(REAL / name)], str(out), MergeOptions(shards=str(tmp / f"{name}-shards")))
    return out


needs_real = pytest.mark.skipif(not REAL.is_dir(), reason=f"no real traces at {REAL}")


@needs_real
def test_profiler_only_traces_get_honest_reports(tmp_path: Path) -> None:
    need("pyarrow")  # _merged writes span shards too
    dlrm = summarize(_merged("dlrm-8rank", tmp_path))
    src = dlrm["source"]
    assert src["stage_source"] == "none" and src["stage_spans"] == 0 and src["steps_from"] == "ProfilerStep#N"
    assert "## optimizer ##" in src["guessed"]["refused"]  # not "update"
    assert [s["step"] for s in dlrm["steps"]] == [10]
    runs = [r for r in dlrm["gpu"]["rows"] if r["scope"] == "run"]
    assert [(r["rank"], r["device"]) for r in runs] == [(i, f"GPU {i}") for i in range(8)]
    assert sum(r["kernels"] for r in runs) == 2244  # 2,104 kernels + 128 memcpy + 12 memset
    sglang = summarize(_merged("sglang-decode", tmp_path))
    assert sglang["source"]["stage_source"] == "none" and not sglang["steps"]  # no invented "generation"
    assert sglang["gpu"]["kernels"] == 558
    graph = summarize(_merged("kineto-cudagraph", tmp_path))
    assert [s["step"] for s in graph["steps"]] == list(range(1009, 1015))
    assert {r["step"] for r in graph["gpu"]["rows"] if r["scope"] == "step"} >= set(range(1009, 1014))


@needs_real
def test_sql_steps_and_stage_spans_are_the_reports_on_hta_2rank(tmp_path: Path) -> None:
    """issue 29 item 8: a profiler-only trace's SQL tables hold what the report shows."""
    need("duckdb")
    from rl_trace_observer.analysis.query.sql import open_run

    merged = _merged("hta-2rank", tmp_path)
    shards = tmp_path / "hta-2rank-shards"
    from_json, from_shards = summarize(merged), summarize(shards)
    assert from_json["gpu"] == from_shards["gpu"]
    with open_run(shards) as db:
        steps = db.execute(
            "SELECT step, start_ns - (SELECT base_ns FROM trace), dur_ns FROM steps"
        ).fetchall()
        spans = db.execute("SELECT count(*) FROM stage_spans").fetchone()[0]
        kernels = db.execute("SELECT count(*) FROM kernels").fetchone()[0]
        busy = db.execute("SELECT rank, busy_ns FROM gpu_time WHERE scope = 'run' ORDER BY rank").fetchall()
    assert steps == [(s["step"], s["start_ns"], s["dur_ns"]) for s in from_json["steps"]]
    assert [s["step"] for s in from_json["steps"]] == [551, 552]
    assert spans == from_json["source"]["stage_spans"] == 0
    assert kernels == from_json["gpu"]["kernels"] == 2358
    assert busy == [(0, 547_656_000), (1, 580_050_000)]  # HTA 0.5.0: 547,656 and 580,050 µs


@pytest.mark.parametrize(
    ("name", "cat", "ok"),
    [("## optimizer ##", "user_annotation", False), ("Optimizer.step#Adam.step", "user_annotation", False),
     ("execute_32_context_0(sq0)_generation_32", "user_annotation", False), ("update", "kernel", False),
     ("actor_update", "user_annotation", True), ("generate_sequences", "cpu_op", True),
     ("ProfilerStep#7", "user_annotation", True), ("forward", "user_annotation", False),
     # AReaL's qualified names: the last part decides, as the same category
     ("train.update_weights", "io", True), ("ppo_actor.ppo_update", "compute", True),
     ("optimizer.zero_grad", "compute", False), ("ppo_actor.compute_logp", "compute", False),
     ("generation_utils.step", "misc", False)],
)  # fmt: skip
def test_only_whole_identifiers_are_guessed_as_stages(name: str, cat: str, ok: bool) -> None:
    assert guessable(name, cat) is ok


# ------------------------------------------------------------------------------------ invariants
_kernels = st.lists(
    st.tuples(st.integers(0, 400), st.integers(0, 60), st.sampled_from([GEMM, NCCL, "Memcpy HtoD"]),
              st.one_of(st.none(), st.integers(0, 80)), st.integers(0, 2)),
    min_size=1, max_size=25,
)  # fmt: skip
_stages = st.lists(st.tuples(st.integers(0, 400), st.integers(1, 150), st.sampled_from(["actor_update",
                   "actor_compute_log_prob"])), max_size=4)  # fmt: skip


def _add_kernel(
    store: KernelStore, pid: int, tid: int, ts: int, dur: int, name: str, cat: str, args: str
) -> None:
    store.extend_kernels([pid], [tid], [ts], [dur], [name], [cat], [args.encode()])


def _add_launch(store: KernelStore, pid: int, tid: int, ts: int, dur: int, corr: int) -> None:
    store.extend_launches([pid], [tid], [ts], [dur], [json.dumps({"correlation": corr}).encode()])


def _covered(ints: list[tuple[int, int]]) -> set[int]:
    return {t for s, e in ints for t in range(s, e)}


@settings(max_examples=150, deadline=None)
@given(_kernels, _stages, st.integers(0, 100), st.integers(1, 500))
def test_busy_never_exceeds_wall_and_splits_sum(
    kernels: list[tuple[int, int, str, int | None, int]],
    stages: list[tuple[int, int, str]],
    lo: int,
    span: int,
) -> None:
    store = KernelStore()
    for corr, (start, dur, name, lead, stream) in enumerate(kernels, 1):
        _add_kernel(
            store,
            257,
            stream,
            start,
            dur,
            name,
            "kernel",
            json.dumps({"stream": stream, "correlation": corr}),
        )
        if lead is not None:
            _add_launch(store, 256, 2, max(start - lead, 0), 2, corr)
    spans = [
        attr.StageSpan(256, s, s + d, "update" if n == "actor_update" else "log_prob", n)
        for s, d, n in stages
    ]
    result = analyze(store, [(1, lo, lo + span)], spans, who=lambda p: ("trainer", 0, "h"), process_names={},
                     merged=True)  # fmt: skip
    for r in result.rows:
        assert (r["busy_ns"] <= r["wall_ns"] and r["busy_ns"] <= r["span_ns"]) or r["kernels"] == 0
        assert r["compute_ns"] + r["comm_ns"] + r["memory_ns"] == r["busy_ns"]
        assert r["host_wait_ns"] + r["kernel_wait_ns"] + r["other_wait_ns"] == r["idle_ns"]
        assert r["busy_ns"] + r["idle_ns"] == r["wall_ns"]
        assert 0 <= r["overlap_ns"] <= min(r["compute_ns"], r["overlap_ns"] + r["comm_ns"])
    every = [(s, s + d) for s, d, *_ in kernels]
    run = next(r for r in result.rows if r["scope"] == "run")
    assert run["busy_ns"] == len(_covered(every)) and run["kernels"] == len(kernels)
    comp = _covered([(s, s + d) for s, d, n, *_ in kernels if n == GEMM])
    comm = _covered([(s, s + d) for s, d, n, *_ in kernels if n == NCCL])
    assert (run["compute_ns"], run["overlap_ns"], run["comm_ns"]) == (
        len(comp),
        len(comp & comm),
        len(comm - comp),
    )
    real = [(s, e) for s, e in every if e > s]  # a zero-length kernel occupies no time
    assert run["span_ns"] == (max(e for _, e in real) - min(s for s, _ in real) if real else 0)
    steps = [r for r in result.rows if r["scope"] == "step"]
    assert sum(r["kernels"] for r in steps) == len(kernels)
    inside = [r for r in steps if r["step"] == 1]
    if inside:  # the step window plus its kernels' busy time
        mine = [(s, s + d) for s, d, *_ in kernels]
        assert inside[0]["wall_ns"] <= span + iv.length(iv.union(mine))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300), st.integers(0, 40), st.one_of(st.none(), st.integers(0, 50))),
                min_size=1, max_size=20))  # fmt: skip
def test_per_stream_idle_is_htas_rule(kernels: list[tuple[int, int, int | None]]) -> None:
    """One stream: every gap before a kernel goes to exactly one category, by HTA's rule; kernels that
    overlap the ones before them (programmatic dependent launch) leave no gap, never a negative one,
    and the gaps sum to the stream's idle time: its span minus the union of its kernels."""
    store = KernelStore()
    for corr, (start, dur, lead) in enumerate(kernels, 1):
        _add_kernel(store, 257, 7, start, dur, GEMM, "kernel", json.dumps({"stream": 7, "correlation": corr}))
        if lead is not None:
            _add_launch(store, 256, 2, start - lead, 1, corr)
    at = attr.attribute(store, [], [], True)
    order = sorted(range(len(store)), key=lambda i: (store.k_ts[i], at.launch_ts[i]))
    (row,) = breakdown.stream_idle(order, store, at, threshold_ns=10)
    want = [0, 0, 0]
    for n, i in enumerate(order[1:], 1):
        end = max(store.k_ts[k] + store.k_dur[k] for k in order[:n])  # the latest end before it
        gap, launched = store.k_ts[i] - end, at.launch_ts[i]
        if gap > 0:
            want[0 if launched != attr.UNKNOWN and launched > end else 1 if gap < 10 else 2] += gap
    assert (row["host_wait_ns"], row["kernel_wait_ns"], row["other_wait_ns"]) == tuple(want)
    spans = [(store.k_ts[i], store.k_ts[i] + store.k_dur[i]) for i in order]
    idle = max(e for _, e in spans) - min(s for s, _ in spans) - iv.length(iv.union(spans))
    assert row["idle_ns"] == idle and min(want) >= 0


@needs_real
@pytest.mark.slow
@pytest.mark.parametrize("name", ["dlrm-8rank", "hta-2rank"])
def test_per_rank_figures_equal_hta_0_5(name: str, tmp_path: Path) -> None:
    """HTA 0.5.0 itself (own venv, from the package index, reused across runs) on the ORIGINAL files:
    busy, idle, compute, non-compute, communication, kernel time and overlap within 0.1 % per rank."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from hta_parity import check

    venv = Path.home() / ".cache" / "rl-trace-observer" / "hta-0.5.0"
    assert check(REAL / name, venv, tmp_path / "parity.json") == 0
    rows = json.loads((tmp_path / "parity.json").read_text())
    held = [r for r in rows if not r["figure"].startswith("stream")]
    assert len({r["rank"] for r in held}) == (8 if name == "dlrm-8rank" else 2)
    assert max(r["rel"] for r in held) <= 0.001


@settings(max_examples=150, deadline=None)
@given(_kernels, _stages, st.integers(0, 100), st.integers(1, 500))
def test_compiled_loops_equal_the_python_ones(
    kernels: list[tuple[int, int, str, int | None, int]],
    stages: list[tuple[int, int, str]],
    lo: int,
    span: int,
) -> None:
    """``_gpu_native`` (built by setup.py) against the reference Python loops, on the same kernels —
    repeated launch ids included (two profiler sessions restart them)."""
    from rl_trace_observer.common import twins

    twin = twins.twin("rl_trace_observer.analysis.gpu._gpu_native")
    if twin is None:
        pytest.skip("the compiled twin is not built (no C compiler at install, or RL_TRACE_NATIVE=0)")
    store = KernelStore()
    for corr, (start, dur, name, lead, stream) in enumerate(kernels, 1):
        _add_kernel(
            store,
            257,
            stream,
            start,
            dur,
            name,
            "kernel",
            json.dumps({"stream": stream, "correlation": corr % 5}),
        )
        if lead is not None:
            _add_launch(store, 256, 2, max(start - lead, 0), 2, corr % 5)
    spans = [attr.StageSpan(256, s, s + d, "update", n) for s, d, n in stages]

    def run() -> tuple[Any, ...]:
        windows = [(1, lo, lo + span), (2, lo + span, lo + 2 * span)]
        r = analyze(store, windows, spans, {256: [(lo, lo + span, 0)]},
                    who=lambda p: ("trainer", 0, "h"), process_names={}, merged=True)  # fmt: skip
        at = r.at
        return (
            r.rows,
            list(at.launch_ts),
            list(at.launch_end),
            bytes(at.rule),
            list(at.window),
            list(at.stage),
        )

    compiled = run()
    saved = twins.twin
    try:
        twins.twin = lambda name: None  # type: ignore[assignment]
        python = run()
    finally:
        twins.twin = saved  # type: ignore[assignment]
    assert compiled == python


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 2**40), st.integers(0, 2**44 * 1000).map(lambda ns: ns / 1000),
                          st.floats(0, 2**50)), max_size=50))  # fmt: skip
def test_compiled_ns_conversion_equals_the_loaders(values: list[float]) -> None:
    from rl_trace_observer.analysis.report import load
    from rl_trace_observer.common import twins
    from rl_trace_observer.merge.timeline.model import us_to_ns

    twin = twins.twin("rl_trace_observer.analysis.gpu._gpu_native")
    if twin is None:
        pytest.skip("the compiled twin is not built")
    python = [round(v * 1000) if 0 <= v < load._FAST_US else us_to_ns(v) for v in values]
    assert list(twin.ns_array(values, us_to_ns)) == python


def test_diff_has_gpu_series(hand: tuple[Path, dict[str, Any]]) -> None:
    from rl_trace_observer.analysis.query.diff import compare, series

    got = series(hand[1])
    assert got["trainer/gpu_busy"] == [(450 + 460) / 2 * US]  # the mean over the role's two GPUs
    assert got["trainer/gpu_idle"] == [(550 + 540) / 2 * US]
    assert {r["key"] for r in compare(hand[1], hand[1])["rows"]} >= {
        "trainer/gpu_comm",
        "trainer/gpu_compute",
    }


def test_gpu_idle_while_and_gpu_bound_path(hand: tuple[Path, dict[str, Any]]) -> None:
    """Rank 1's GPU sat idle 200 µs while its lane waited for rank 0's log-prob (its peers)."""
    rows = {r["rank"]: r for r in hand[1]["gpu"]["idle_while"]}
    assert rows[1]["gpu_idle_ns"] == 540 * US
    assert rows[1]["while_ns"] == {"update": 40 * US, "waiting_for_peers": 200 * US, "driver": 300 * US}
    assert sum(rows[0]["while_ns"].values()) == rows[0]["gpu_idle_ns"] == 550 * US
    segments = [s for p in hand[1]["critical_path"] for s in p["segments"] if s["stage"] != "gap"]
    assert [(s["name"], s["bound"], s["gpu_busy_ns"]) for s in segments] == [
        ("actor_compute_log_prob", "host", 100 * US), ("actor_update", "host", 340 * US)]  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 500), st.integers(1, 30)), max_size=30),
    st.integers(0, 600),
    st.integers(0, 200),
)
def test_busy_inside_any_window_by_prefix_sums(pieces: list[tuple[int, int]], a: int, width: int) -> None:
    from rl_trace_observer.analysis.gpu.answers import _Busy

    union = iv.union((s, s + d) for s, d in pieces)
    columns = ([s for s, _ in union], [e for _, e in union])
    assert _Busy(columns).covered(a, a + width) == iv.covered(union, a, a + width)


def test_three_sessions_repeating_launch_ids_link_by_time() -> None:
    """A process that restarted its correlation ids three times: each kernel takes the latest
    launch with its id at or before it (and the index is built in one pass, not per id)."""
    store = KernelStore()
    for session in range(3):
        base = session * 1000
        for corr in range(1, 4):
            _add_launch(store, 256, 2, base + corr * 10, 2, corr)
            _add_kernel(store, 257, 7, base + corr * 10 + 5, 3, GEMM, "kernel",
                        json.dumps({"stream": 7, "correlation": corr}))  # fmt: skip
    at = attr.attribute(store, [], [], True)
    assert list(at.launch_ts) == [s * 1000 + c * 10 for s in range(3) for c in range(1, 4)]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.builds(
            lambda ns, base, arg: f"void {ns}::{base}<{arg}>(int)",
            st.sampled_from(["at::native", "cub", "a::b"]),
            st.sampled_from(["vectorized_elementwise_kernel", "gemm", "x"]),
            st.text("AFab01_<>, :#", max_size=8),
        ),
        max_size=10,
        unique=True,
    )
)
def test_top_kernel_rows_never_repeat_a_name(names: list[str]) -> None:
    """issue 34: top-kernel rows showed the same short name twice (``vectorized_elementwise_kernel``
    for AddFunctor and FillFunctor). Each row's label is distinct and begins with its short name."""
    from rl_trace_observer.analysis.report.gpu_tables import distinct_short_names, short_name

    labels = distinct_short_names(names)
    assert len(set(labels)) == len(names)
    assert all(label.startswith(short_name(n)) for label, n in zip(labels, names, strict=True))
    add, fill = distinct_short_names(
        [
            "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float> >(int)",
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float> >(int)",
        ]
    )
    assert (add, fill) == (
        "vectorized_elementwise_kernel [AddFunctor]",
        "vectorized_elementwise_kernel [FillFunctor]",
    )
