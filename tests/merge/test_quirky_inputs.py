"""Real traces' quirks, rebuilt by hand (issue 33: what unseen public traces found), each merged to
``.json.gz`` and ``.pftrace`` and loaded in the real Perfetto engine.

- consecutive kernels of one stream that overlap by ~2 µs (programmatic dependent launch on Hopper /
  Blackwell): every one stays in the timeline (the ones Perfetto would drop on an overlap track beside
  the stream, their launch arrows with them) and in the GPU figures, which equal the exact union;
- a 2021 PyTorch profiler trace (torch 1.8-1.9): capitalised categories, ``i`` events, no anchor and no
  ``distributedInfo``, text tids on slices and numeric ones on their flow starts: both formats show the
  same slices, name by name, and every launch arrow;
- a Kineto header with ``distributedInfo`` and no ``schemaVersion`` (HTA's test data): read as Kineto;
  a file left out whole says how many events that cost;
- an RL-Insight log with one absurd timestamp beside good traces: only that event is lost, the other
  files keep every event and the timeline keeps its base.

The real files stay out of the repository; these have the same quirks.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rl_trace_observer.analysis.report.output import summarize
from rl_trace_observer.merge.options import MergeOptions
from rl_trace_observer.merge.pipeline import merge

from ..conftest import merge_cli, need

pytestmark = pytest.mark.perfetto

ANCHOR = 1_790_000_000_000_000_000  # baseTimeNanoseconds of the hand-made Kineto files
PID = 4242
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
BY_NAME = "select name, count(*) from slice group by name"
OVERLAP_TRACKS = (
    "select t.name, count(*) from slice s join thread_track tt on s.track_id = tt.id "
    "join thread t using(utid) where t.name like '%(overlap%' group by t.name"
)


def _us(ns: int) -> float:
    return round(ns / 1000, 3)


def _union(spans: list[tuple[int, int]]) -> int:
    """The total length of the union of [start, end) intervals: written here apart from the report."""
    total, end = 0, None
    for lo, hi in sorted(spans):
        if end is None or lo > end:
            total, end = total + hi - lo, hi
        elif hi > end:
            total, end = total + hi - end, hi
    return total


# ------------------------------------------------------------------ overlapping kernels on one stream
def pdl_trace() -> tuple[dict[str, Any], list[tuple[str, int, int, int]]]:
    """A Kineto trace (torch 2.x shape) whose stream 7 runs 40 kernels back to back, every other one
    starting 2.048 µs before the one before it ends (as programmatic dependent launch lets them), a
    memset among them, and a stream 13 kernel running beside them. Returns the document and its GPU
    work as (name, stream, start ns, end ns), times relative to the anchor."""
    ev: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "process_labels", "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": PID, "tid": PID,
         "ts": 0.0, "dur": 2000.0},
    ]  # fmt: skip
    gpu: list[tuple[str, int, int, int]] = []
    cpu_ns, gpu_ns = 10_000, 100_000
    for i in range(41):
        name, stream, cat = (GEMM, 7, "kernel") if i % 10 != 5 else ("Memset (Device)", 7, "gpu_memset")
        if i == 40:
            name, stream, gpu_ns = (
                "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                13,
                250_000,
            )
        dur = 3_744 + 1_280 * (i % 3)
        ev.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": PID,
                "tid": PID,
                "ts": _us(cpu_ns),
                "dur": 4.5,
                "args": {"correlation": 1000 + i},
            }
        )
        ev.append(
            {
                "ph": "s",
                "id": 1000 + i,
                "pid": PID,
                "tid": PID,
                "ts": _us(cpu_ns),
                "cat": "ac2g",
                "name": "ac2g",
            }
        )
        ev.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": 0,
                "tid": stream,
                "ts": _us(gpu_ns),
                "dur": _us(dur),
                "args": {"device": 0, "stream": stream, "correlation": 1000 + i},
            }
        )
        ev.append({"ph": "f", "id": 1000 + i, "pid": 0, "tid": stream, "ts": _us(gpu_ns), "cat": "ac2g",
                   "name": "ac2g", "bp": "e"})  # fmt: skip
        gpu.append((name, stream, gpu_ns, gpu_ns + dur))
        cpu_ns += 5_000
        gpu_ns += dur - 2_048 if i % 2 == 0 else dur + 1_000
    doc = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}],
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
        "baseTimeNanoseconds": ANCHOR,
        "traceEvents": ev,
    }
    return doc, gpu


@pytest.fixture(scope="module")
def pdl(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("pdl")
    doc, gpu = pdl_trace()
    (root / "in").mkdir()
    with gzip.open(root / "in" / "rank0.pt.trace.json.gz", "wt") as f:
        json.dump(doc, f)
    merged = {fmt: merge([str(root / "in")], str(root / f"out.{fmt}")) for fmt in ("json.gz", "pftrace")}
    return {"root": root, "gpu": gpu, "merged": merged}


@pytest.fixture(scope="module")
def pdl_shards(pdl: dict[str, Any]) -> list[Path]:
    """The same trace merged with span shards, in both formats (pyarrow: the 'shards' extra)."""
    need("pyarrow")
    root = pdl["root"]
    for fmt in ("json.gz", "pftrace"):
        res = merge([str(root / "in")], str(root / f"sh.{fmt}"), MergeOptions(shards=str(root / f"sh-{fmt}")))
        assert res.exit_code == 0
    return [root / "sh-json.gz", root / "sh-pftrace"]


def test_overlapping_kernels_stay_in_the_timeline_on_an_overlap_track(
    engine: Any, pdl: dict[str, Any]
) -> None:
    """Perfetto opening the original drops the kernels that start inside the one before: 20 here. The
    merge puts them on ``stream 7 (overlap)``, with their launch arrows; both formats agree."""
    gpu = pdl["gpu"]
    seen = {}
    for fmt, res in pdl["merged"].items():
        assert res.exit_code == 0 and res.manifest["problems"] == [] and res.manifest["status"] == "ok"
        key = "args.correlation" if fmt == "json.gz" else "debug.args.correlation"  # each format's key
        arrows = (
            "select count(*) from flow f join slice a on a.id = f.slice_out "
            "join slice b on b.id = f.slice_in "
            f"where extract_arg(a.arg_set_id, '{key}') = extract_arg(b.arg_set_id, '{key}')"
        )
        loaded = engine.load(res.output, [BY_NAME, OVERLAP_TRACKS, arrows])
        assert loaded.ok, loaded.summary()
        names = dict(loaded.queries[0].rows)
        assert names[GEMM] + names["Memset (Device)"] + 1 == len(gpu) == 41  # every GPU op is there
        tracks = dict(loaded.queries[1].rows)
        assert tracks == {"Torch · stream 7 (overlap)": 20}
        assert res.manifest["counts"]["slices_on_overlap_tracks"] == 20
        assert loaded.flows == 41 and loaded.queries[2].rows[0][0] == 41  # each arrow on its own kernel
        seen[fmt] = (loaded.slices, names, tracks)
    assert seen["json.gz"] == seen["pftrace"]  # slice for slice, name by name


def _gpu_is_the_exact_union(source: Path, gpu: list[tuple[str, int, int, int]]) -> None:
    busy = _union([(lo, hi) for _, _, lo, hi in gpu])
    compute = _union([(lo, hi) for name, _, lo, hi in gpu if name == GEMM])
    assert sum(hi - lo for _, _, lo, hi in gpu) > busy  # they do overlap: a sum would overcount
    report = summarize(source)["gpu"]
    assert report["kernels"] == len(gpu) == 41
    (run,) = [r for r in report["rows"] if r["scope"] == "run" and r["stage"] == "all"]
    assert (run["busy_ns"], run["compute_ns"]) == (busy, compute), source.name
    assert run["wall_ns"] == max(hi for *_, hi in gpu) - min(lo for _, _, lo, _ in gpu)


def test_gpu_figures_of_overlapping_kernels_are_the_exact_union(pdl: dict[str, Any]) -> None:
    """Busy and compute time of the device are the union of its kernels (and memset), computed here
    apart from the report, exactly; no GPU op is missing from the report."""
    _gpu_is_the_exact_union(pdl["root"] / "out.json.gz", pdl["gpu"])


def test_gpu_figures_from_span_shards_and_the_kernels_table(
    pdl: dict[str, Any], pdl_shards: list[Path]
) -> None:
    """The same from span shards of both formats, and the ``kernels`` table holds every GPU op."""
    for shards in pdl_shards:
        _gpu_is_the_exact_union(shards, pdl["gpu"])
    need("duckdb")
    from rl_trace_observer.analysis.query.sql import open_run

    with open_run(pdl_shards[0]) as db:
        assert db.execute("SELECT count(*) FROM kernels").fetchone() == (41,)


def test_the_report_counts_the_events_the_merge_kept(pdl: dict[str, Any], pdl_shards: list[Path]) -> None:
    """issue 34: the merge summary said 40,535 events and the report's header 40,551 (it counted
    process and thread names too). Both say the manifest's ``events_kept``, from JSON and from shards."""
    kept = pdl["merged"]["json.gz"].manifest["counts"]["events_kept"]
    for source in (pdl["root"] / "out.json.gz", *pdl_shards):
        assert summarize(source, gpu=False)["source"]["events"] == kept == 165, source.name


# ------------------------------------------------------------------ a 2021 PyTorch profiler trace
def trace_2021(n: int = 40) -> dict[str, Any]:
    """torch 1.8-1.9 ``export_chrome_trace``: ``schemaVersion`` but no anchor (absolute epoch µs), no
    ``distributedInfo``; categories ``Operator`` / ``Runtime`` / ``Kernel`` / ``Memcpy``; slices on
    ``"tid": "24572"`` while their flow starts say ``24572``; GPU lanes ``"stream 7"``; memory
    instants (``[memory]``, ``"ph": "i"``) and the profiler's global instants."""
    t0 = 1_621_401_187_223_000  # µs, May 2021
    ev: list[dict[str, Any]] = []
    t = t0 + 100
    tid = str(PID)
    for i in range(n):
        corr = 300 + i
        ev += [
            {"ph": "X", "cat": "Operator", "name": "aten::add_", "pid": PID, "tid": tid, "ts": t, "dur": 40,
             "args": {"Device": PID, "External id": i}},
            {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": PID, "tid": tid, "ts": t + 10,
             "dur": 15, "args": {"cbid": 211, "correlation": corr, "external id": i}},
            {"ph": "s", "id": corr, "pid": PID, "tid": PID, "ts": t + 10, "cat": "async", "name": "launch"},
            {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": PID, "tid": tid,
             "ts": t + 12, "args": {"Device Type": 1, "Device Id": 0, "Bytes": 512}},
            {"ph": "X", "cat": "Kernel", "name": "void at::native::vectorized_elementwise_kernel<4>(int)",
             "pid": 0, "tid": "stream 7", "ts": t + 30, "dur": 2,
             "args": {"queued": 0, "device": 0, "context": 1, "stream": 7, "correlation": corr}},
            {"ph": "f", "id": corr, "pid": 0, "tid": "stream 7", "ts": t + 30, "cat": "async",
             "name": "launch", "bp": "e"},
        ]  # fmt: skip
        if i % 8 == 0:
            ev.append({"ph": "X", "cat": "Memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0,
                       "tid": "stream 7", "ts": t + 35, "dur": 1,
                       "args": {"device": 0, "stream": 7, "correlation": 900 + i, "bytes": 640}})  # fmt: skip
        t += 50
    for pid, label in ((PID, "CPU"), (0, "GPU 0")):
        ev.append(
            {"name": "process_name", "ph": "M", "ts": t0, "pid": pid, "tid": 0, "args": {"name": "python"}}
        )
        ev.append(
            {"name": "process_labels", "ph": "M", "ts": t0, "pid": pid, "tid": 0, "args": {"labels": label}}
        )
    ev += [
        {"name": "thread_name", "ph": "M", "ts": t0, "pid": PID, "tid": tid,
         "args": {"name": f"thread {PID} (python)"}},
        {"ph": "X", "cat": "Trace", "ts": t0, "dur": t - t0 + 20, "pid": "Traces", "tid": "PyTorch Profiler",
         "name": "PyTorch Profiler (0)", "args": {"Op count": 0}},
        {"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g", "pid": "Traces",
         "tid": "Trace PyTorch Profiler", "ts": t0},
        {"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": t + 20},
    ]  # fmt: skip
    return {
        "schemaVersion": 1,
        "computeProperties": [{"id": 0, "name": "Tesla V100-DGXS-32GB"}],
        "traceEvents": ev,
    }


def test_a_2021_profiler_trace_is_the_same_in_both_formats(engine: Any, tmp_path: Path) -> None:
    """The same slices name by name in ``.json.gz`` and ``.pftrace`` (no ``launch`` instants in the
    protobuf for flow starts that could not bind), every launch arrow, no import error."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "worker0.pt.trace.json").write_text(json.dumps(trace_2021(), indent=1))
    seen = []
    for fmt in ("json.gz", "pftrace"):
        res = merge([str(tmp_path / "in")], str(tmp_path / f"out.{fmt}"))
        assert res.exit_code == 0 and res.manifest["problems"] == [], res.manifest["problems"]
        loaded = engine.load(res.output, [BY_NAME])
        assert loaded.ok, loaded.summary()
        names = Counter(dict(loaded.queries[0].rows))
        assert "launch" not in names and names["[memory]"] == 40
        assert loaded.flows == 40 == res.manifest["counts"]["flows"]
        assert loaded.slices == res.manifest["counts"]["slices"]
        seen.append(names)
    assert seen[0] == seen[1]
    gpu = summarize(tmp_path / "out.json.gz")["gpu"]
    assert gpu["kernels"] == 45 and gpu["rules"]["launch"] == 40  # Kernel, Memcpy; launched by Runtime


def test_flow_events_no_slice_can_take_are_left_out_of_both_formats(engine: Any, tmp_path: Path) -> None:
    """A flow start on a thread with no slice: Perfetto drops it from JSON (an import error), a
    protobuf writer would give it an instant of its own. Left out of both, counted and said."""
    doc = trace_2021(4)
    doc["traceEvents"] += [
        {"ph": "s", "id": 77, "pid": PID, "tid": 99999, "ts": 1_621_401_187_223_500, "cat": "async",
         "name": "launch"},
        {"ph": "f", "id": 77, "pid": 0, "tid": "stream 7", "ts": 1_621_401_187_224_000, "cat": "async",
         "name": "launch", "bp": "e"},
        {"ph": "X", "cat": "Kernel", "name": "lonely", "pid": 0, "tid": "stream 7",
         "ts": 1_621_401_187_224_000, "dur": 2, "args": {"stream": 7, "correlation": 77}},
    ]  # fmt: skip
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "w.pt.trace.json").write_text(json.dumps(doc))
    seen = []
    for fmt in ("json.gz", "pftrace"):
        res = merge([str(tmp_path / "in")], str(tmp_path / f"out.{fmt}"))
        (problem,) = res.manifest["problems"]
        assert problem["kind"] == "dropped_events" and "1 flow events no slice" in problem["detail"]
        assert res.manifest["counts"]["unbound_flow_events"] == 1
        loaded = engine.load(res.output, [BY_NAME])
        assert loaded.ok and loaded.flows == 4, loaded.summary()
        seen.append((loaded.slices, dict(loaded.queries[0].rows)))
    assert seen[0] == seen[1]


# ------------------------------------------------------------------ distributedInfo, no schemaVersion
def test_kineto_is_recognised_by_its_content(tmp_path: Path) -> None:
    """HTA's test data: ``distributedInfo`` and no ``schemaVersion`` (absolute µs). Once read as a
    Chrome trace of unknown origin, every event dropped with exit 0; now a Kineto trace, rank and all."""
    doc, _ = pdl_trace()
    for key in ("schemaVersion", "deviceProperties", "baseTimeNanoseconds"):
        del doc[key]
    for e in doc["traceEvents"]:
        if "ts" in e:
            e["ts"] = round(e["ts"] + ANCHOR / 1000, 3)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "rank-0.json").write_text(json.dumps(doc))
    res = merge([str(tmp_path / "in")], str(tmp_path / "out.json.gz"))
    (art,) = res.manifest["artifacts"]
    assert art["kind"] == "torch" and art["rank"] == 0 and res.manifest["problems"] == []
    assert art["events"] == {"read": 165, "kept": 165, "dropped": 0}  # its 167 events but 2 names


def test_a_file_left_out_whole_says_what_that_cost(tmp_path: Path) -> None:
    """No file's events are lost without one stderr line saying how many and why, the manifest
    counting them, and ``--strict`` failing."""
    (tmp_path / "in").mkdir()
    events = [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 10 + i, "dur": 1} for i in range(5)]
    (tmp_path / "in" / "other.json").write_text(json.dumps({"traceEvents": events}))  # no anchor at all
    doc, _ = pdl_trace()
    (tmp_path / "in" / "good.json").write_text(json.dumps(doc))
    proc = merge_cli(str(tmp_path / "in"), "-o", str(tmp_path / "out.json.gz"))
    assert proc.returncode == 0, proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if "other.json" in x and "unanchored" in x]
    assert "none of its 5 events merged" in line and "baseTimeNanoseconds" in line
    manifest = json.loads((tmp_path / "out.json.gz.manifest.json").read_text())
    other = next(a for a in manifest["artifacts"] if a["path"].endswith("other.json"))
    assert other["events"] == {"read": 5, "kept": 0, "dropped": 5} and not other["selected"]
    strict = merge_cli(str(tmp_path / "in"), "-o", str(tmp_path / "strict.json.gz"), "--strict")
    assert strict.returncode == 1


# ------------------------------------------------------------------ one absurd timestamp beside good files
def _rl_insight_log(folder: Path, absurd: str | None) -> None:
    """Our RL-Insight event log (docs/FORMATS.md §1): five stage spans near the Kineto files' time; the
    absurd line, if any, first after the lane line (so it is in the head planning reads too)."""
    t0 = ANCHOR + 50_000_000
    lane = {"ph": "M", "name": "thread_name", "pid": 777, "tid": 1}
    lines = [json.dumps({**lane, "args": {"name": "RL-Insight · rank_0", "lane": "rank_0"}})]
    if absurd is not None:
        lines.append('{"ph":"X","cat":"rl_insight","name":"actor_update","pid":777,"tid":1,' + absurd + "}")
    for i in range(5):
        ts = t0 + i * 10_000_000
        span = {"ph": "X", "cat": "rl_insight", "name": "actor_update", "pid": 777, "tid": 1}
        lines.append(json.dumps({**span, "ts": ts / 1000, "dur": 5000.0, "ts_ns": ts, "dur_ns": 5_000_000}))
    (folder / "rl-insight-node-a-pid-777.chrome.jsonl").write_text("\n".join(lines) + "\n")


ABSURD = {
    "ts_ns 1e300": '"ts_ns":1e300,"dur_ns":5',
    "ts_ns 1e400": '"ts_ns":1e400,"dur_ns":5',
    "ts 1e300": '"ts":1e300,"dur":5.0',
    "µs in ts_ns (1970)": f'"ts_ns":{ANCHOR // 1000},"dur_ns":5',
    "ns in ts (µs)": f'"ts":{ANCHOR},"dur":5.0',
    "70 years on": '"ts_ns":4000000000000000000,"dur_ns":5',
}


@pytest.fixture(scope="module")
def beside(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same two good Kineto files (one of them the 2021 one) and a log, with each absurd line."""
    root = tmp_path_factory.mktemp("absurd")
    out = {}
    for label, absurd in [("none", None), *ABSURD.items()]:
        folder = root / label.replace(" ", "_")
        (folder / "in").mkdir(parents=True)
        doc, _ = pdl_trace()
        (folder / "in" / "rank0.pt.trace.json").write_text(json.dumps(doc))
        (folder / "in" / "w2021.pt.trace.json").write_text(json.dumps(trace_2021()))
        _rl_insight_log(folder / "in", absurd)
        out[label] = {
            fmt: merge([str(folder / "in")], str(folder / f"out.{fmt}")) for fmt in ("json.gz", "pftrace")
        }
    return out


def _kept(res: Any) -> dict[str, int]:
    return {Path(a["path"]).name: a["events"]["kept"] for a in res.manifest["artifacts"]}


@pytest.mark.parametrize("label", list(ABSURD))
def test_an_absurd_timestamp_costs_no_other_file_its_events(
    engine: Any, beside: dict[str, Any], label: str
) -> None:
    clean = beside["none"]["json.gz"]
    for fmt, res in beside[label].items():
        assert res.exit_code == 0, res.manifest["problems"]
        assert _kept(res) == _kept(clean)  # every good event, the log's five spans included
        assert res.manifest["timeline"]["base_ns"] == clean.manifest["timeline"]["base_ns"]
        assert res.manifest["timeline"]["end_ns"] == clean.manifest["timeline"]["end_ns"]
        (problem,) = res.manifest["problems"]  # the absurd line is its own file's dropped event
        assert problem["kind"] == "dropped_events" and problem["path"].endswith(".chrome.jsonl")
        log = next(a for a in res.manifest["artifacts"] if a["path"].endswith(".chrome.jsonl"))
        assert log["events"]["dropped"] == 1
        if fmt == "pftrace" or label == "70 years on":
            loaded = engine.load(res.output)
            assert loaded.ok and loaded.slices == res.manifest["counts"]["slices"], loaded.summary()


# ------------------------------------------------------------------ events of an unknown process
def test_pid_minus_one_events_are_one_named_process_in_both_formats(engine: Any, tmp_path: Path) -> None:
    """Events whose pid names no process of the file (``pid -1``) get a process of their own, hashed
    above the planned pids: ``.pftrace`` holds pids as int32, so one past 2**31 became two processes
    there (an unnamed one with the negative pid); now both formats show the same named processes."""
    doc, _ = pdl_trace()
    doc["traceEvents"] += [
        {"ph": "X", "cat": "cpu_op", "name": "orphan", "pid": -1, "tid": -1, "ts": 50.0 + i, "dur": 0.5}
        for i in range(3)
    ]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "rank0.pt.trace.json").write_text(json.dumps(doc))
    seen = []
    for fmt in ("json.gz", "pftrace"):
        res = merge([str(tmp_path / "in")], str(tmp_path / f"out.{fmt}"))
        loaded = engine.load(
            res.output,
            [
                "select pid, name from process where upid != 0 order by pid",
                "select p.name, count(*) from slice s join thread_track tt on s.track_id = tt.id "
                "join thread using(utid) join process p using(upid) where s.name = 'orphan' group by 1",
            ],
        )
        assert loaded.ok, loaded.summary()
        processes = loaded.queries[0].rows
        assert all(name and pid > 0 for pid, name in processes), processes
        assert [tuple(r) for r in loaded.queries[1].rows] == [("unknown-host · pid -1", 3)]
        seen.append(processes)
    assert seen[0] == seen[1]
