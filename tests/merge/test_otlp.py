"""OTLP spans (docs/FORMATS.md, "OTLP spans"), on files the REAL OpenTelemetry SDK wrote.

Three processes (a NeMo-RL-shaped driver, a generation worker and a policy worker: tests/corpus/
otlp_sdk_proc.py) trace with ``opentelemetry-sdk`` and export with the real OTLP/HTTP protobuf exporter
to a loopback receiver that saves each body (and its OTLP/JSON twin). The real CLI merges them; the
checks read the files with the real ``opentelemetry-proto`` package (tests/corpus/otlp_oracle.py) and
the merged trace in Perfetto's own engine: nesting, cross-process flows, args, the report's
``rl.bucket`` goodput per step and role, the SQL step table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rl_trace_observer.merge.files.sources import discover, read_head
from rl_trace_observer.merge.formats import ReadContext, sniff
from rl_trace_observer.merge.formats.otlp import Otlp
from rl_trace_observer.testing.perfetto import engine as pe

from ..conftest import need
from ..corpus.otlp_collector import Collector
from ..corpus.otlp_oracle import OSpan, expected_goodput, read_spans

ROOT = Path(__file__).resolve().parents[2]
PROC = Path(__file__).parents[1] / "corpus" / "otlp_sdk_proc.py"
STEPS = 2


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rl_trace_observer.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def sdk_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[OSpan]]:
    base = tmp_path_factory.mktemp("otlp")
    pb, js, console = base / "pb", base / "json", base / "console"
    console.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTLP_TEST_CONSOLE_DIR"] = str(console)
    with Collector(pb, js) as c:
        subprocess.run([sys.executable, str(PROC), "driver", c.endpoint], check=True, timeout=180, env=env)
    files = sorted(pb.glob("*.binpb"))
    assert len(files) >= 3, files  # one body (at least) per process
    return pb, js, read_spans(files)


@pytest.fixture(scope="module")
def merged(sdk_run: tuple[Path, Path, list[OSpan]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("otlp-out") / "run.json"
    r = cli("merge", str(sdk_run[0]), "-o", str(out), "--workers", "0")
    assert r.returncode == 0, r.stderr
    return out


def _slices(path: Path) -> list[dict[str, Any]]:
    return [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]


def test_the_sdk_files_are_recognised_and_placed_by_their_resources(sdk_run: Any, merged: Path) -> None:
    pb, js, spans = sdk_run
    for path in [*pb.iterdir(), *js.iterdir()]:
        (src,) = discover([str(path)])
        fmt, head = sniff(read_head(src))
        assert fmt is not None and fmt.kind == "otlp", path
        hints = fmt.hints(head)
        assert hints.pid in {s.pid for s in spans} and hints.host and hints.process_role
    manifest = json.loads(Path(f"{merged}.manifest.json").read_text())
    assert not [p for p in manifest["problems"] if p["kind"] not in ("unlinked",)], manifest["problems"]
    roles = {a["role"] for a in manifest["artifacts"]}
    assert roles == {"nemo-rl", "vllm_policy", "lm_policy"}
    names = {
        e["args"]["name"]
        for e in json.loads(merged.read_text())["traceEvents"]
        if e.get("name") == "process_name"
    }
    assert {n.split(" · ")[-1] for n in names} == {"nemo-rl", "vllm_policy rank 0", "lm_policy rank 0"}, names
    assert len(_slices(merged)) == len(spans)  # every span once; nothing dropped


def test_json_and_protobuf_read_the_same(sdk_run: Any) -> None:
    pb, js, _ = sdk_run
    fmt = Otlp()
    for p in sorted(pb.glob("*.binpb")):
        j = js / p.name.replace(".binpb", ".otlp.json")
        a = fmt.read(p.read_bytes(), ReadContext(str(p), p.name))
        b = fmt.read(j.read_bytes(), ReadContext(str(j), j.name))
        assert a.events and a.events == b.events and a.thread_names == b.thread_names
        assert a.dropped == b.dropped == 0 and a.complete and b.complete


@pytest.mark.perfetto
def test_perfetto_sees_nesting_flows_and_args(sdk_run: Any, merged: Path, tmp_path: Path) -> None:
    """Parents in the same process nest (Perfetto's parent_id is the OTLP parent); a parent in
    another process is a flow from that span; attributes are args; both outputs import cleanly."""
    reason = pe.unavailable_reason()
    if reason:
        pytest.skip(reason)
    _, _, spans = sdk_run
    by_id = {s.span_id: s for s in spans}
    nest = (
        "SELECT extract_arg(c.arg_set_id, 'args.otlp.span_id') AS id, "
        "extract_arg(p.arg_set_id, 'args.otlp.span_id') AS parent, "
        "extract_arg(c.arg_set_id, 'args.rl.bucket') AS bucket "
        "FROM slice c LEFT JOIN slice p ON c.parent_id = p.id WHERE c.category = 'otlp'"
    )
    flows = (
        "SELECT extract_arg(o.arg_set_id, 'args.otlp.span_id') AS src, "
        "extract_arg(i.arg_set_id, 'args.otlp.span_id') AS dst "
        "FROM flow f JOIN slice o ON f.slice_out = o.id JOIN slice i ON f.slice_in = i.id"
    )
    res = pe.expect_clean(merged, [nest, flows], min_slices=len(spans))
    rows = res.query(nest).dicts()
    assert len(rows) == len(spans)
    for row in rows:
        s = by_id[row["id"]]
        local = s.parent in by_id and by_id[s.parent].pid == s.pid
        assert row["parent"] == (s.parent if local else None), (s.name, row)
        assert row["bucket"] == s.attrs.get("rl.bucket")
    remote = {(s.parent, s.span_id) for s in spans if s.parent in by_id and by_id[s.parent].pid != s.pid}
    assert len(remote) == 3 * STEPS  # generate, logprob and update calls, each step
    assert {(r["src"], r["dst"]) for r in res.query(flows).dicts()} == remote
    linked = [s for s in spans if s.links]
    assert linked and all(by_id[k.split(":")[1]].pid != s.pid for s in linked for k in s.links)
    pftrace = tmp_path / "run.pftrace"
    assert cli("merge", str(sdk_run[0]), "-o", str(pftrace), "--workers", "0").returncode == 0
    proto = pe.expect_clean(pftrace, min_slices=len(spans))
    assert proto.flows == len(remote)


def test_report_counts_rl_bucket_time_per_step_and_role(sdk_run: Any, merged: Path, tmp_path: Path) -> None:
    _, _, spans = sdk_run
    out = tmp_path / "report.json"
    r = cli("report", str(merged), "--json", str(out), "-q")
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.read_text())
    assert rep["source"]["stage_source"] == "rl_bucket" and rep["source"]["steps_from"] == "rl.grpo.step"
    assert [s["step"] for s in rep["steps"]] == list(range(1, STEPS + 1))
    want = expected_goodput(spans)
    got = {
        (st["step"], row["role"]): {
            k: row[k] for k in ("productive_ns", "overhead_ns", "idle_ns", "wasted_ns")
        }
        for st in rep["goodput"]["steps"]
        for row in st["roles"]
    }
    assert got == want
    assert all(v["wasted_ns"] > 0 for (_, role), v in want.items() if role == "vllm_policy")  # a real check
    driver = [v for (_, role), v in want.items() if role == "nemo-rl"]
    assert all(v["productive_ns"] and v["overhead_ns"] and v["idle_ns"] for v in driver)


def test_sql_reads_the_steps_unchanged(merged: Path) -> None:
    r = cli("sql", str(merged), "SELECT step FROM steps ORDER BY step", "--json")
    if r.returncode != 0 and "duckdb" in (r.stderr + r.stdout).lower():
        pytest.skip("rl-trace sql needs the sql extra")
    assert r.returncode == 0, r.stderr
    assert [row["step"] for row in json.loads(r.stdout)] == list(range(1, STEPS + 1))


def test_bad_files_cost_only_what_is_bad(sdk_run: Any, tmp_path: Path) -> None:
    """A cut protobuf keeps its whole blocks and says ``incomplete`` (naming the file); a bad JSON line
    is dropped and counted; the good files merge as before."""
    pb, js, _ = sdk_run
    run = tmp_path / "run"
    run.mkdir()
    files = sorted(pb.glob("*.binpb"))
    good, cut = files[0], files[1]
    (run / good.name).write_bytes(good.read_bytes())
    (run / cut.name).write_bytes(cut.read_bytes()[: len(cut.read_bytes()) // 2])
    lines = run / "more.otlp.jsonl"
    twin = (js / files[2].name.replace(".binpb", ".otlp.json")).read_text()
    lines.write_text(twin + "\n{not json\n" + twin + "\n")
    out = tmp_path / "out.json"
    r = cli("merge", str(run), "-o", str(out), "--workers", "0")
    assert r.returncode in (0, 1), r.stderr
    manifest = json.loads(Path(f"{out}.manifest.json").read_text())
    incomplete = [p for p in manifest["problems"] if p["kind"] == "incomplete"]
    assert [Path(p["path"]).name for p in incomplete] == [cut.name], manifest["problems"]
    arts = {Path(a["path"]).name: a for a in manifest["artifacts"]}
    assert arts[lines.name]["events"]["dropped"] == 1
    kept = sum(1 for e in _slices(out) if e["cat"] == "otlp")
    in_good = Otlp().read(good.read_bytes(), ReadContext(str(good), good.name))
    in_lines = Otlp().read(lines.read_bytes(), ReadContext(str(lines), lines.name))
    assert kept >= sum(1 for e in [*in_good.events, *in_lines.events] if e.ph == "X") > 0


def test_the_sdks_console_json_reads_as_the_same_spans(sdk_run: Any, merged: Path, tmp_path: Path) -> None:
    """ConsoleSpanExporter's file (``to_json()`` objects, µs ISO times): the same slices, nesting and
    flows as the OTLP bodies, each time within the 1 µs its text keeps."""
    pb, _, spans = sdk_run
    console = pb.parent / "console"
    assert len(list(console.glob("console-*.json"))) == 3
    out = tmp_path / "console.json"
    r = cli("merge", str(console), "-o", str(out), "--workers", "0")
    assert r.returncode == 0, r.stderr

    def key(e: dict[str, Any]) -> tuple[Any, ...]:
        return (e["args"]["otlp.span_id"], e["name"], e["pid"], e["tid"], e.get("bind_id") is not None)

    a = sorted(_slices(merged), key=lambda e: e["args"]["otlp.span_id"])
    b = sorted(_slices(out), key=lambda e: e["args"]["otlp.span_id"])
    assert [key(e)[1:3] for e in a] == [key(e)[1:3] for e in b] and len(b) == len(spans)
    assert [e["args"].get("rl.bucket") for e in a] == [e["args"].get("rl.bucket") for e in b]
    base_a = min(e["ts"] for e in a)
    base_b = min(e["ts"] for e in b)
    for x, y in zip(a, b, strict=True):  # µs floats relative to each trace's base
        assert abs((x["ts"] - base_a) - (y["ts"] - base_b)) <= 2.0, (x["name"], x["ts"], y["ts"])
    flows_a = sum(1 for e in a if e.get("flow_in"))
    assert flows_a == sum(1 for e in b if e.get("flow_in")) > 0


def test_span_shards_report_and_diff_read_the_same_goodput(
    sdk_run: Any, merged: Path, tmp_path: Path
) -> None:
    """The report from span shards (the Arrow loader) counts rl.bucket time as the trace's loader does,
    and ``rl-trace diff`` compares two such reports unchanged."""
    need("pyarrow")
    shards, out = tmp_path / "shards", tmp_path / "run.pftrace"
    r = cli("merge", str(sdk_run[0]), "-o", str(out), "--shards", str(shards), "--workers", "0")
    assert r.returncode == 0, r.stderr
    reports = []
    for source in (merged, shards):
        path = tmp_path / f"{source.name}.report.json"
        assert cli("report", str(source), "--json", str(path), "-q").returncode == 0
        reports.append(path)
    a, b = (json.loads(p.read_text())["goodput"] for p in reports)
    assert a["steps"] == b["steps"] and a["roles"] == b["roles"]
    assert expected_goodput(sdk_run[2]) == {
        (st["step"], row["role"]): {
            k: row[k] for k in ("productive_ns", "overhead_ns", "idle_ns", "wasted_ns")
        }
        for st in b["steps"]
        for row in st["roles"]
    }
    diff = tmp_path / "diff.json"
    d = cli("diff", str(reports[0]), str(reports[1]), "--json", str(diff))
    assert d.returncode == 0, d.stderr
    rows = json.loads(diff.read_text())["rows"]
    assert rows and all(r["delta_ns"] == 0 for r in rows)  # the same run read two ways


def test_a_collector_file_of_every_process_names_each_by_its_resource(sdk_run: Any, tmp_path: Path) -> None:
    """A Collector's ``file`` exporter writes every process's spans into one JSON-lines file: each
    resource is its own process, titled with its role, and the report's roles are the same three."""
    _, js, spans = sdk_run
    run = tmp_path / "run"
    run.mkdir()
    docs = [json.loads(p.read_text()) for p in sorted(js.glob("*.otlp.json"))]
    (run / "traces.otlp.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    out = tmp_path / "out.json"
    assert cli("merge", str(run), "-o", str(out), "--workers", "0").returncode == 0
    titles = {
        e["args"]["name"].split(" · ", 2)[-1]
        for e in json.loads(out.read_text())["traceEvents"]
        if e.get("name") == "process_name"
    }
    assert len(titles) == 3 and {t.split(" rank")[0] for t in titles} == {
        "nemo-rl",
        "vllm_policy",
        "lm_policy",
    }
    assert len(_slices(out)) == len(spans)
    rep = tmp_path / "report.json"
    assert cli("report", str(out), "--json", str(rep), "-q").returncode == 0
    roles = {r["role"] for r in json.loads(rep.read_text())["goodput"]["roles"]}
    assert roles == {"nemo-rl", "vllm_policy", "lm_policy"}


def test_the_live_watch_answers_otlp_steps_as_the_report_does(sdk_run: Any, tmp_path: Path) -> None:
    """``rl-trace watch`` on a Collector's OTLP/JSON lines: the steps are NeMo-RL's ``rl.grpo.step``
    spans, answered once each, with the figures the post-hoc report gives."""
    need("pyarrow")
    import rl_trace_observer as rto
    from rl_trace_observer.analysis.live.figures import step_figures
    from rl_trace_observer.analysis.live.options import WatchOptions
    from rl_trace_observer.analysis.live.watch import Watch, load_state

    _, js, _ = sdk_run
    run = tmp_path / "run"
    run.mkdir()
    docs = [json.loads(p.read_text()) for p in sorted(js.glob("*.otlp.json"))]
    (run / "traces.otlp.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    out = tmp_path / "watch"
    watch = Watch(WatchOptions(run, out, settle_s=0))
    assert sorted(watch.look(final=True)) == list(range(1, STEPS + 1))
    rto.merge([str(run)], str(tmp_path / "post.pftrace"), rto.MergeOptions(shards=str(tmp_path / "shards")))
    summary = rto.report(str(tmp_path / "shards"))
    assert sorted(int(s) for s in load_state(out)["steps"]) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        record = json.loads((out / "steps" / f"step-{step}.json").read_text())
        assert record["figures"] == json.loads(json.dumps(step_figures(summary, step)))
        assert record["figures"]["goodput.steps"][0]["roles"]
