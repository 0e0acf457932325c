"""Real trace files written by others (``../shared/real-traces/<set>``, sources in its SOURCES.md), each
set merged to every output format and checked in the real Perfetto engine against the originals.

The sets are named after the quirk they cover: Kineto from torch < 2.4 (absolute epoch µs, no anchor),
``baseTimeNanoseconds`` at the end of the file, keys re-ordered by a harness (``schemaVersion`` after the
events), CUDA-graph launches (one flow start, one end per kernel), MTIA and SGLang traces with slices
Perfetto drops as overlapping, VizTracer reports whose metadata sits past the first 64 KiB. They are
read from ``../shared`` and never copied into this repository.

For every set and format: the merge keeps every event Perfetto keeps (slice and flow counts equal to the
originals' opened one by one) plus the slices Perfetto drops there for not nesting, which it puts on an
overlap track beside their thread (counted in the manifest); it imports with no error, names no
problem (these files come with no process records: plain profiler traces are placed by their own
pids, which is no problem), puts every GPU kernel of the files — all of them — at its exact ns on its
own rank's device process, and writes ``.pftrace`` equal to ``.json.gz`` slice for slice and flow for
flow.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from rl_trace_observer.merge.pipeline import merge

from ..conftest import REAL_TRACES_REL, real_trace_sets, real_traces_dir

REAL = real_traces_dir()
SETS = real_trace_sets()
FORMATS = ("json.gz", "pftrace", "pftrace.gz")
_SLICES = (
    "select p.name as process, t.name as thread, s.name, s.ts, s.dur, s.depth, s.category "
    "from slice s left join thread_track tt on s.track_id = tt.id left join thread t using(utid) "
    "left join process p using(upid)"
)
_FLOWS = (
    "select a.name, a.ts, b.name, b.ts from flow f join slice a on a.id = f.slice_out "
    "join slice b on b.id = f.slice_in"
)

pytestmark = [
    pytest.mark.perfetto,
    pytest.mark.skipif(
        not SETS, reason=f"no real traces at {REAL} ({REAL_TRACES_REL} beside the repository)"
    ),
]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("real-traces")


_KERNELS = "select name, ts, dur from slice where category = 'kernel'"


@cache
def _originals(engine: Any, name: str) -> tuple[int, int, Counter[tuple[str, int, int]]]:
    """Slices and flows Perfetto imports from the set's files opened one by one, and the GPU kernels it
    keeps there: (name, absolute start ns, duration ns) — Perfetto reads a Kineto file's ``ts`` as is,
    so its anchor (``baseTimeNanoseconds``) is added here."""
    slices = flows = 0
    kernels: Counter[tuple[str, int, int]] = Counter()
    for f in sorted((REAL / name).iterdir()):
        res = engine.load(str(f), queries=[_KERNELS])
        slices, flows = slices + res.slices, flows + res.flows
        doc = _load(f)
        if isinstance(doc, dict) and "schemaVersion" in doc:
            anchor = int(doc.get("baseTimeNanoseconds") or 0)
            kernels.update((k, anchor + ts, dur) for k, ts, dur in res.queries[0].rows)
    return slices, flows, kernels


@cache
def _merged(out_dir: Path, name: str, fmt: str) -> tuple[dict[str, Any], Path]:
    out = out_dir / f"{name}.{fmt}"
    res = merge([str(REAL / name)], str(out))
    return res.manifest, out


def _load(path: Path) -> Any:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw, parse_float=Decimal)


def _expected_kernels(name: str) -> Counter[tuple[int, int, str, int, int]]:
    """(OS pid, device, kernel name, absolute start ns, duration ns) of every kernel, exact."""
    out: Counter[tuple[int, int, str, int, int]] = Counter()
    for f in sorted((REAL / name).iterdir()):
        doc = _load(f)
        if not isinstance(doc, dict) or "schemaVersion" not in doc:
            continue
        anchor = int(doc.get("baseTimeNanoseconds") or 0)
        events = doc["traceEvents"]
        host_pids = Counter(
            e["pid"] for e in events if e.get("ph") == "X" and isinstance(e.get("pid"), int) and e["pid"] > 64
        )
        os_pid = host_pids.most_common(1)[0][0]
        for e in events:
            if e.get("cat") == "kernel" and e.get("ph") == "X":
                ts = anchor + int(Decimal(e["ts"]) * 1000)
                out[(os_pid, int(e["pid"]), e["name"], ts, int(Decimal(e["dur"]) * 1000))] += 1
    return out


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", SETS)
def test_real_set_merges_like_the_originals(engine: Any, outputs: Path, name: str, fmt: str) -> None:
    manifest, out = _merged(outputs, name, fmt)
    assert manifest["problems"] == [] and manifest["status"] == "ok" and out.exists()
    assert all(a["placement"] for a in manifest["artifacts"] if a["kind"] != "merge_output")
    res = engine.load(str(out), queries=[_SLICES, _FLOWS])
    assert res.ok, res.summary()  # no import error at all
    slices, flows, kept_kernels = _originals(engine, name)
    moved = manifest["counts"].get("slices_on_overlap_tracks", 0)
    assert (res.slices, res.flows) == (slices + moved, flows)
    assert "slices_dropped_overlapping" not in manifest["counts"]
    assert sum(1 for row in res.queries[0].rows if "(overlap" in (row[1] or "")) == moved
    assert (manifest["counts"]["slices"], manifest["counts"]["flows"]) == (res.slices, res.flows)
    processes = {row[0] for row in res.queries[0].rows if row[0]}
    assert not any(p.endswith((" · Traces", " · Kineto")) for p in processes), processes

    expected = _expected_kernels(name)
    if expected:
        base = manifest["timeline"]["base_ns"]
        found: Counter[tuple[int, int, str, int, int]] = Counter()
        for process, _thread, slice_name, ts, dur, _depth, cat in res.queries[0].rows:
            if cat != "kernel":
                continue
            m = re.search(r"pid (\d+).* · (?:GPU|MTIA|Device) (\d+)$", process or "")
            assert m, f"kernel {slice_name!r} on {process!r}, not on a device of its rank's process"
            found[(int(m.group(1)), int(m.group(2)), slice_name, base + ts, dur)] += 1
        # every kernel of the files, exact, on its own device, none lost or added — also those
        # Perfetto drops when it opens the originals (overlapping the one before on their stream)
        assert found == expected
        placed: Counter[tuple[str, int, int]] = Counter()
        for (_pid, _device, *kernel), n in found.items():
            placed[(kernel[0], kernel[1], kernel[2])] += n
        assert not kept_kernels - placed


@pytest.mark.parametrize("name", SETS)
def test_real_set_pftrace_equals_json(engine: Any, outputs: Path, name: str) -> None:
    """Event for event: the same slices (process, thread, name, ts, dur, depth) and the same flows."""
    seen = []
    for fmt in ("json.gz", "pftrace"):
        _, out = _merged(outputs, name, fmt)
        res = engine.load(str(out), queries=[_SLICES, _FLOWS])
        slices = Counter(row[:6] for row in res.queries[0].rows if row[1] is not None)
        unowned = Counter((row[2], row[3]) for row in res.queries[0].rows if row[1] is None)
        seen.append((slices, unowned, Counter(res.queries[1].rows)))
    (js, ju, jf), (ps, pu, pf) = seen
    assert js == ps
    assert ju == pu  # global instants: their tracks are named differently, their events are the same
    assert jf == pf
