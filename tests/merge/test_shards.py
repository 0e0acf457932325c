"""Span shards (issue 15): the merged events as flat Parquet rows, the report read from them, and
Perfetto views written from them without the raw inputs.

The run is three hosts written by the real capture layer (``corpus/cluster_run.py``: a host whose
clock is 25 ms ahead, Kineto traces with kernels and flows, a TokenSpeed rank), merged on this
machine into Chrome JSON (the fused fast path, output µs) and into ``.pftrace`` (the same path in
ns), each with its own shards.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import textwrap
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl_trace_observer.analysis.report.output import summarize
from rl_trace_observer.cli.main import main as cli_main
from rl_trace_observer.merge.options import MergeOptions
from rl_trace_observer.merge.pipeline import merge, merge_steps
from rl_trace_observer.merge.shards import schema
from rl_trace_observer.merge.shards.dataset import Shards
from rl_trace_observer.merge.shards.sink import ShardSink
from rl_trace_observer.merge.shards.spec import ProcMeta, ShardSpec
from rl_trace_observer.merge.timeline.identity import ProcessDecl, ThreadDecl
from rl_trace_observer.merge.timeline.model import Event, ProcessKey
from rl_trace_observer.merge.views import view

from ..conftest import ROOT, clean_env, need
from ..corpus.cluster_run import ACTOR_PID, OFFSET_NS, build_cluster_run

pa = need("pyarrow")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("shards")
    corpus = build_cluster_run(base / "run")
    out = base / "out"
    results = {
        fmt: merge(
            [str(base / "run")], str(out / f"run.{fmt}"), MergeOptions(shards=str(out / f"shards-{fmt}"))
        )
        for fmt in ("json.gz", "pftrace")
    }
    return {"base": base, "out": out, "results": results, "truth": corpus["truth"]}


def _rows(folder: str | Path) -> Any:
    return Shards.open(folder).table()


def test_rows_are_exactly_the_kept_events_the_same_from_both_writers(run: dict[str, Any]) -> None:
    tables = {}
    for fmt, res in run["results"].items():
        doc = json.loads(Path(res.manifest["shards"]["dir"], "rl-trace-shards.json").read_text())
        assert doc["schema"] == "rl-trace-shards/1" and doc["span_schema"] == "rl-trace-spans/1"
        assert doc["rows"] == res.manifest["counts"]["events_kept"] == res.manifest["shards"]["rows"] > 300
        tables[fmt] = _rows(res.manifest["shards"]["dir"])
        assert tables[fmt].schema.names == list(schema.NAMES)
    # the fused JSON path (output µs from the base) and the general path (absolute ns) give the same rows
    keys = [c for c in schema.NAMES if c != "ordinal"]
    as_rows = {
        fmt: Counter(map(tuple, (r.values() for r in t.select(keys).to_pylist())))
        for fmt, t in tables.items()
    }
    assert as_rows["json.gz"] == as_rows["pftrace"]
    rows = tables["json.gz"].to_pylist()
    base = run["results"]["json.gz"].manifest["timeline"]["base_ns"]
    # the TokenSpeed rank has no process record: the planner places it by its folder (c)
    assert all(r["ts_ns"] >= base and r["host"] in ("h-a", "h-b", "h-c", "c") for r in rows)
    updates = [r for r in rows if r["name"] == "actor_update" and r["source"] == "RL-Insight"]
    for r in updates:  # h-b wrote its spans 25 ms ahead: the rows hold the corrected time
        assert r["pid"] == ACTOR_PID and r["role"] == "actor" and r["run"] == "run-cluster"
        assert r["rank"] == {"h-a": 0, "h-b": 1}[r["host"]] and r["lane"] == f"rank_{r['rank']}"
        assert r["ts_ns"] == run["truth"]["actor_update"][(r["host"], r["step"])]
    assert OFFSET_NS and {r["step"] for r in updates} == {1, 2}
    kernels = [r for r in rows if r["category"] == "kernel" and r["source"] == "Torch"]
    assert kernels and {r["device"] for r in kernels} == {"GPU 0"} and all(r["step"] == 1 for r in kernels)
    outs = Counter(r["flow_out_id"] for r in rows if r["flow_out_id"] is not None)
    ins = Counter(r["flow_in_id"] for r in rows if r["flow_in_id"] is not None)
    assert outs and set(ins) <= set(outs)  # every arrival has its departure, ids namespaced per file
    counters = [r for r in rows if r["ph"] == "C"]
    assert {r["name"] for r in counters} >= {"actor/pg_loss"} and all(json.loads(r["args"]) for r in counters)


def test_the_report_reads_shards_and_equals_the_report_from_json(run: dict[str, Any], capsys: Any) -> None:
    res = run["results"]
    from_json = summarize(res["json.gz"].output)
    from_shards = summarize(res["json.gz"].manifest["shards"]["dir"])
    for s in (from_json, from_shards):
        for key in ("path", "loader", "manifest"):
            s["source"].pop(key)
    assert from_shards == from_json and from_json["steps"] and from_json["metrics"]
    # a .pftrace is reported on through the shards its manifest names
    assert cli_main(["report", res["pftrace"].output, "--quiet", "--json", str(run["out"] / "r.json")]) == 0
    assert json.loads((run["out"] / "r.json").read_text())["source"]["loader"] == "shards"
    bare = run["out"] / "bare.pftrace"
    assert merge([str(run["base"] / "run")], str(bare), MergeOptions()).exit_code == 0
    capsys.readouterr()
    assert cli_main(["report", str(bare), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "--shards DIR" in err and str(bare) in err and len(err.strip().splitlines()) == 1


@pytest.mark.perfetto
def test_views_from_shards_open_in_perfetto_with_their_manifest_counts(
    run: dict[str, Any], engine: Any
) -> None:
    shards = run["results"]["json.gz"].manifest["shards"]["dir"]
    out = run["out"] / "views"
    views = merge_steps([shards], str(out / "v.pftrace.gz"), MergeOptions())
    views += [merge([shards], str(out / "actors.json.gz"), MergeOptions(roles=("actor",)))]
    views += [merge([shards], str(out / "s1.json.gz"), MergeOptions(steps=((1, 1),)))]
    assert [Path(v.output).name for v in views] == [
        "v.step1.pftrace.gz",
        "v.step2.pftrace.gz",
        "actors.json.gz",
        "s1.json.gz",
    ]
    for v in views:
        counts = v.manifest["counts"]
        loaded = engine.load(v.output)
        assert v.exit_code == 0 and loaded.ok, loaded.summary()
        assert (loaded.slices, loaded.flows, loaded.counters, loaded.processes) == (
            counts["slices"], counts["flows"], counts["counter_samples"], counts["processes"],
        )  # fmt: skip
        assert v.manifest["output"]["ui_memory"]["fits"]
    names = {r["role"] for r in _rows(shards).filter(pa.compute.equal(_rows(shards)["step"], 1)).to_pylist()}
    assert names >= {"actor", "trainer"}
    actors = views[2].manifest
    assert {p["name"].split(" · ")[2].split(" ")[0] for p in actors["processes"] if p["device"] is None} == {
        "actor"
    }
    rows_step1 = _rows(shards).filter(pa.compute.equal(_rows(shards)["step"], 1)).num_rows
    assert views[0].manifest["counts"]["events_kept"] <= rows_step1  # half flows are left out


@pytest.mark.perfetto
def test_a_perfetto_archive_holds_each_host_in_its_own_clock(run: dict[str, Any], engine: Any) -> None:
    """``-o run.tar``: per host a .pftrace in that host's clock and a perfetto_manifest relating it to the
    reference host by minus its measured offset (Perfetto >= v58 merges it; our engine is v52, so each
    file is checked on its own, and the manifest against the format's reference)."""
    shards = run["results"]["json.gz"].manifest["shards"]["dir"]
    out = run["out"] / "run.tar"
    res = merge([shards], str(out), MergeOptions())
    assert res.exit_code == 0 and res.manifest["output"]["format"] == "tar"
    folder = run["out"] / "archive"
    with tarfile.open(out) as tar:
        assert tar.getnames()[0] == "perfetto_manifest.json"
        tar.extractall(folder, filter="data")
    doc = json.loads((folder / "perfetto_manifest.json").read_text())
    assert list(doc) == ["perfetto_manifest"]
    pm = doc["perfetto_manifest"]
    assert pm["version"] == 1 and pm["trace_time"] == {"clock": "BOOTTIME", "file": "h-a.pftrace"}
    files = {f["path"]: f for f in pm["files"]}
    assert set(files) == {"h-a.pftrace", "h-b.pftrace", "h-c.pftrace", "c.pftrace"}
    assert all(f["machine"]["name"] == f["path"].removesuffix(".pftrace") for f in files.values())
    assert "clocks" not in files["h-a.pftrace"]
    assert files["h-b.pftrace"]["clocks"] == {
        "clock": "BOOTTIME", "sync_to": {"file": "h-a.pftrace", "clock": "BOOTTIME"}, "offset_ns": -OFFSET_NS,
    }  # fmt: skip
    assert all(isinstance(v, str | int) for v in pm["attributes"].values())
    sql = "select min(ts) from slice where name = 'actor_update'"
    starts, slices = {}, 0
    for name in files:
        loaded = engine.load(folder / name, [sql])
        assert loaded.ok, loaded.summary()
        slices += loaded.slices
        starts[name] = loaded.queries[0].scalar()
    assert slices == res.manifest["counts"]["slices"]
    truth = run["truth"]["actor_update"]
    # h-b's file is on h-b's clock: its spans sit OFFSET_NS later than the merged timeline has them
    assert starts["h-b.pftrace"] - starts["h-a.pftrace"] == truth[("h-b", 1)] - truth[("h-a", 1)] + OFFSET_NS


def test_shards_inside_the_inputs_are_ignored_and_stale_parts_go(run: dict[str, Any]) -> None:
    runs = run["base"] / "run"
    inside = runs / "shards"
    first = merge([str(runs)], str(run["out"] / "again.json.gz"), MergeOptions(shards=str(inside)))
    old = {f["path"] for f in json.loads((inside / "rl-trace-shards.json").read_text())["files"]}
    second = merge([str(runs)], str(run["out"] / "again.json.gz"), MergeOptions(shards=str(inside)))
    assert first.manifest["counts"] == second.manifest["counts"]  # the parts of the first were not read
    assert not [p for p in second.manifest["problems"] if p["kind"] == "not_a_trace"]
    new = {f["path"] for f in json.loads((inside / "rl-trace-shards.json").read_text())["files"]}
    on_disk = {p.relative_to(inside).as_posix() for p in inside.glob("step=*/host=*/*")}
    assert on_disk == new and not (old & new)  # a new merge's parts, the earlier ones removed


def test_views_and_usage_errors_say_one_line(run: dict[str, Any], capsys: Any) -> None:
    shards = run["results"]["json.gz"].manifest["shards"]["dir"]
    out = str(run["out"] / "x.json.gz")
    for args in (
        ["merge", shards, "-o", out, "--min-duration-us", "5"],
        ["merge", str(run["base"] / "run"), "-o", out, "--shards", "s3://bucket/x"],
        ["merge", str(run["base"] / "run"), "-o", out, "--shards", str(run["out"] / "s"), "--split-steps"],
    ):
        capsys.readouterr()
        assert cli_main(args) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err, err


def test_a_trace_too_big_for_the_browser_says_which_views_fit(
    run: dict[str, Any], capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rl_trace_observer.merge.manifest import ui

    monkeypatch.setattr(ui, "BYTES_PER_EVENT", 10_000_000)
    shards = str(run["out"] / "big-shards")
    capsys.readouterr()
    code = cli_main(
        ["merge", str(run["base"] / "run"), "-o", str(run["out"] / "big.pftrace"), "--shards", shards]
    )
    err = capsys.readouterr().err
    assert code == 0 and "in the Perfetto UI (its limit is ~2 GB)" in err
    assert f"rl-trace merge {Path(shards).resolve()} --split-steps" in err
    manifest = json.loads((run["out"] / "big.pftrace.manifest.json").read_text())
    assert manifest["output"]["ui_memory"]["fits"] is False


def test_without_pyarrow_the_core_merges_and_shards_say_how_to_install() -> None:
    code = f"""
        import sys, json
        sys.modules["pyarrow"] = None  # as if the extra were not installed
        from rl_trace_observer.cli.main import main
        import rl_trace_observer.merge.pipeline
        print(json.dumps({{"heavy": sorted(m for m in sys.modules if m.startswith("pyarrow"))}}))
        sys.exit(main(["merge", "{ROOT}/tests", "-o", "/nonexistent/x.json", "--shards", "/tmp/x"]))
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=clean_env(), capture_output=True, text=True
    )
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'rl-trace-observer[shards]'" in proc.stderr
    assert json.loads(proc.stdout.splitlines()[0]) == {"heavy": ["pyarrow"]}  # only the poisoned name


def test_formats_doc_lists_every_column() -> None:
    assert schema.markdown_table() in (ROOT / "docs" / "FORMATS.md").read_text()


# --------------------------------------------------------------- rows <-> events (property)
_PIDS = (256, 512, 513)  # a process, another, and the second's GPU 0


def _sink(tmp: Path, base: int) -> tuple[ShardSink, Any, Any]:
    windows = ((base, base + (1 << 47), 1),)
    spec = ShardSpec(str(tmp), "t", {ProcessKey("h", 7): ProcMeta("r", "actor", 0)}, windows, {})
    mapper = SimpleNamespace(
        processes={
            256: ProcessDecl(256, ProcessKey("h", 7)),
            512: ProcessDecl(512, ProcessKey("h", 8)),
            513: ProcessDecl(513, ProcessKey("h", 8), "GPU 0"),
        },
        threads={(p, t): ThreadDecl(p, t, f"Torch · thread {t}", t) for p in _PIDS for t in (1, 2)},
        reader=SimpleNamespace(label="Torch"),
    )
    task = SimpleNamespace(
        host="h", owner_key=ProcessKey("h", 7), index=0, source=SimpleNamespace(rel="h/f.json")
    )
    return ShardSink(spec, 3), mapper, task


_common = dict(pid=st.sampled_from(_PIDS), tid=st.sampled_from((1, 2)), ts=st.integers(0, (1 << 47) - 1))
_args = st.one_of(
    st.none(), st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=8), max_size=3)
)


@st.composite
def _events(draw: Any) -> list[dict[str, Any]]:
    out = []
    for _ in range(draw(st.integers(0, 25))):
        kind = draw(st.sampled_from(["X", "i", "C", "flow", "b", "bind"]))
        ev = {k: draw(v) for k, v in _common.items()}
        ev["name"] = draw(st.text(min_size=1, max_size=10))
        ev["cat"] = draw(st.sampled_from(["cpu_op", "kernel", "rl_insight"]))
        args = draw(_args)
        if args is not None:
            ev["args"] = args
        if kind in ("X", "bind"):
            ev.update(ph="X", dur=draw(st.integers(0, 10**9)))
            if kind == "bind":
                fid = draw(st.integers(1, 1 << 60))
                out.append({**ev, "bind_id": fid, "flow_out": True})
                ev = {**ev, "bind_id": fid, "flow_in": True, "ts": ev["ts"]}
        elif kind == "i":
            ev.update(ph="i", s=draw(st.sampled_from(["t", "p"])))
        elif kind == "C":
            ev.update(ph="C", args={"value": draw(st.integers(-5, 5))})
        elif kind == "b":
            ev.update(ph="b", id=draw(st.integers(1, 1 << 60)))
        else:
            fid = draw(st.integers(1, 1 << 60))
            out.append({**ev, "ph": "s", "id": fid})
            ev.update(ph="f", id=fid, bp="e")
        out.append(ev)
    return out


def _struct(d: dict[str, Any], base: int, fast: bool) -> Event:
    d = dict(d)
    args = d.pop("args", None)
    if fast:  # what the fused path hands over: output µs from the base
        d["ts"] = d["ts"] / 1000
        if "dur" in d:
            d["dur"] = d["dur"] / 1000
    else:
        d["ts"] = base + d["ts"]
    e = Event(**d)
    if args is not None:
        e.args = msgspec.Raw(json.dumps(args).encode())
    return e


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(evs=_events(), fast=st.booleans())
def test_events_survive_rows_and_back_exactly(tmp_path: Path, evs: list[dict[str, Any]], fast: bool) -> None:
    base = 1_700_000_000_000_000_000
    sink, mapper, task = _sink(tmp_path, base)
    table = sink._table([_struct(d, base, fast) for d in evs], task, mapper, base if fast else None)
    assert table.num_rows == len(evs) and table.column("ordinal").to_pylist() == list(range(len(evs)))
    back, _ = view._events(table)
    assert len(back) == len(evs)  # every flow here has both ends
    for d, e, row in zip(evs, back, table.to_pylist(), strict=True):
        assert e.ph == d["ph"] and e.name == d["name"] and e.cat == d["cat"]
        assert (e.pid, e.tid, e.ts) == (d["pid"], d["tid"], base + d["ts"])
        assert row["device"] == ("GPU 0" if d["pid"] == 513 else None)
        assert row["role"] == ("actor" if d["pid"] == 256 else None) and row["step"] == 1
        assert (e.dur if d["ph"] == "X" else None) == d.get("dur")
        for key in ("id", "bind_id", "flow_in", "flow_out", "bp", "s"):
            assert getattr(e, key, None) == d.get(key, msgspec.UNSET), key
        assert (json.loads(bytes(e.args)) if "args" in d else None) == d.get("args")
