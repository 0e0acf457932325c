"""Sniffing does not depend on where a format puts its keys, and the timeline base does not depend on
what a file's head shows: formats that write their anchor or identity last, files whose earliest event
is not in the head, and every output format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl_trace_observer.merge.files.sources import HEAD_BYTES, discover, read_head
from rl_trace_observer.merge.formats import sniff
from rl_trace_observer.merge.pipeline import merge

T0_NS = 1_760_000_000_000_000_000
_KINETO_KEYS = ("schemaVersion", "deviceProperties", "baseTimeNanoseconds", "traceName", "metadata")


def _kineto(order: list[str], events: int, base_ns: int = T0_NS) -> dict[str, Any]:
    top: dict[str, Any] = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "GPU"}],
        "baseTimeNanoseconds": base_ns,
        "traceName": "x",
        "metadata": {"padding": "m" * 100},
    }
    evs = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 77, "tid": 1, "ts": i * 10.0, "dur": 5.0}
           for i in range(events)]  # fmt: skip
    doc = {k: top[k] for k in order if k != "traceEvents"}
    out: dict[str, Any] = {}
    cut = order.index("traceEvents") if "traceEvents" in order else len(order)
    for k in order[:cut]:
        out[k] = doc[k]
    out["traceEvents"] = evs
    for k in order[cut + 1 :]:
        out[k] = doc[k]
    return out


def _viztracer(
    compact: bool, file_info_bytes: int, start_us: float, base_ns: int = T0_NS, n: int = 200
) -> bytes:
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": 5, "tid": 5, "name": "process_name", "args": {"name": "MainProcess"}},
        {"ph": "M", "pid": 5, "tid": 5, "name": "thread_name", "args": {"name": "MainThread"}},
    ]
    events += [
        {"pid": 5, "tid": 5, "ts": start_us + i, "ph": "X", "dur": 0.5, "name": f"f{i}", "cat": "FEE"}
        for i in range(n)
    ]
    doc = {
        "traceEvents": events,
        "viztracer_metadata": {"version": "1.1.1", "overflow": False, "baseTimeNanoseconds": base_ns},
        "file_info": {"files": {"/src/a.py": ["x" * file_info_bytes, 1]}, "functions": {}},
    }
    return json.dumps(doc, separators=(",", ":") if compact else None).encode()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    order=st.permutations(["traceEvents", *_KINETO_KEYS]),
    events=st.sampled_from([3, 2000]),  # a few events, or enough to push later keys past the head
)
def test_kineto_is_recognised_wherever_its_keys_are(tmp_path: Path, order: list[str], events: int) -> None:
    path = tmp_path / "trace.json"  # a name that says nothing
    path.write_text(json.dumps(_kineto(list(order), events), indent=1))
    (source,) = discover([str(path)])
    reader, _ = sniff(read_head(source))
    assert reader is not None and reader.kind == "torch"


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    compact=st.booleans(),
    file_info=st.sampled_from([10, 3 * HEAD_BYTES]),
    name=st.sampled_from(["result.json", "viztracer_train_step2_rank0_pid5.json", "x.json"]),
)
def test_viztracer_reports_are_read_whatever_their_name_and_size(
    tmp_path: Path, compact: bool, file_info: int, name: str
) -> None:
    folder = tmp_path / f"{compact}-{file_info}-{name}"
    folder.mkdir()
    (folder / name).write_bytes(_viztracer(compact, file_info, 1000.0))
    res = merge([str(folder)], str(folder / "out.json"))
    (art,) = [a for a in res.manifest["artifacts"] if a["kind"] != "merge_output"]
    assert art["kind"] == "viztracer" and art["events"]["kept"] == 200, art
    assert res.manifest["problems"] == [] and "pid" in art["placement"]  # no record: placed by its pid


def test_a_file_starting_before_the_planned_base_is_no_problem_in_any_format(tmp_path: Path) -> None:
    """A Kineto file's head gives the base; a VizTracer report whose anchor sits past its tail starts
    10 s earlier. The base is re-planned (stated in the manifest), no format fails, no problem."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "late.pt.trace.json").write_text(
        json.dumps(_kineto(["schemaVersion", "baseTimeNanoseconds", "traceEvents"], 5))
    )
    early_base = T0_NS - 10 * 10**9
    report = _viztracer(False, 3 * HEAD_BYTES, 0.0, base_ns=early_base, n=2000)
    assert report.index(b"viztracer_metadata") > HEAD_BYTES  # neither in the head nor in the tail
    (inputs / "result.json").write_bytes(report)
    for fmt in ("json.gz", "pftrace", "pftrace.gz"):
        res = merge([str(inputs)], str(tmp_path / f"out.{fmt}"))
        assert res.usable, res.manifest["problems"]
        assert res.manifest["problems"] == [], res.manifest["problems"]
        timeline = res.manifest["timeline"]
        assert timeline["base_ns"] <= early_base and timeline["base_replanned"]
        assert res.manifest["counts"]["events_kept"] == 2005
