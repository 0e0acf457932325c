"""``ray_merge(output, options, cluster)``: the merge of a live Ray cluster's node-local outputs,
converted on the nodes (the steps are in this package's docstring).

The driver plans with exactly the planner a single-machine merge uses, on the facts the nodes sent
(names, heads' verdicts, sizes, records), and stitches the pieces in the same order: the output is
byte-for-byte what ``rl-trace merge`` makes of the same files collected into one directory (tested:
same sha256 for ``.json.gz``). The manifest says, per node, what it converted, what travelled, and
what failed; a node that died or stalled leaves its jobs missing (named) and a re-run does just those.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..integrations.ray.collect import SurveyedNode, connect, on_each_node, survey
from ..integrations.ray.collect_copy import _one_line
from ..integrations.ray.collect_dest import safe_name
from ..integrations.ray.collect_expect import AmbiguousRun, dead_node_reports
from ..merge.files.sources import Source
from ..merge.manifest.document import manifest_path_for, new_manifest, set_problems, write_manifest
from ..merge.manifest.fill import fill_manifest
from ..merge.options import MergeOptions, MergeResult, UsageError, output_format
from ..merge.pipeline import _MAX_REBASES, _base_hint, _effective_windows, _floor_s
from ..merge.plan.build import Prepared, apply_records_to_artifacts, order_processes, plan_sources
from ..merge.plan.selection import Selection, select
from ..merge.run.execute import build_jobs
from ..merge.run.jobs import Job
from ..merge.timeline.model import Problem
from . import node as node_side
from .assemble import NothingKept, assemble
from .gather import NodeRun, gather
from .keys import Placement, for_node, job_key, node_of
from .node import JobDone, NodeJob, display_url
from .store import Store

__all__ = ["ClusterOptions", "ray_merge"]

log = logging.getLogger("rl_trace_observer")
MiB = 1 << 20


@dataclass
class ClusterOptions:
    """How the cluster is reached and worked (``rl-trace merge --ray`` options)."""

    address: str | None = None  # default: join the running cluster ("auto")
    output_dir: str | None = None  # the directory to read on every node (default: RL_TRACE_OUTPUT_DIR)
    node_output_dirs: Mapping[str, str] = field(default_factory=dict)  # per node: id, resource or IP
    node_workers: int = 1  # worker processes per node task (<= 1: in the task itself, <= ~0.6 GB)
    max_nodes: int = 16  # nodes converting at the same time
    chunk_size: int = 8 * MiB
    in_flight: int = 4  # batches a node may get ahead of the driver
    stall_timeout_s: float = 600.0
    list_timeout_s: float = 300.0
    on_phase: Callable[[str, dict[str, Any]], None] | None = None  # ("planned", {...}) before converting


@dataclass
class _Plan:
    sources: list[Source]
    prepared: dict[str, Prepared]
    estimates: dict[str, int]
    where: dict[str, Placement]
    raw_bytes: dict[str, int]  # node id -> bytes of its files


def _inventory(ray: Any, leaders: list[SurveyedNode], runs: dict[str, NodeRun], timeout_s: float) -> _Plan:
    """Planning facts from every node (one pinned task each); a node that fails is named, not fatal."""
    todo = [n for n in leaders if n.files]
    got = on_each_node(
        ray, node_side.inventory, todo, lambda n: (n.report.output_dir, n.files, n.report.label), timeout_s
    )
    out = _Plan([], {}, {}, {}, {})
    for n in todo:
        node_id, run = n.report.node_id, runs[n.report.node_id]
        answer = got.get(node_id)
        if isinstance(answer, BaseException) or answer is None:
            run.status, run.error = (
                "lost",
                f"inventory failed: {_one_line(answer or RuntimeError('no answer'))}",
            )
            continue
        run.bytes_received += len(pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL))
        root, label = str(n.report.output_dir), n.report.label
        mtimes = {f[0]: int(f[2]) for f in n.files}
        for facts in answer["files"]:
            url = display_url(label, root, facts.rel)
            out.sources.append(
                Source(url, f"/{label}/{facts.rel}", "node", f"{label}/{facts.rel}", facts.size)
            )
            out.prepared[url], out.estimates[url] = facts.prepared, facts.estimate
            out.where[url] = Placement(node_id, label, root, facts.rel, facts.size, mtimes.get(facts.rel, 0))
        out.raw_bytes[node_id] = sum(int(f[1]) for f in n.files)
        run.raw_bytes = out.raw_bytes[node_id]
    out.sources.sort(key=lambda s: s.path)  # the order a collected copy's directory walk gives
    return out


def _check(output: str) -> tuple[str, Path]:
    fmt = output_format(output)
    if "://" in output:
        raise UsageError(f"{output}: the output must be a local path")
    return fmt, Path(output)


def ray_merge(
    output: str, options: MergeOptions | None = None, cluster: ClusterOptions | None = None
) -> MergeResult:
    """Merge every node's output directory of the running Ray cluster into ``output`` (``{run_id}``
    in it becomes the run's id, known once the nodes are surveyed).

    Raises :class:`UsageError` for bad arguments (several runs and no ``options.run``, no Ray);
    node failures are in the manifest (``cluster.nodes``, problems of kind ``node``)."""
    opts, copts = options or MergeOptions(), cluster or ClusterOptions()
    fmt, out = _check(output)
    try:
        import ray
    except ImportError:
        raise UsageError("--ray needs Ray: pip install 'rl-trace-observer[ray]'") from None
    joined = connect(ray, copts.address)
    try:
        return _ray_merge(ray, fmt, out, opts, copts)
    finally:
        if joined:
            ray.shutdown()


def _default_dir(copts: ClusterOptions) -> str | None:
    if copts.output_dir:
        return str(copts.output_dir)
    from .. import config as config_mod

    cfg_dir = config_mod.load().output_dir
    return str(cfg_dir) if cfg_dir else None


def _ray_merge(ray: Any, fmt: str, out: Path, opts: MergeOptions, copts: ClusterOptions) -> MergeResult:
    started = time.monotonic()
    overrides = {k: str(v) for k, v in copts.node_output_dirs.items()}
    try:
        sv = survey(ray, _default_dir(copts), overrides, opts.run, lambda _run: [], copts.list_timeout_s)
    except AmbiguousRun as exc:
        raise UsageError(str(exc)) from None
    out = Path(str(out).replace("{run_id}", sv.run_id))
    if opts.shards:
        opts = replace(opts, shards=opts.shards.replace("{run_id}", sv.run_id))
    manifest_path = Path(opts.manifest) if opts.manifest else manifest_path_for(out)
    leaders = sv.leaders
    runs = {n.report.node_id: NodeRun(n.report.label, n.report.node_id, n.report.hostname) for n in leaders}
    inputs = [f"ray:{n.report.label}:{n.report.output_dir}" for n in leaders]
    manifest = new_manifest(str(out), fmt, inputs, _options_dict(opts, copts))
    problems: list[Problem] = _survey_problems(sv)
    for n in leaders:
        if n.report.status in ("lost", "unreachable"):
            runs[n.report.node_id].status, runs[n.report.node_id].error = (
                n.report.status,
                "; ".join(n.report.notes),
            )
    try:
        facts = _inventory(ray, leaders, runs, copts.list_timeout_s)
        plan = plan_sources(facts.sources, facts.prepared)
        problems.extend(plan.problems)
        plan.problems = problems
        windows = select(plan, Selection(opts.run, opts.steps, opts.roles))
        apply_records_to_artifacts(plan)
        order_processes(plan)
        state, jobs, results = _convert(ray, fmt, out, opts, copts, plan, windows, facts, runs, manifest)
        fill_manifest(manifest, plan, state)
    except Exception as exc:  # the manifest still says what was read and where it broke
        problems.append(Problem("incomplete", str(out), f"merge failed: {type(exc).__name__}: {exc}"))
        manifest["status"] = "failed"
        manifest["cluster"] = _cluster_section(sv.run_id, runs, started)
        set_problems(manifest, problems)
        manifest["elapsed_s"] = round(time.monotonic() - started, 3)
        write_manifest(manifest_path, manifest)
        return MergeResult(str(out), str(manifest_path), manifest, 1, problems)
    missing = [job for job, key in jobs if key not in results or results[key].result is None]
    problems.extend(_node_problems(missing, runs, facts.where))
    manifest["cluster"] = _cluster_section(sv.run_id, runs, started, len(jobs), len(missing))
    set_problems(manifest, problems)
    written = manifest["output"]["written"] and manifest["counts"].get("events_kept", 0) > 0
    manifest["status"] = "failed" if not written else ("partial" if manifest["problems"] else "ok")
    if written and opts.shards:
        from ..merge.manifest.shard_document import finish

        finish(opts.shards, plan, state, manifest, state.shard_parts, state.header)
        manifest["shards"]["complete"] = not missing
    manifest["elapsed_s"] = round(time.monotonic() - started, 3)
    write_manifest(manifest_path, manifest)
    if written and not missing:
        Store(out, Path(opts.shards) if opts.shards else None).clear()
    code = 0 if written and not (opts.strict and manifest["problems"]) else 1
    return MergeResult(str(out), str(manifest_path), manifest, code, problems)


def _convert(
    ray: Any,
    fmt: str,
    out: Path,
    opts: MergeOptions,
    copts: ClusterOptions,
    plan: Any,
    windows: Any,
    facts: _Plan,
    runs: dict[str, NodeRun],
    manifest: dict[str, Any],
) -> tuple[Any, list[tuple[Job, str]], dict[str, JobDone]]:
    """Plan the jobs, run what the store lacks on the nodes, stitch; re-plan the base if needed."""
    from ..merge.pipeline.clock import clock_plan

    clock = clock_plan(plan, opts.clock_mode, opts.clock_tolerance_us)
    plan.problems.extend(clock.problems)
    manifest["timeline"]["clock"] = clock.section
    shards = Path(opts.shards) if opts.shards else None
    store = Store(out, shards)
    base = _base_hint(plan)
    replans: list[dict[str, int]] = []
    for _ in range(_MAX_REBASES + 1):
        eff = _effective_windows(windows, opts.time_window, base)
        jobs = build_jobs(
            plan, clock, fmt, base, eff, opts, estimate=lambda s: facts.estimates.get(s.url, s.size)
        )
        keyed = [(job, job_key(job, facts.where, shards is not None)) for job in jobs]
        results = _run_nodes(ray, keyed, facts, runs, store, copts, plan)
        failed = [d for d in results.values() if d.error]
        if failed:
            raise RuntimeError("; ".join(_job_error(d, keyed) for d in failed[:3]))
        low = _lowest(results, base)
        if low is not None:
            replans.append({"planned_base_ns": base, "earliest_event_ns": low})
            base = _floor_s(low)
            continue
        if replans:
            manifest["timeline"]["base_replanned"] = replans
        try:
            done = assemble(out, fmt, plan, clock, base, keyed, results, store)
            state = done.state
        except NothingKept as nothing:
            state = nothing.state
        plan.problems.extend(clock.check_causality(plan, state.outcomes))
        return state, keyed, results
    raise RuntimeError("could not find a timeline base below every event")


def _lowest(results: dict[str, JobDone], base: int) -> int | None:
    lows = [d.rebase_ns for d in results.values() if d.rebase_ns is not None]
    for d in results.values():
        if d.result is not None:
            lows += [o.min_ts for o in d.result.outcomes if o.min_ts is not None and o.min_ts < base]
    return min(lows) if lows else None


def _job_error(done: JobDone, keyed: list[tuple[Job, str]]) -> str:
    job = next((j for j, k in keyed if k == done.key), None)
    where = job.tasks[0].source.url if job is not None and job.tasks else done.key
    return f"{where}: {done.error}"


def _run_nodes(
    ray: Any,
    keyed: list[tuple[Job, str]],
    facts: _Plan,
    runs: dict[str, NodeRun],
    store: Store,
    copts: ClusterOptions,
    plan: Any,
) -> dict[str, JobDone]:
    results: dict[str, JobDone] = {}
    todo: dict[str, list[NodeJob]] = {}
    for job, key in keyed:
        node_id = node_of(job, facts.where)
        run = runs.get(node_id or "")
        if run is None:
            continue
        run.jobs += 1
        done = store.get(key)
        if done is not None:
            results[key] = done
            run.reused += 1
            continue
        item, notes = for_node(key, job, facts.where)
        plan.problems.extend(Problem("clock", job.tasks[0].source.url, n) for n in notes)
        todo.setdefault(node_id or "", []).append(item)
    if copts.on_phase is not None:
        copts.on_phase(
            "planned", {"jobs": len(keyed), "todo": {runs[k].label: len(v) for k, v in todo.items()}}
        )
    for node_id, run in runs.items():
        if node_id not in todo and run.status == "pending":
            run.status = "ok" if run.jobs else "nothing"
    remote = ray.remote(num_cpus=0, max_retries=0, num_returns="streaming")(node_side.convert)
    per_node: dict[str, dict[str, JobDone]] = {k: {} for k in todo}
    with ThreadPoolExecutor(max_workers=max(1, copts.max_nodes), thread_name_prefix="rl-trace-merge") as pool:
        futures = [
            pool.submit(
                gather,
                ray,
                remote,
                runs[node_id],
                items,
                store,
                per_node[node_id],
                workers=copts.node_workers,
                chunk=copts.chunk_size,
                in_flight=copts.in_flight,
                stall_timeout_s=copts.stall_timeout_s,
                one_line=_one_line,
            )
            for node_id, items in todo.items()
        ]
        for fut in futures:
            fut.result()
    for got in per_node.values():
        results.update(got)
    return results


def _survey_problems(sv: Any) -> list[Problem]:
    alive = {(safe_name(n.hostname), n.report.address): n.report.label for n in sv.nodes}  # as collect
    out = []
    for rep in dead_node_reports(sv.dead, alive, {}):
        if rep.status == "dead":
            out.append(Problem("node", f"node {rep.hostname} ({rep.node_id[:12]})", "; ".join(rep.notes)))
    for n in sv.nodes:
        if n.report.status in ("lost", "unreachable"):
            out.append(
                Problem("node", f"node {n.report.label} ({n.report.node_id[:12]})", "; ".join(n.report.notes))
            )
    return out


def _node_problems(
    missing: list[Job], runs: dict[str, NodeRun], where: Mapping[str, Placement]
) -> list[Problem]:
    """One line per node whose files are not (all) in the output, saying what to do."""
    by_node: dict[str, list[Job]] = {}
    for job in missing:
        url = job.tasks[0].source.url
        by_node.setdefault(where[url].node_id if url in where else "", []).append(job)
    out = []
    for node_id, jobs in by_node.items():
        run = runs.get(node_id)
        files = sum(len(j.tasks) for j in jobs)
        what = (
            f"{run.status}: {run.error}"
            if run is not None and run.error
            else (run.status if run else "unknown node")
        )
        label = f"node {run.label} ({node_id[:12]})" if run is not None else "node ?"
        out.append(
            Problem(
                "node",
                label,
                f"{what}; {files} file(s) not merged; re-run the same command to finish them "
                f"(the {run.converted + run.reused if run else 0} done are kept)",
            )
        )
    return out


def _cluster_section(
    run_id: str, runs: dict[str, NodeRun], started: float, jobs: int = 0, missing: int = 0
) -> dict[str, Any]:
    nodes = [r.to_dict() for r in sorted(runs.values(), key=lambda r: r.label)]
    return {
        "run_id": run_id,
        "jobs": jobs,
        "jobs_missing": missing,
        "jobs_reused": sum(r.reused for r in runs.values()),
        "raw_bytes": sum(r.raw_bytes for r in runs.values()),
        "bytes_to_driver": sum(r.bytes_received for r in runs.values()),
        "bytes_pieces": sum(r.bytes_pieces for r in runs.values()),
        "bytes_shards": sum(r.bytes_shards for r in runs.values()),
        "nodes": nodes,
        "seconds": round(time.monotonic() - started, 3),
    }


def _options_dict(opts: MergeOptions, copts: ClusterOptions) -> dict[str, Any]:
    d = asdict(opts)
    d.pop("progress", None)
    c = {k: v for k, v in asdict(copts).items() if k != "on_phase"}
    c["node_output_dirs"] = dict(copts.node_output_dirs)
    d["ray"] = c
    return d
