"""Folding what the workers reported into the manifest (counts, artifacts, processes, sessions)."""

from __future__ import annotations

from typing import Any

from ..formats import format_of, manifest_counts
from ..formats.base import MANIFEST_ENTRY
from ..job.spec import SLICE_PHASES
from ..job.stitch import RunState
from ..plan.plan import Plan
from ..timeline.identity import process_title
from ..timeline.model import ArtifactInfo
from ..transform.flowbind import UNBOUND
from ..transform.outliers import OUTLIERS
from ..transform.passes import OVERLAP_DROPPED, OVERLAP_MOVED, OVERLAP_TRACKS
from .ui import ui_section


def fill_manifest(manifest: dict[str, Any], plan: Plan, state: RunState) -> None:
    totals = {"events_read": 0, "events_kept": 0, "events_dropped": 0, "events_filtered": 0}
    phases: dict[str, int] = {}
    flows = 0
    own: dict[str, int] = {key: 0 for key, _ in manifest_counts()}  # the formats' own counts
    pair_records: list[dict[str, Any]] = []
    lo: int | None = None
    hi: int | None = None
    for i, art in enumerate(plan.artifacts):
        out = state.outcomes.get(i)
        if out is None:
            continue
        info = art.info
        info.sha256, info.complete = out.sha256, out.complete and info.complete
        info.events_read, info.events_kept, info.events_dropped = out.read, out.kept, out.dropped
        info.anchor_ns = out.anchor_ns if out.anchor_ns is not None else info.anchor_ns
        info.anchor_source = out.anchor_source or info.anchor_source
        info.extra["events_filtered"] = out.filtered
        _stat_fields(out.stats, info.extra, totals)
        if out.dropped_why:  # what was left out of this file, and why (reason -> events)
            info.extra["dropped_why"] = dict(out.dropped_why)
        if out.skipped:
            info.selected, info.skip_reason = False, info.skip_reason or "nothing usable"
        entry = out.meta.get(MANIFEST_ENTRY)
        if isinstance(entry, dict):  # what the format says of its file (metric samples: what was sampled)
            info.extra.update(entry)
        if isinstance(out.meta.get("rank"), int) and info.rank is None:
            info.rank = out.meta["rank"]
        plan.problems.extend(out.problems)
        if out.clock is not None:
            pair_records.append(out.clock)
            flows -= out.clock.get("acausal_pairs") or 0  # Perfetto drops a flow that ends before it starts
        totals["events_read"] += out.read
        totals["events_kept"] += out.kept
        totals["events_dropped"] += out.dropped
        totals["events_filtered"] += out.filtered
        for ph, n in out.phases.items():
            phases[ph] = phases.get(ph, 0) + n
        flows += out.stats.get("flows", 0)
        for key in own:
            own[key] += out.stats.get(key, 0)
        if out.min_ts is not None:
            lo = out.min_ts if lo is None else min(lo, out.min_ts)
            hi = out.max_ts if hi is None else max(hi, out.max_ts or out.min_ts)
    counts: dict[str, Any] = dict(totals)
    counts["slices"] = sum(phases.get(p, 0) for p in SLICE_PHASES)
    counts["counter_samples"] = phases.get("C", 0)
    counts["flows"] = flows
    for key, always in manifest_counts():  # scope_links (TokenSpeed), run_flow_endpoints (requests)
        if always or own[key]:
            counts[key] = own[key]
    counts["processes"] = len(state.processes)
    counts["threads"] = len(state.threads)
    counts["phases"] = dict(sorted(phases.items()))
    if state.writer_stats:
        counts["writer"] = state.writer_stats
    manifest["counts"] = counts
    manifest["timeline"]["clock"].setdefault("artifacts", []).extend(pair_records)
    manifest["timeline"].update({"base_ns": state.base_ns, "start_ns": lo, "end_ns": hi})
    manifest["output"].update(
        {"size": state.output_size, "written": state.written, "ui_memory": ui_section(counts)}
    )
    manifest["artifacts"] = [artifact_entry(a.info) for a in plan.artifacts]
    manifest["ignored"] = plan.ignored
    manifest["runs"] = [{"run_id": r, "processes": n} for r, n in sorted(plan.runs.items())]
    manifest["sessions"] = [
        {
            "run_id": _run_of(plan),
            "step": s,
            "start_ns": w[0],
            "end_ns": w[1],
            "source": plan.step_sources.get(s),
        }
        for s, w in plan.step_windows.items()
    ]
    manifest["processes"] = _processes(plan, state)


# stats key -> manifest key (in the file's entry and the totals): slices Perfetto would drop for not
# nesting, moved to overlap tracks beside their thread (and how many such tracks), the few dropped past
# the last overlap track, and flow events no slice can take (left out of every output format)
_STAT_FIELDS = (
    (OVERLAP_MOVED, "slices_on_overlap_tracks"),
    (OVERLAP_TRACKS, "overlap_tracks"),
    (OVERLAP_DROPPED, "slices_dropped_overlapping"),
    (UNBOUND, "unbound_flow_events"),
    (OUTLIERS, "time_outliers"),
)


def artifact_entry(info: ArtifactInfo) -> dict[str, Any]:
    """A file's manifest entry, with ``stack`` after ``kind`` where its format reads one RL stack's own
    files (AReaL's, NeMo-RL's): which stack each file came from."""
    entry = info.as_dict()
    fmt = format_of(info.kind)
    if fmt is None or not fmt.stack:
        return entry
    out: dict[str, Any] = {}
    for key, value in entry.items():
        out[key] = value
        if key == "kind":
            out["stack"] = fmt.stack
    return out


def _stat_fields(stats: dict[str, int], entry: dict[str, Any], totals: dict[str, int]) -> None:
    for key, name in _STAT_FIELDS:
        n = stats.get(key, 0)
        if n:
            entry[name] = n
            totals[name] = totals.get(name, 0) + n


def _run_of(plan: Plan) -> str | None:
    return next(iter(plan.runs)) if len(plan.runs) == 1 else None


def _processes(plan: Plan, state: RunState) -> list[dict[str, Any]]:
    out = []
    for proc in sorted(plan.processes.values(), key=lambda p: p.merged_pid):
        subs = sorted(
            process_title(d, state.titles)
            for pid, d in state.processes.items()
            if d.sub is not None and pid & ~0xFF == proc.merged_pid
        )
        out.append(
            {
                "host": proc.key.host,
                "pid": proc.key.pid if proc.key.pid >= 0 else None,
                "name": proc.label,
                "merged_pid": proc.merged_pid,
                "sort_index": proc.sort_index,
                "role": proc.role,
                "rank": proc.rank,
                "run_id": proc.run_id,
                "actor_name": proc.actor_name,
                "record": proc.record_path,
                "in_trace": proc.merged_pid in state.processes,
                "sub_processes": subs,
            }
        )
    return out
