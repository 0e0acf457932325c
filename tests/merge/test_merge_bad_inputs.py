"""Bad inputs: each gives its problem kind and a one-line message naming the file; nothing outside the
inputs is read; everything readable is still merged."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from rl_trace_observer.merge.options import MergeOptions
from rl_trace_observer.merge.pipeline import merge

from ..corpus.kineto_cpu import kineto_cpu_events
from ..corpus.recorded import record_process

T0 = time.time_ns()


def _kineto(pid: int, n: int) -> dict[str, Any]:
    events = kineto_cpu_events(pid, n)
    return {"schemaVersion": 1, "deviceProperties": [], "baseTimeNanoseconds": T0, "traceEvents": events}


def _viz(pid: int, events: list[str]) -> bytes:
    thread = f'{{"ph":"M","pid":{pid},"tid":{pid},"name":"thread_name","args":{{"name":"MainThread"}}}}'
    body = ",".join([thread, *events])
    meta = f'"viztracer_metadata":{{"version":"1.1.1","baseTimeNanoseconds":{T0}}}'
    return ('{"traceEvents":[' + body + "]," + meta + "}").encode()


def _x(pid: int, name: str, ts: str, dur: str = "5.0") -> str:
    return f'{{"pid":{pid},"tid":{pid},"ts":{ts},"ph":"X","dur":{dur},"name":"{name}","cat":"FEE"}}'


@pytest.fixture(scope="module")
def bad_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("bad")
    node = root / "h1"
    record_process(
        node, host="h1", pid=100, rank=0, spans=[("actor_update", T0 + 10**6, T0 + 2 * 10**6, "rank_0")]
    )
    record = json.loads((node / "rl-trace-process-h1-pid-100.json").read_text())
    record["artifacts"].append({"path": "../../etc/passwd", "kind": "torch", "step": 1})
    record["artifacts"].append({"path": "gone.json.gz", "kind": "torch", "step": 1})
    (node / "rl-trace-process-h1-pid-100.json").write_text(json.dumps(record))
    whole = gzip.compress(json.dumps(_kineto(101, 400)).encode())
    (node / "trunc_train_step1_rank1_pid101_x.json.gz").write_bytes(whole[: len(whole) * 2 // 3])
    log = (node / "rl-insight-h1-pid-100.chrome.jsonl").read_bytes()
    (node / "rl-insight-h1-pid-102.chrome.jsonl").write_bytes(
        log.replace(b'"pid":100', b'"pid":102') + log[:40]
    )
    (node / "notatrace.json").write_text(json.dumps({"hello": [1, 2, 3]}))
    (node / "empty.json").write_bytes(b"")
    (node / "types.viztracer.json").write_bytes(
        _viz(
            103,
            [
                _x(103, "good", "100.5"),
                _x(103, "bad_ts", '"abc"'),
                '{"ph":"X","pid":null,"tid":1,"ts":5,"dur":1,"name":"nullpid"}',
            ],
        )
    )
    (node / "nan.viztracer.json").write_bytes(
        _viz(
            104,
            [
                _x(104, "good", "100.5"),
                _x(104, "nan", "NaN"),
                _x(104, "huge", "1e400"),
                _x(104, "inf", "100", "Infinity"),
            ],
        )
    )
    (node / "bytes.viztracer.json").write_bytes(
        _viz(105, [_x(105, "caf\xe9".encode("latin-1").decode("latin-1"), "100.5")]).replace(
            b"caf\xc3\xa9", b"caf\xe9"
        )
    )
    result = merge([str(root)], str(root.parent / f"{root.name}-out" / "out.json"), MergeOptions(workers=0))
    return root, result.manifest


def _problems(manifest: dict[str, Any], kind: str) -> list[dict[str, str]]:
    return [p for p in manifest["problems"] if p["kind"] == kind]


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("incomplete", "trunc_train_step1_rank1_pid101_x.json.gz"),
        ("incomplete", "rl-insight-h1-pid-102.chrome.jsonl"),
        ("incomplete", "empty.json"),
        ("not_a_trace", "notatrace.json"),
        ("dropped_events", "types.viztracer.json"),
        ("dropped_events", "nan.viztracer.json"),
        ("invalid_text", "bytes.viztracer.json"),
        ("outside_inputs", "rl-trace-process-h1-pid-100.json"),
        ("missing", "rl-trace-process-h1-pid-100.json"),
    ],
)
def test_each_bad_input_is_named_with_its_kind(
    bad_run: tuple[Path, dict[str, Any]], kind: str, name: str
) -> None:
    _, manifest = bad_run
    found = [p for p in _problems(manifest, kind) if p["path"].endswith("/" + name)]
    assert found, f"no {kind} problem for {name}: {manifest['problems']}"
    for p in found:
        assert "\n" not in p["detail"] and p["detail"]


def test_everything_readable_is_still_merged(bad_run: tuple[Path, dict[str, Any]]) -> None:
    _, manifest = bad_run
    arts = {Path(a["path"]).name: a for a in manifest["artifacts"]}
    assert arts["rl-insight-h1-pid-100.chrome.jsonl"]["events"]["kept"] == 1
    assert arts["rl-insight-h1-pid-102.chrome.jsonl"]["events"]["kept"] == 1  # lines before the cut
    assert arts["rl-insight-h1-pid-102.chrome.jsonl"]["complete"] is False
    trunc = arts["trunc_train_step1_rank1_pid101_x.json.gz"]
    assert trunc["complete"] is False and 0 < trunc["events"]["kept"] < 400  # salvaged up to the cut
    assert arts["types.viztracer.json"]["events"] == {"read": 3, "kept": 1, "dropped": 2}
    assert arts["nan.viztracer.json"]["events"] == {"read": 4, "kept": 1, "dropped": 3}
    assert arts["bytes.viztracer.json"]["events"]["kept"] == 1
    assert manifest["status"] == "partial" and manifest["output"]["written"]
    out = json.loads(Path(manifest["output"]["path"]).read_text())
    names = {e.get("name") for e in out["traceEvents"] if e["ph"] == "X"}
    assert {"actor_update", "good", "caf\ufffd", "op0"} <= names


def test_a_record_cannot_make_the_merger_read_outside_the_inputs(
    bad_run: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    root, _ = bad_run
    code = textwrap.dedent(
        f"""
        import sys
        opened = []
        def hook(ev, args):
            if ev == "open" and args and "passwd" in str(args[0]):
                opened.append(str(args[0]))
        sys.addaudithook(hook)
        from rl_trace_observer.merge.pipeline import MergeOptions, merge
        merge([{str(root)!r}], {str(tmp_path / "o.json")!r}, MergeOptions(workers=0))
        print("OPENED", opened)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert "OPENED []" in out.stdout, out.stdout + out.stderr
