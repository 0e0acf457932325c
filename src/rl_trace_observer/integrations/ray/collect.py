"""``collect()``: every artifact of every Ray node into ``DEST/<run_id>/<node>/``, losing nothing.

``RL_TRACE_OUTPUT_DIR`` is usually a node-local disk the driver cannot see, so the bytes travel over
Ray itself. Each round is one task per alive node, pinned with hard node affinity and ``num_cpus=0``
(a cluster whose CPUs are all held by training actors still runs it):

1. probe: write a marker named with a random token into the node's output directory;
2. list: list the files (path rules in ``collect_node``), read the process records, report which
   markers are visible. Nodes that see each other's markers share one directory (NFS, Lustre): it is
   copied once and the other nodes' listings are compared with it instead of copying again;
3. unprobe: remove the markers;
4. copy: per node one streaming generator task, at most ``max_nodes`` nodes at a time
   (``collect_copy``); a node that dies is reported and the others complete.

The files land under ``DEST/<run_id>/<node label>/`` with their relative paths, so
``rl-trace merge DEST/<run_id>`` reads them directly. The node label is the host name, plus a short
hash of the output directory when it was overridden per node, or ``shared-<hash>`` for a shared one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from ... import config as config_mod
from . import collect_node
from .collect_copy import CopyJob, FileHook, copy_node
from .collect_dest import REPORT_NAME, Destination, safe_name
from .collect_expect import dead_node_reports, node_missing, other_run_files, resolve_run_id, run_coverage
from .collect_report import CollectProgress, CollectReport, NodeReport, Stopwatch

__all__ = [
    "CollectReport",
    "NodeReport",
    "Survey",
    "SurveyedNode",
    "collect",
    "collect_if_configured",
    "survey",
]

log = logging.getLogger("rl_trace_observer")
MiB = 1024 * 1024


@dataclass(eq=False)
class SurveyedNode:
    """One Ray node as the survey found it (see :func:`survey`)."""

    report: NodeReport
    hostname: str
    output_dir: str | None  # what the tasks get; None: the node's own RL_TRACE_OUTPUT_DIR
    overridden: bool
    listing: dict[str, Any] | None = None
    leader: SurveyedNode | None = None
    members: list[SurveyedNode] = field(default_factory=list)
    files: list[list[Any]] = field(default_factory=list)


def _hash8(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def connect(ray: Any, address: str | None) -> bool:
    """Join the cluster unless this process already is a Ray driver or worker; True if we joined."""
    if ray.is_initialized():
        return False
    ray.init(address=address or "auto", log_to_driver=False, logging_level=logging.WARNING)
    return True


def _discover(
    ray: Any, default_dir: str | None, overrides: Mapping[str, str]
) -> tuple[list[SurveyedNode], list[dict[str, Any]]]:
    """Every node Ray knows, with the output directory its tasks will read (override keys: node id,
    a custom resource name of the node, or its IP)."""
    nodes, dead = [], []
    for info in ray.nodes():
        if not info.get("Alive"):
            dead.append(info)
            continue
        node_id, address = info["NodeID"], info.get("NodeManagerAddress", "?")
        keys = [node_id, *(info.get("Resources") or {}), address]
        chosen = next((str(overrides[k]) for k in keys if k in overrides), None)
        rep = NodeReport(node_id=node_id, address=address)
        host = str(info.get("NodeManagerHostname") or address)
        nodes.append(SurveyedNode(rep, host, chosen or default_dir, chosen is not None))
    return nodes, dead


def on_each_node(
    ray: Any,
    fn: Callable[..., Any],
    nodes: list[SurveyedNode],
    args: Callable[[SurveyedNode], tuple[Any, ...]],
    timeout_s: float,
) -> dict[str, Any]:
    """Run ``fn`` once on each node (pinned); node id -> result, or the exception it ended with."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not nodes:
        return {}
    remote = ray.remote(num_cpus=0, max_retries=0)(fn)
    refs = {
        n.report.node_id: remote.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n.report.node_id, soft=False)
        ).remote(*args(n))
        for n in nodes
    }
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    ready_set = set(ready)
    out: dict[str, Any] = {}
    for node_id, ref in refs.items():
        if ref not in ready_set:
            out[node_id] = TimeoutError(f"no answer within {timeout_s:g} s")
            try:
                ray.cancel(ref, force=True)
            except Exception:
                pass
            continue
        try:
            out[node_id] = ray.get(ref)
        except Exception as exc:
            out[node_id] = exc
    return out


def _probe_and_list(ray: Any, nodes: list[SurveyedNode], token: str, timeout_s: float) -> None:
    key = {n.report.node_id: n.report.node_id[:16] for n in nodes}
    probes = on_each_node(
        ray,
        collect_node.write_probe,
        nodes,
        lambda n: (n.output_dir, token, key[n.report.node_id]),
        timeout_s,
    )
    listings = on_each_node(
        ray, collect_node.list_output_dir, nodes, lambda n: (n.output_dir, token), timeout_s
    )
    on_each_node(
        ray,
        collect_node.remove_probe,
        nodes,
        lambda n: (n.output_dir, token, key[n.report.node_id]),
        30.0,
    )
    for n in nodes:
        got, probe = listings[n.report.node_id], probes[n.report.node_id]
        if isinstance(got, BaseException):
            lost = isinstance(got, ray.exceptions.RayError) and not isinstance(
                got, ray.exceptions.RayTaskError
            )
            n.report.status = "lost" if lost else "unreachable"
            last = (str(got).strip().splitlines() or [""])[-1]
            n.report.notes.append(f"listing failed: {type(got).__name__}: {last}")
            continue
        n.listing = got
        n.report.hostname, n.report.output_dir = got["host"], got["root"] or got["output_dir"]
        if got.get("error"):
            n.report.status = "empty"
            n.report.notes.append(got["error"])
        elif not got["exists"]:
            n.report.status = "empty"
            n.report.notes.append(f"output directory {got['root']} does not exist on this node")
        elif isinstance(probe, str):
            n.report.notes.append(probe + " (shared-filesystem detection skipped)")


def _group_shared(nodes: list[SurveyedNode], driver_node: str) -> None:
    """Union nodes that see each other's probe; the leader (driver's node first) copies for all."""
    answered = [n for n in nodes if n.listing and n.listing["exists"]]
    by_key = {n.report.node_id[:16]: n for n in answered}
    parent = {n.report.node_id: n.report.node_id for n in answered}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for n in answered:
        for seen in n.listing["probes"] if n.listing else ():
            other = by_key.get(seen)
            if other is not None:
                parent[find(other.report.node_id)] = find(n.report.node_id)
    groups: dict[str, list[SurveyedNode]] = {}
    for n in answered:
        groups.setdefault(find(n.report.node_id), []).append(n)
    for members in groups.values():
        members.sort(key=lambda m: (m.report.node_id != driver_node, m.report.node_id))
        for m in members:
            m.leader = members[0]
        members[0].members = members


def _assign_labels(nodes: list[SurveyedNode], existing: list[str]) -> None:
    for n in nodes:
        host = safe_name(n.report.hostname or n.hostname)
        n.report.label = f"{host}-{_hash8(n.output_dir or '')}" if n.overridden else host
    leaders = [n for n in nodes if n.leader is n]
    for n in leaders:
        shared = f"shared-{_hash8(n.report.output_dir or '')}"
        if len(n.members) > 1 or shared in existing:
            n.report.label = shared
    seen: dict[str, list[SurveyedNode]] = {}
    for n in leaders:
        seen.setdefault(n.report.label, []).append(n)
    for same in (group for group in seen.values() if len(group) > 1):
        for n in same:  # distinct disks behind one name: keep them apart rather than overwrite
            n.report.label += f"-{n.report.node_id[:8]}"
            n.report.notes.append(
                "label made unique with the node id (same host and directory as another node)"
            )


def _plan_node(n: SurveyedNode, run_id: str) -> None:
    """Which files a leader copies, and what its records say is missing or not ours."""
    assert n.listing is not None
    rep, listing = n.report, n.listing
    excluded, runs = other_run_files(listing, run_id)
    n.files = [f for f in listing["files"] if f[0] not in excluded]
    rep.files_found, rep.bytes_found = len(n.files), sum(f[1] for f in n.files)
    rep.refused += [(r[0], r[1]) for r in listing["refused"]]
    rep.missing += node_missing(listing, run_id)
    if excluded:
        rep.other_run = sorted(runs)
        rep.notes.append(f"{len(excluded)} file(s) of other run(s) {', '.join(sorted(runs))} left out")
    rep.notes += [f"{rel}: {why}" for rel, why in listing["records"].items() if isinstance(why, str)]
    if listing["skipped"]:
        rep.notes.append(f"{len(listing['skipped'])} temporary file(s) of atomic writes in progress skipped")


def _plan_follower(n: SurveyedNode) -> None:
    assert n.listing is not None and n.leader is not None and n.leader.listing is not None
    mine = {tuple(f) for f in n.listing["files"]}
    theirs = {tuple(f) for f in n.leader.listing["files"]}
    rep = n.report
    rep.status, rep.shared_with = "shared", n.leader.report.label
    rep.files_found, rep.files_verified = len(mine), len(mine & theirs)
    if mine != theirs:
        rep.notes.append(
            f"sees the shared directory differently from {n.leader.report.label}: {len(mine ^ theirs)} "
            "file(s) differ in name, size or mtime (attribute caching?); re-run to re-check"
        )


def _previous(dest: Destination, run_id: str) -> dict[str, str]:
    try:
        with dest.fs.open(f"{dest.run_dir(run_id)}/{REPORT_NAME}", "rb") as fh:
            data = json.loads(fh.read())
        return {n["node_id"]: n["status"] for n in data.get("nodes", [])}
    except Exception:
        return {}


def _check(chunk_size: int, in_flight: int, max_nodes: int, retries: int) -> None:
    if chunk_size < 4096 or in_flight < 1 or max_nodes < 1 or retries < 0:
        raise ValueError(
            f"collect: chunk_size >= 4096, in_flight >= 1, max_nodes >= 1 and retries >= 0 are required "
            f"(got {chunk_size}, {in_flight}, {max_nodes}, {retries})"
        )


@dataclass
class _Options:
    """Everything ``collect()`` was asked, resolved once."""

    run_id: str | None
    default_dir: str | None
    overrides: dict[str, str]
    max_nodes: int
    list_timeout_s: float
    profiled_steps: Sequence[int] | None
    job: dict[str, Any]  # CopyJob tuning: chunk_size, in_flight, retries, stall_timeout_s, on_file_begin


def collect(
    dest: str | os.PathLike[str],
    *,
    address: str | None = None,
    run_id: str | None = None,
    output_dir: str | os.PathLike[str] | None = None,
    node_output_dirs: Mapping[str, str | os.PathLike[str]] | None = None,
    max_nodes: int = 4,
    chunk_size: int = 8 * MiB,
    in_flight: int = 4,
    retries: int = 3,
    stall_timeout_s: float = 600.0,
    list_timeout_s: float = 300.0,
    profiled_steps: Sequence[int] | None = None,
    progress: bool | None = None,
    console: Console | None = None,
    on_file_begin: FileHook | None = None,
) -> CollectReport:
    """Collect every node's output directory into ``DEST/<run_id>/<node>/`` and say what is missing.

    ``dest``: a directory or fsspec URL. ``address``: Ray address when this process is not yet a
    Ray driver (default ``auto``). ``output_dir``: the directory to read on every node (default: this
    process's ``RL_TRACE_OUTPUT_DIR``, else each node's own). ``node_output_dirs``: per-node overrides
    keyed by node id, a custom resource name of the node, or its IP. ``on_file_begin(label, rel,
    attempt)`` is called in the driver as each file starts arriving (progress hooks, tests).
    Raises only for usage errors (bad arguments, several runs and no ``run_id``, no Ray cluster);
    node and file failures are in the returned report.
    """
    _check(chunk_size, in_flight, max_nodes, retries)
    default = str(output_dir) if output_dir else None
    if default is None:
        cfg_dir = config_mod.load().output_dir
        default = str(cfg_dir) if cfg_dir else None
    opts = _Options(
        run_id=run_id,
        default_dir=default,
        overrides={k: str(v) for k, v in (node_output_dirs or {}).items()},
        max_nodes=max_nodes,
        list_timeout_s=list_timeout_s,
        profiled_steps=profiled_steps,
        job=dict(
            chunk_size=chunk_size,
            in_flight=in_flight,
            retries=retries,
            stall_timeout_s=stall_timeout_s,
            on_file_begin=on_file_begin,
        ),
    )
    console = console or Console(stderr=True)
    bar = CollectProgress(console.is_terminal if progress is None else progress, console)
    destination = Destination(str(dest))
    import ray

    joined = connect(ray, address)
    try:
        return _collect(ray, destination, opts, bar)
    finally:
        if joined:
            ray.shutdown()


def _copy_all(ray: Any, dest: Destination, jobs: list[CopyJob], bar: CollectProgress, max_nodes: int) -> None:
    with bar:
        bar.plan(files=0, total_bytes=0, nodes=len(jobs))
        stream = ray.remote(num_cpus=0, max_retries=0, num_returns="streaming")(collect_node.stream_files)
        with ThreadPoolExecutor(max_workers=max_nodes, thread_name_prefix="rl-trace-collect") as pool:
            for fut in [pool.submit(copy_node, j, dest, bar, ray, stream) for j in jobs]:
                fut.result()


@dataclass
class Survey:
    """Every node, what its output directory holds, who copies what: what collect and the Ray merge
    (``rl_trace_observer.cluster``) both start from, so both label nodes the same way."""

    nodes: list[SurveyedNode]
    dead: list[dict[str, Any]]
    run_id: str
    run_source: str

    @property
    def leaders(self) -> list[SurveyedNode]:
        """One node per distinct directory (a shared filesystem is read once)."""
        return [n for n in self.nodes if n.leader is n]


def survey(
    ray: Any,
    default_dir: str | None,
    overrides: Mapping[str, str],
    run_id: str | None,
    existing_labels: Callable[[str], list[str]],
    list_timeout_s: float,
) -> Survey:
    """Discover, probe and list every node, group shared directories, resolve the run, label nodes
    and decide each leader's files. Raises ``AmbiguousRun`` when several runs and no ``run_id``."""
    nodes, dead = _discover(ray, default_dir, overrides)
    _probe_and_list(ray, nodes, secrets.token_hex(6), list_timeout_s)
    _group_shared(nodes, ray.get_runtime_context().get_node_id())
    leaders = [n for n in nodes if n.leader is n]
    run, source = resolve_run_id(run_id, [n.listing for n in leaders if n.listing])
    _assign_labels(nodes, existing_labels(run))
    for n in nodes:
        if n.leader is n:
            _plan_node(n, run)
        elif n.leader is not None:
            _plan_follower(n)
    return Survey(nodes, dead, run, source)


def _collect(ray: Any, dest: Destination, opts: _Options, bar: CollectProgress) -> CollectReport:
    watch = Stopwatch()
    found = survey(ray, opts.default_dir, opts.overrides, opts.run_id, dest.labels, opts.list_timeout_s)
    nodes, dead, run, source = found.nodes, found.dead, found.run_id, found.run_source
    leaders = found.leaders
    report = CollectReport(dest=dest.url, run_id=run, run_dir=dest.display_run_dir(run))
    report.notes.append(f"run id {run} ({source})")
    report.coverage = run_coverage([n.listing for n in leaders if n.listing], run, opts.profiled_steps)
    if nodes and not any(n.files for n in leaders):
        dirs = sorted({str(n.report.output_dir) for n in nodes})
        report.coverage.append(
            f"no node holds any file under {', '.join(dirs)}: is the output directory right?"
        )
    jobs = [
        CopyJob(n.report, n.report.node_id, str(n.report.output_dir), n.files, run, **opts.job)
        for n in leaders
        if n.files
    ]
    _copy_all(ray, dest, jobs, bar, opts.max_nodes)
    alive = {(safe_name(n.hostname), n.report.address): n.report.label for n in nodes}  # Ray's names
    report.nodes = [n.report for n in nodes] + dead_node_reports(dead, alive, _previous(dest, run))
    report.seconds = watch.seconds()
    body = json.dumps(report.to_dict(), indent=1, default=str).encode()
    dest.write_bytes(f"{dest.run_dir(run)}/{REPORT_NAME}", body)
    return report


def collect_if_configured(*, run_id: str | None = None, **kwargs: Any) -> CollectReport | None:
    """For the end of training: collect to ``RL_TRACE_COLLECT_TO`` when it is set, else do nothing.

    Never raises (training has finished; a failed collection must not turn it into a failed run):
    problems are logged as warnings and ``None`` is returned. The run id defaults to
    ``RL_TRACE_RUN_ID``, else this process's recorder's run id, else whatever the records say.
    """
    cfg = config_mod.load()
    if not cfg.collect_to:
        return None
    if run_id is None:
        from ...capture import recorder as recorder_mod

        rec = getattr(recorder_mod, "_RECORDER", None)  # peek only: never create a recorder here
        run_id = cfg.run_id or (rec.record().get("run_id") if rec is not None else None)
    try:
        report = collect(cfg.collect_to, run_id=run_id, progress=False, **kwargs)
    except Exception as exc:
        log.warning("[rl-trace-observer] collecting artifacts to %s failed: %s", cfg.collect_to, exc)
        return None
    if report.ok:
        log.info(
            "[rl-trace-observer] collected %d MB to %s", report.bytes_copied // 1_000_000, report.run_dir
        )
    else:
        problems = report.problems()
        log.warning(
            "[rl-trace-observer] collection to %s finished with %d problem(s): %s",
            report.run_dir,
            len(problems),
            "; ".join(problems[:20]),
        )
    return report
