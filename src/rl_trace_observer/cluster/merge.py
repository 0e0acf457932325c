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
from types import TracebackType
from typing import Any

from ..integrations.ray.collect import SurveyedNode, connect, on_each_node, survey
from ..integrations.ray.collect_copy import one_line
from ..integrations.ray.collect_dest import safe_name
from ..integrations.ray.collect_expect import AmbiguousRun, dead_node_reports
from ..merge.files.sources import Source
from ..merge.job.spec import Job
from ..merge.job.stitch import RunState, Stitcher
from ..merge.options import MergeOptions, MergeResult, UsageError
from ..merge.pipeline.orchestrate import Inventory, Located, run_merge
from ..merge.plan.build import Prepared
from ..merge.timeline.model import Problem, Rebase
from . import node as node_side
from .assemble import linked_piece
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
                f"inventory failed: {one_line(answer or RuntimeError('no answer'))}",
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


def ray_merge(
    output: str, options: MergeOptions | None = None, cluster: ClusterOptions | None = None
) -> MergeResult:
    """Merge every node's output directory of the running Ray cluster into ``output`` (``{run_id}``
    in it becomes the run's id, known once the nodes are surveyed).

    Raises :class:`UsageError` for bad arguments (several runs and no ``options.run``, no Ray);
    node failures are in the manifest (``cluster.nodes``, problems of kind ``node``)."""
    return run_merge(RayNodes(cluster or ClusterOptions()), output, options or MergeOptions())


class RayNodes:
    """The merge's executor on a Ray cluster: each node's files found, planned from and converted on
    that node (the steps are in this package's docstring); the driver stitches what comes back."""

    def __init__(self, copts: ClusterOptions) -> None:
        self.copts = copts
        self.started = time.monotonic()
        self.ray: Any = None
        self.joined = False
        self.sv: Any = None
        self.runs: dict[str, NodeRun] = {}
        self.facts = _Plan([], {}, {}, {}, {})
        self.opts = MergeOptions()
        self.out = Path()
        self.keyed: list[tuple[Job, str]] = []
        self.results: dict[str, JobDone] = {}
        self.missing: list[Job] = []

    def __enter__(self) -> RayNodes:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.joined:
            self.ray.shutdown()

    def locate(self, output: str, opts: MergeOptions) -> Located:
        try:
            import ray
        except ImportError:
            raise UsageError("--ray needs Ray: pip install 'rl-trace-observer[ray]'") from None
        self.ray, copts = ray, self.copts
        self.joined = connect(ray, copts.address)
        overrides = {k: str(v) for k, v in copts.node_output_dirs.items()}
        try:
            sv = survey(ray, _default_dir(copts), overrides, opts.run, lambda _run: [], copts.list_timeout_s)
        except AmbiguousRun as exc:
            raise UsageError(str(exc)) from None
        self.sv = sv
        self.out = Path(output.replace("{run_id}", sv.run_id))
        if opts.shards:
            opts = replace(opts, shards=opts.shards.replace("{run_id}", sv.run_id))
        self.opts = opts
        self.runs = {
            n.report.node_id: NodeRun(n.report.label, n.report.node_id, n.report.hostname) for n in sv.leaders
        }
        inputs = [f"ray:{n.report.label}:{n.report.output_dir}" for n in sv.leaders]
        for n in sv.leaders:
            if n.report.status in ("lost", "unreachable"):
                run = self.runs[n.report.node_id]
                run.status, run.error = n.report.status, "; ".join(n.report.notes)
        return Located(self.out, opts, inputs, _options_dict(opts, copts), _survey_problems(sv))

    def inventory(self) -> Inventory:
        self.facts = _inventory(self.ray, self.sv.leaders, self.runs, self.copts.list_timeout_s)
        return Inventory(self.facts.sources, self.facts.prepared)

    def estimate(self, src: Source) -> int:
        return self.facts.estimates.get(src.url, src.size)

    def run(self, jobs: list[Job], stitch: Stitcher, problems: list[Problem]) -> RunState:
        """Run what the store lacks on the nodes; re-base when an event lies below the base; stitch
        the stored pieces in plan order (hard-linked out of the store: it keeps them for a re-run
        until the merge is complete)."""
        shards = Path(self.opts.shards) if self.opts.shards else None
        store = Store(self.out, shards)
        _skip_lines(jobs, self.opts)
        keyed = self.keyed = [(job, job_key(job, self.facts.where, shards is not None)) for job in jobs]
        results = self.results = _run_nodes(
            self.ray, keyed, self.facts, self.runs, store, self.copts, problems
        )
        failed = [d for d in results.values() if d.error]
        if failed:
            raise RuntimeError("; ".join(_job_error(d, keyed) for d in failed[:3]))
        low = _lowest(results, stitch.base)
        if low is not None:
            raise Rebase(low)
        done = [(key, results[key]) for _, key in keyed if key in results and results[key].result is not None]
        self.missing = [job for job, key in keyed if key not in results or results[key].result is None]
        with stitch.output() as add:
            for key, d in done:
                assert d.result is not None
                add(d.result, [linked_piece(store, key, d)] if d.piece_size else [])
        return stitch.state

    def report(self, manifest: dict[str, Any], problems: list[Problem], failed: bool) -> None:
        if not failed:
            problems.extend(_node_problems(self.missing, self.runs, self.facts.where))
        jobs, missing = (0, 0) if failed else (len(self.keyed), len(self.missing))
        run_id = self.sv.run_id if self.sv is not None else ""
        manifest["cluster"] = _cluster_section(run_id, self.runs, self.started, jobs, missing)

    def finished(self, manifest: dict[str, Any], written: bool) -> None:
        if written and self.opts.shards:
            manifest["shards"]["complete"] = not self.missing
        if written and not self.missing:
            Store(self.out, Path(self.opts.shards) if self.opts.shards else None).clear()


def _skip_lines(jobs: list[Job], opts: MergeOptions) -> None:
    """``MergeOptions.skip_lines`` on a cluster: keyed by a source's path as the plan names it
    (``/<node label>/<path in its output directory>``); the byte runs are the node's file's, which the
    node's job leaves unread. Only a merge cut to a window skips (as the local one: ``build_jobs``),
    and skipping never changes the bytes, so the job keys stay what they were."""
    if not opts.skip_lines:
        return
    for job in jobs:
        if job.windows:
            for task in job.tasks:
                task.skip_lines = opts.skip_lines.get(task.source.path, ())


def _default_dir(copts: ClusterOptions) -> str | None:
    if copts.output_dir:
        return str(copts.output_dir)
    from .. import config as config_mod

    cfg_dir = config_mod.load().output_dir
    return str(cfg_dir) if cfg_dir else None


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
    problems: list[Problem],
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
        problems.extend(Problem("clock", job.tasks[0].source.url, n) for n in notes)
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
                one_line=one_line,
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
