"""Byte identity of every merge output across a code change: one JSON of sha256s per code version.

    python benchmarks/identity_check.py inputs DIR                  # once: the frozen inputs
    python benchmarks/identity_check.py outputs DIR OUT --json A.json [--real-traces PATH] [--no-ray]
    python benchmarks/identity_check.py compare A.json B.json       # exit 1 on any difference

Why frozen inputs: the test corpus is written by the real tools (torch.profiler, VizTracer,
RL-Insight), whose times differ on every run, so the inputs are generated ONCE and both versions of the
code merge the same bytes. ``outputs`` drives only the ``rl-trace`` command line (in this process), so
it runs unchanged against an older checkout (``PYTHONPATH=OLD/src``, its own compiled encoder built in
place with ``python setup.py build_ext --inplace``).

What is hashed, per input set: the ``.json``, ``.json.gz``, ``.pftrace`` and ``.pftrace.gz`` outputs
(sha256 of the file), the span shards' ROWS (every row of every listed part, sorted by job and
ordinal: Parquet bytes may differ with pyarrow's writer, rows may not), the shard document's plan facts,
and the manifest with its volatile entries (elapsed seconds, memory, temporary paths) removed. Sets:
the test corpus (``tests/corpus``: a real-tools run, the three-node cluster run), every set of real
public traces, a ``benchmarks/gen_run.py`` run (with and without options that leave the fused fast
path), views and a ``.tar`` archive written from shards, the report (JSON summary, critical-path trace),
``rl-trace sql`` and ``rl-trace diff`` on them, and a ``merge --ray`` of the cluster corpus on a local
three-node Ray cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rl_trace_observer.testing.real_traces import real_traces_dir

ROOT = Path(__file__).resolve().parent.parent
FORMATS = ("json", "json.gz", "pftrace", "pftrace.gz")
REAL_TRACES = real_traces_dir(ROOT)  # ../shared/real-traces beside the checkout (or its main checkout)
VOLATILE = re.compile(
    r"(elapsed|seconds|_s$|memory|rss|created|wall_ns_written|dir$|bytes_to_driver|bytes_pieces|"
    r"bytes_shards|bytes_received|^bytes$|^path$|^manifest$|generated|merge_id)"
)
GEN_RUN = [
    "--events",
    "400_000",
    "--ranks",
    "2",
    "--hosts",
    "2",
    "--replicas",
    "1",
    "--tp",
    "2",
    "--jobs",
    "1",
]


# ------------------------------------------------------------------------------------------- inputs
def build_inputs(folder: Path) -> None:
    """The test corpus and a generated run, written once (the real tools' times differ every run)."""
    sys.path.insert(0, str(ROOT))
    from tests.corpus.cluster_run import build_cluster_run
    from tests.corpus.real_run import build_real_run

    folder.mkdir(parents=True, exist_ok=False)
    build_real_run(folder / "corpus-real" / "host-a")
    build_cluster_run(folder / "corpus-cluster")
    gen = [sys.executable, str(ROOT / "benchmarks" / "gen_run.py"), str(folder / "gen-run"), *GEN_RUN]
    subprocess.run(gen, check=True, stdout=subprocess.DEVNULL)
    print(f"inputs in {folder}")


# ----------------------------------------------------------------------------------------- hashing
def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _clean(value: Any, out: str) -> Any:
    """A manifest/summary without what changes between runs of the same code (times, memory, paths)."""
    if isinstance(value, dict):
        return {k: _clean(v, out) for k, v in sorted(value.items()) if not VOLATILE.search(k)}
    if isinstance(value, list):
        return [_clean(v, out) for v in value]
    if isinstance(value, str):
        return value.replace(out, "<OUT>")
    return value


def doc_sha(path: Path, out: Path) -> str:
    data = json.loads(path.read_text())
    return hashlib.sha256(json.dumps(_clean(data, str(out)), sort_keys=True).encode()).hexdigest()


def rows_sha(shards: Path) -> dict[str, Any]:
    """sha256 of every span row (sorted by job, ordinal) and of the shard document's plan facts."""
    import pyarrow.parquet as pq

    doc = json.loads((shards / "rl-trace-shards.json").read_text())
    rows: list[tuple[Any, ...]] = []
    for part in doc["files"]:
        table = pq.read_table(shards / part["path"])
        cols = [table.column(n).to_pylist() for n in doc["columns"]]
        rows.extend(zip(*cols, strict=True))
    job, ordinal = doc["columns"].index("job"), doc["columns"].index("ordinal")
    rows.sort(key=lambda r: (r[job], r[ordinal], json.dumps(r, default=str)))
    digest = hashlib.sha256()
    for r in rows:
        digest.update(json.dumps(r, default=str).encode() + b"\n")
    facts = {k: doc.get(k) for k in ("base_ns", "runs", "steps", "processes", "threads", "rows", "columns")}
    facts["trace"] = {"header": doc["trace"]["header"], "events": doc["trace"]["events"]}
    return {
        "rows": len(rows),
        "rows_sha256": digest.hexdigest(),
        "doc_sha256": hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest(),
    }


# ------------------------------------------------------------------------------------------ running
def cli(*args: str) -> int:
    """``rl-trace ARGS`` in this process (its output swallowed; the exit code returned)."""
    from rl_trace_observer.cli.main import main

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return main(list(args))


def merge_set(name: str, inputs: list[str], out: Path, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every output format of one input set, shards with the .json.gz and the .pftrace.gz merges."""
    got: dict[str, Any] = {}
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    for fmt in FORMATS:
        target = folder / f"merged.{fmt}"
        shards = ["--shards", str(folder / f"shards-{fmt}")] if fmt.endswith(".gz") else []
        code = cli("merge", *inputs, "-o", str(target), *shards, *extra)
        entry: dict[str, Any] = {"exit": code}
        if target.exists():
            entry["sha256"] = sha(target)
        manifest = Path(f"{target}.manifest.json")
        if manifest.exists():
            entry["manifest_sha256"] = doc_sha(manifest, out)
        if shards and (folder / f"shards-{fmt}" / "rl-trace-shards.json").exists():
            entry["shards"] = rows_sha(folder / f"shards-{fmt}")
        got[fmt] = entry
    return got


def views(name: str, out: Path) -> dict[str, Any]:
    """Outputs written from span shards: one step, a role, and a Perfetto archive."""
    shards = out / name / "shards-json.gz"
    got: dict[str, Any] = {}
    for label, args in (
        ("step1.pftrace.gz", ("--step", "1")),
        ("step1.json.gz", ("--step", "1")),
        ("actor.pftrace", ("--role", "actor")),
        ("archive.tar", ()),
    ):
        target = out / name / f"view-{label}"
        code = cli("merge", str(shards), "-o", str(target), *args)
        got[label] = {"exit": code, **({"sha256": sha(target)} if target.exists() else {})}
    return got


def reports(name: str, out: Path) -> dict[str, Any]:
    """The report from the .json.gz and from the shards, the critical path drawn in, SQL and a diff."""
    folder = out / name
    got: dict[str, Any] = {}
    for label, source in (("json", folder / "merged.json.gz"), ("shards", folder / "shards-json.gz")):
        summary = folder / f"report-{label}.json"
        path = folder / f"path-{label}.json.gz"
        code = cli("report", str(source), "--json", str(summary), "--critical-path", str(path), "-q")
        got[f"report-{label}"] = {
            "exit": code,
            **({"summary_sha256": doc_sha(summary, out)} if summary.exists() else {}),
            **({"critical_path_sha256": _gunzip_sha(path)} if path.exists() else {}),
        }
    query = (
        "SELECT step, role, stage, count(*) AS n, sum(dur_ns) AS ns "
        "FROM stage_spans GROUP BY ALL ORDER BY ALL"
    )
    csv = folder / "sql.csv"
    code = cli("sql", str(folder / "shards-json.gz"), query, "--csv", "-o", str(csv))
    got["sql"] = {"exit": code, **({"sha256": sha(csv)} if csv.exists() else {})}
    diff = folder / "diff.json"
    code = cli("diff", str(folder / "merged.json.gz"), str(folder / "shards-json.gz"), "--json", str(diff))
    got["diff"] = {"exit": code, **({"sha256": doc_sha(diff, out)} if diff.exists() else {})}
    return got


def _gunzip_sha(path: Path) -> str:
    return hashlib.sha256(gzip.decompress(path.read_bytes())).hexdigest()


@contextlib.contextmanager
def ray_cluster(names: tuple[str, ...]) -> Iterator[str]:
    """A local Ray cluster of named nodes (a custom resource each), as tests/ray_cluster.py makes."""
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray_tmp = tempfile.mkdtemp(prefix="rid", dir="/tmp")
    os.environ["RAY_TMPDIR"] = ray_tmp
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "resources": {names[0]: 1}, "include_dashboard": False},
    )
    try:
        for name in names[1:]:
            cluster.add_node(num_cpus=1, resources={name: 1}, include_dashboard=False)
        cluster.wait_for_nodes()
        yield str(cluster.address)
    finally:
        cluster.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)


def ray_merges(inputs: Path, out: Path) -> dict[str, Any]:
    """``rl-trace merge --ray`` of the cluster corpus, every format, shards with the gzip ones."""
    folder = out / "ray-cluster"
    folder.mkdir(parents=True, exist_ok=True)
    names = ("node_a", "node_b", "node_c")
    node_dirs = [f"--node-dir={n}={inputs / 'corpus-cluster' / n[-1]}" for n in names]
    got: dict[str, Any] = {}
    with ray_cluster(names) as address:
        for fmt in FORMATS:
            target = folder / f"merged.{fmt}"
            shards = ["--shards", str(folder / f"shards-{fmt}")] if fmt.endswith(".gz") else []
            code = cli("merge", "--ray", "--address", address, *node_dirs, "-o", str(target), *shards)
            entry: dict[str, Any] = {"exit": code}
            if target.exists():
                entry["sha256"] = sha(target)
            if shards and (folder / f"shards-{fmt}" / "rl-trace-shards.json").exists():
                entry["shards"] = rows_sha(folder / f"shards-{fmt}")
            got[fmt] = entry
    return got


def outputs(inputs: Path, out: Path, real: Path | None, with_ray: bool) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results: dict[str, Any] = {}
    sets: list[tuple[str, list[str], tuple[str, ...]]] = [
        ("corpus-real", [str(inputs / "corpus-real")], ()),
        ("corpus-real-passes", [str(inputs / "corpus-real")], ("--min-duration-us", "0.5")),
        ("corpus-cluster", [str(inputs / "corpus-cluster")], ()),
        ("corpus-cluster-step2", [str(inputs / "corpus-cluster")], ("--step", "2")),
        ("corpus-cluster-wall", [str(inputs / "corpus-cluster")], ("--clock", "wall")),
        ("gen-run", [str(inputs / "gen-run")], ()),
        ("gen-run-passes", [str(inputs / "gen-run")], ("--min-duration-us", "2", "--step", "1-2")),
        ("gen-run-inline", [str(inputs / "gen-run")], ("--workers", "0")),
    ]
    if real is not None:
        sets += [(f"real-{d.name}", [str(d)], ()) for d in sorted(real.iterdir()) if d.is_dir()]
    for name, paths, extra in sets:
        results[name] = merge_set(name, paths, out, extra)
        print(f"{name}: {time.monotonic() - started:.0f} s", file=sys.stderr)
    for name in ("corpus-real", "corpus-cluster", "gen-run"):
        results[f"{name}/views"] = views(name, out)
        results[f"{name}/reports"] = reports(name, out)
    if with_ray:
        results["ray-cluster"] = ray_merges(inputs, out)
    print(f"all: {time.monotonic() - started:.0f} s", file=sys.stderr)
    return results


# ------------------------------------------------------------------------------------------ compare
def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}/{k}" if prefix else k))
        return out
    return {prefix: value}


def compare(a: Path, b: Path) -> int:
    before, after = _flat(json.loads(a.read_text())), _flat(json.loads(b.read_text()))
    differ = 0
    for key in sorted(set(before) | set(after)):
        if key.startswith("_"):  # where the code came from
            continue
        x, y = before.get(key), after.get(key)
        same = x == y
        differ += not same
        if not same or key.endswith(("sha256", "rows")):
            mark = "equal" if same else "DIFFERS"
            shown = str(x)[:16] if same else f"{str(x)[:16]} -> {str(y)[:16]}"
            print(f"{mark:8} {key}: {shown}")
    print(f"{len(set(before) | set(after))} entries, {differ} differ")
    return 1 if differ else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("inputs")
    p.add_argument("dir", type=Path)
    p = sub.add_parser("outputs")
    p.add_argument("dir", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--real-traces", type=Path, default=REAL_TRACES if REAL_TRACES.is_dir() else None)
    p.add_argument("--no-ray", action="store_true")
    p = sub.add_parser("compare")
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    args = ap.parse_args()
    if args.cmd == "inputs":
        build_inputs(args.dir)
        return 0
    if args.cmd == "compare":
        return compare(args.a, args.b)
    import rl_trace_observer

    results = outputs(args.dir, args.out, args.real_traces, not args.no_ray)
    results["_code"] = {"package": str(Path(rl_trace_observer.__file__).parent)}
    args.json.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
