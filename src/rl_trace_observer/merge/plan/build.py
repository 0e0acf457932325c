"""From a list of files to a merge plan: what each file is, which process owns it, what to merge.

Everything here is cheap (file heads, names, the small process records) and runs in the parent
before any big file is read:

1. sniff every file (content first, name second) and drop exact duplicates;
2. read the process records and link the artifacts they registered (relative paths, resolved
   inside the inputs only — a record can never make the merger open anything else);
3. place the remaining files by (host, pid) from their names and heads, reporting ``unlinked``
   when no record vouches for them in a run that has records, or when a file names no pid — a missing
   rank or host is never silently defaulted. Plain profiler traces (no record anywhere: nothing was
   captured by us) are placed by their own pid with no problem; their manifest entry says how;
4. select by run, role and step, find step windows, order processes and give them merged pids.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..files.sources import Content, Head, Source, fingerprint, read_content, read_head
from ..formats import EVENT_KINDS, UNKNOWN, Hints, ReadContext, format_for, format_of, sniff
from ..formats.base import KERNELS, REPORT, MarksSteps, ProcessRecords, SharesPid, rank_role_of
from ..timeline.identity import planned_pid
from ..timeline.model import ArtifactInfo, Problem, ProcessInfo, ProcessKey
from ..timeline.steps import Marker, windows_from_markers
from .plan import Plan, PlannedArtifact
from .records import apply_record, is_record, link_records

UNKNOWN_HOST = "unknown-host"
_ROLE_ORDER = {
    "driver": 0, "trainer": 1, "taskrunner": 1, "actor": 2, "ref": 3, "critic": 4,
    "reward": 5, "rollout": 6, "tokenspeed": 7,
}  # fmt: skip


@dataclass
class Sniffed:
    """What one file's head says (step 1 for one file). Plain data: a Ray node sniffs its own files
    and sends this instead of their bytes (``rl_trace_observer.cluster``)."""

    kind: str  # its format's kind, or formats.UNKNOWN (not a trace, or empty)
    hints: Hints = field(default_factory=Hints)
    problem: tuple[str, str] | None = None  # (kind, detail) about the file
    skip_reason: str | None = None


@dataclass
class Prepared:
    """Everything planning reads from one file, read where the file is: its head's verdict, its
    duplicate fingerprint, (process records) its content and (RL-Insight logs, Torch traces) its step
    markers."""

    sniffed: Sniffed
    fingerprint: str | None = None
    content: Content | None = None
    markers: tuple[Marker, ...] | None = None  # None: not read where the file is


def plan_sources(sources: list[Source], prepared: Mapping[str, Prepared] | None = None) -> Plan:
    """Steps 1-3 of the module docstring (selection is :func:`select`). ``prepared`` (by source URL):
    what was read elsewhere for files this process cannot open."""
    plan = Plan([], {}, [])
    known = prepared or {}
    for src in sources:
        found = known.get(src.url)
        _add(src, found.sniffed if found is not None else sniff_source(src), plan)
    _drop_duplicates(plan, known)
    records = [a for a in plan.artifacts if is_record(a.info.kind)]
    for art in records:
        found = known.get(art.source.url)
        _read_record(art, plan, found.content if found is not None else None)
    link_records(plan)
    _place_unlinked(plan)
    _steps_from_records(plan)
    _steps_from_markers(plan, known)
    return plan


def sniff_source(src: Source) -> Sniffed:
    if src.unreadable:  # not a regular file, or one we may not open: never opened
        return Sniffed(UNKNOWN, problem=("unreadable", src.unreadable), skip_reason=src.unreadable)
    head = read_head(src)
    if head.error:  # cannot be opened, or a gzip stream that does not inflate
        return Sniffed(UNKNOWN, problem=("unreadable", head.error), skip_reason=head.error)
    if not head.data.strip():
        return _blank(head)
    try:
        fmt, head = sniff(head)
        hints = fmt.hints(head) if fmt is not None else None
    except Exception as exc:  # a head no reader foresaw: this file is left out, named, never the merge
        what = f"{type(exc).__name__}: {exc}"[:300].replace("\n", " ")
        return Sniffed(
            UNKNOWN, problem=("not_a_trace", f"its head cannot be read ({what})"), skip_reason="not a trace"
        )
    if fmt is None or hints is None:
        return Sniffed(
            UNKNOWN,
            problem=("not_a_trace", "no reader recognises this file's content"),
            skip_reason="not a trace",
        )
    return Sniffed(fmt.kind, hints)


def _blank(head: Head) -> Sniffed:
    """What a file without a single non-blank byte in its head is, said precisely."""
    stored = f"{head.source.size:,} bytes"
    if not head.data and not head.gzip:
        why = "empty file (0 bytes: a writer died before writing?)"
    elif not head.data:
        why = f"a gzip stream of nothing ({stored} stored, 0 inflated)"
    elif head.whole:
        why = f"holds only whitespace ({len(head.data):,} bytes{' inflated' if head.gzip else ''})"
    else:
        first = f"first {len(head.data) >> 10} KiB{' inflated' if head.gzip else ''}"
        return Sniffed(
            UNKNOWN,
            problem=("not_a_trace", f"its {first} are only whitespace ({stored} stored): no trace starts so"),
            skip_reason="only whitespace",
        )
    return Sniffed(UNKNOWN, problem=("incomplete", why), skip_reason="empty file")


def prepare(src: Source) -> Prepared:
    """What :func:`plan_sources` needs of one file, read here (a Ray node's side of planning)."""
    sniffed = sniff_source(src)
    fmt = format_of(sniffed.kind)
    content = read_content(src) if isinstance(fmt, ProcessRecords) else None
    print_ = fingerprint(src) if fmt is not None and not fmt.ignored else None
    markers = markers_of(fmt, src) if isinstance(fmt, MarksSteps) else None
    return Prepared(sniffed, print_, content, markers)


def markers_of(fmt: MarksSteps, src: Source) -> tuple[Marker, ...] | None:
    """A file's step markers; none where its content breaks the search (a planning hint only: the
    file's own job reads it and names what is wrong)."""
    try:
        return fmt.step_markers(src)
    except Exception:
        return None


def _add(src: Source, sniffed: Sniffed, plan: Plan) -> None:
    fmt = format_of(sniffed.kind)
    if fmt is not None and fmt.ignored:
        plan.ignored.append(src.url)
        return
    info = ArtifactInfo(path=src.url, rel=src.rel, kind=sniffed.kind, size=src.size)
    if sniffed.problem is not None:
        kind, detail = sniffed.problem
        info.selected, info.skip_reason = False, sniffed.skip_reason
        info.complete = kind != "incomplete"
        plan.problems.append(Problem(kind, src.url, detail))
        plan.artifacts.append(PlannedArtifact(info, src))
        return
    hints = sniffed.hints
    info.step, info.rank, info.role, info.group = hints.step, hints.rank, hints.role, hints.group
    plan.artifacts.append(PlannedArtifact(info, src, hints))


def _drop_duplicates(plan: Plan, known: Mapping[str, Prepared]) -> None:
    """The same bytes under two paths (a run collected twice): merge the first copy only."""
    by_size: dict[int, list[PlannedArtifact]] = defaultdict(list)
    for art in plan.artifacts:
        if art.info.selected and format_of(art.info.kind) is not None:
            by_size[art.info.size].append(art)
    for same in by_size.values():
        if len(same) < 2:
            continue
        seen: dict[str, PlannedArtifact] = {}
        for art in same:
            found = known.get(art.source.url)
            print_ = found.fingerprint if found is not None else None
            first = seen.setdefault(print_ or fingerprint(art.source), art)
            if first is not art:
                art.info.selected, art.info.skip_reason = False, f"duplicate of {first.info.path}"
                plan.problems.append(
                    Problem("duplicate", art.info.path, f"same content as {first.info.path}")
                )


def _read_record(art: PlannedArtifact, plan: Plan, content: Content | None = None) -> None:
    content = content if content is not None else read_content(art.source)
    art.info.sha256, art.info.complete = content.sha256, content.complete
    fmt = format_for(art.info.kind)
    result = fmt.read(content.data, ReadContext(art.info.path, art.source.name))
    plan.problems.extend(result.problems)
    record = result.meta.get("record")
    art.info.selected = False  # records hold no events
    if not isinstance(record, dict) or not isinstance(fmt, ProcessRecords):
        art.info.skip_reason = "invalid process record"
        return
    info = fmt.identity(record, art.info.path)
    known = plan.processes.get(info.key)
    if known is not None and known.record_path:
        plan.problems.append(Problem("duplicate", art.info.path, f"second record for {info.key}"))
        return
    plan.processes[info.key] = info
    art.info.owner = info.key
    art.record_entry = record


def _host_for(art: PlannedArtifact, plan: Plan, pid: int | None) -> str | None:
    """Host of an unlinked file: its own name/content, else the records beside it."""
    if art.hints.host:
        return art.hints.host
    folder = posixpath.dirname(art.source.path)
    near = [p for p in plan.processes.values() if p.record_path and posixpath.dirname(_path_of(p)) == folder]
    if pid is not None:
        same_pid = {p.key.host for p in near if p.key.pid == pid}
        same_pid |= {
            a.hints.host
            for a in plan.artifacts
            if a.hints.host and a.hints.pid == pid and posixpath.dirname(a.source.path) == folder
        }
        if len(same_pid) == 1:
            return same_pid.pop()
    hosts = {p.key.host for p in plan.processes.values()}
    for part in reversed(art.source.path.split("/")[:-1]):
        if part in hosts:
            return part
    near_hosts = {p.key.host for p in near}
    if len(near_hosts) == 1:
        return near_hosts.pop()
    top = art.source.rel.split("/")
    return top[0] if len(top) > 1 else None  # `rl-trace collect` lays files out as <node>/...


def _path_of(info: ProcessInfo) -> str:
    return (info.record_path or "").split("://", 1)[-1]


def _place_unlinked(plan: Plan) -> None:
    """A TokenSpeed rank's Proton files carry no OS pid: they take their rank's report's.

    A file no record vouches for is a problem (``unlinked``) where the inputs have process records (its
    process should have registered it) or where it names no pid; plain profiler traces, merged with no
    record at all, are placed by the pid they name, stated in their manifest entry (``placement``)."""
    recorded = any(p.record_path for p in plan.processes.values())
    partners: dict[tuple[str, str], PlannedArtifact] = {}
    for art in plan.artifacts:
        if _rank_role(art) == REPORT and art.hints.group and art.hints.pid is not None:
            partners.setdefault((posixpath.dirname(art.source.path), art.hints.group), art)
    placeholders: dict[tuple[str, str], ProcessKey] = {}
    twins = _pid_twins(plan)
    for art in plan.artifacts:
        info = art.info
        if info.kind not in EVENT_KINDS or info.owner is not None or not info.selected:
            continue
        pid = art.hints.pid
        how = "pid and host from the file"
        if pid is None and _rank_role(art) == KERNELS and art.hints.group:
            partner = partners.get((posixpath.dirname(art.source.path), art.hints.group))
            if partner is not None:
                pid, how = partner.hints.pid, "its TokenSpeed VizTracer report"
                art.hints.host = art.hints.host or partner.hints.host
        twin = _twin_of(art, twins) if pid is None else None
        if twin is not None:
            pid, how = twin.hints.pid, f"its {twin.info.kind} file's pid"
            art.hints.host = art.hints.host or twin.hints.host
        host = _host_for(art, plan, pid) or UNKNOWN_HOST
        if pid is None:
            slot = (host, art.hints.group or art.source.path)
            key = placeholders.setdefault(slot, ProcessKey(host, -(len(placeholders) + 1)))
            how = "no pid in the file"
        else:
            key = ProcessKey(host, pid)
        info.owner = key
        if key not in plan.processes:
            plan.processes[key] = _process_from_hints(key, art)
        if not plan.processes[key].record_path:
            detail = f"no process record for {key.host} pid {key.pid}; placed by {how}"
            if host == UNKNOWN_HOST:
                detail += "; host unknown (put each node's files in a folder named after the host)"
            if recorded or key.pid < 0:
                plan.problems.append(Problem("unlinked", info.path, detail))
            else:
                info.extra["placement"] = detail
    _ranks_apart(plan)


def _pid_twins(plan: Plan) -> dict[tuple[str, Any], PlannedArtifact]:
    """(kind, pid key) → a file that names its pid, for the formats whose files take another's
    (``SharesPid.pid_from``: an AReaL session file takes its perf trace's)."""
    wanted: set[str] = set()
    for art in plan.artifacts:
        fmt = format_of(art.info.kind)
        if isinstance(fmt, SharesPid) and fmt.pid_from:
            wanted.add(fmt.pid_from)
    out: dict[tuple[str, Any], PlannedArtifact] = {}
    for art in plan.artifacts:
        fmt = format_of(art.info.kind)
        if isinstance(fmt, SharesPid) and art.info.kind in wanted and art.hints.pid is not None:
            key = fmt.pid_key(art.source.path)
            if key is not None:
                out.setdefault((art.info.kind, key), art)
    return out


def _twin_of(art: PlannedArtifact, twins: dict[tuple[str, Any], PlannedArtifact]) -> PlannedArtifact | None:
    fmt = format_of(art.info.kind)
    if not isinstance(fmt, SharesPid) or fmt.pid_from is None:
        return None
    key = fmt.pid_key(art.source.path)
    return twins.get((fmt.pid_from, key)) if key is not None else None


def _ranks_apart(plan: Plan) -> None:
    """Files placed by their own pid that state different ranks yet land in one process (equal pids on
    hosts the files do not name): ``unlinked``, as a rank is never silently merged into another's."""
    ranks: dict[ProcessKey, dict[int, PlannedArtifact]] = defaultdict(dict)
    for art in plan.artifacts:
        if "placement" in art.info.extra and art.info.owner is not None and art.hints.rank is not None:
            ranks[art.info.owner].setdefault(art.hints.rank, art)
    for key, by_rank in ranks.items():
        if len(by_rank) > 1:
            listed = ", ".join(str(r) for r in sorted(by_rank))
            for art in by_rank.values():
                detail = (
                    f"{art.info.extra.pop('placement')}; ranks {listed} all name pid {key.pid} of {key.host}"
                )
                plan.problems.append(Problem("unlinked", art.info.path, detail))


def _rank_role(art: PlannedArtifact) -> str | None:
    return rank_role_of(format_of(art.info.kind))


def _process_from_hints(key: ProcessKey, art: PlannedArtifact) -> ProcessInfo:
    info = ProcessInfo(key=key)
    if art.hints.group:
        info.role, info.actor_name = "tokenspeed", art.hints.group.rsplit("-", 1)[-1]
    elif art.hints.rank is not None:
        info.rank = art.hints.rank
    if art.hints.role and not art.hints.group:  # a role the file's own path states (AReaL's role folders)
        info.role = art.hints.role
    if info.role is None and art.hints.process_role:  # the role a file states for its own process
        info.role = art.hints.process_role
    return info


def _steps_from_records(plan: Plan) -> None:
    """Step windows from ``step_begin``/``step_end`` clock snapshots, trainer and driver first."""
    found: dict[int, list[int]] = {}
    source: dict[int, str] = {}
    preferred = [p for p in plan.processes.values() if p.role in ("trainer", "driver", "taskrunner")]
    for proc in preferred or list(plan.processes.values()):
        begins: dict[int, int] = {}
        for snap in proc.record.get("clock_snapshots") or []:
            step, wall = snap.get("step"), snap.get("wall_ns")
            if not isinstance(step, int) or not isinstance(wall, int):
                continue
            if snap.get("reason") == "step_begin":
                begins[step] = wall
            elif snap.get("reason") == "step_end" and step in begins:
                lo, hi = found.get(step, [begins[step], wall])
                found[step] = [min(lo, begins[step]), max(hi, wall)]
                source.setdefault(step, str(proc.key))
    plan.step_windows = {s: (w[0], w[1]) for s, w in sorted(found.items())}
    plan.step_sources = source


def _steps_from_markers(plan: Plan, known: Mapping[str, Prepared]) -> None:
    """Step windows from the step markers its formats find (``MarksSteps.step_markers``: RL-Insight logs,
    else profiler traces' ``ProfilerStep#N``: ``MarksSteps.markers_rank``), by the report's own rule
    (:mod:`..timeline.steps`); they replace the snapshot windows of :func:`_steps_from_records`
    (taken at profiled steps only)."""
    ranked: list[tuple[MarksSteps, PlannedArtifact]] = []
    for art in plan.artifacts:
        found_fmt = format_of(art.info.kind)
        if isinstance(found_fmt, MarksSteps):
            ranked.append((found_fmt, art))
    if not ranked:
        return
    first = min(fmt.markers_rank for fmt, _ in ranked)
    found: list[Marker] = []
    source: dict[int, str] = {}
    for fmt, art in ranked:
        if fmt.markers_rank != first:
            continue
        ready = known.get(art.source.url)
        markers = ready.markers if ready is not None else None
        if markers is None:
            markers = markers_of(fmt, art.source)
        if fmt.markers_relative and markers:
            anchor = art.info.anchor_ns
            markers = () if anchor is None else tuple(_shifted(m, anchor) for m in markers)
        for m in markers or ():
            found.append(m)
            for n in m.numbers:
                source.setdefault(n, art.info.path)
    windows = windows_from_markers(found)
    if windows:
        plan.step_windows = {w.step: (w.start_ns, w.end_ns) for w in windows}
        plan.step_sources = {w.step: source.get(w.step, "step markers") for w in windows}


def _shifted(m: Marker, anchor_ns: int) -> Marker:
    return dataclasses.replace(m, start_ns=m.start_ns + anchor_ns, end_ns=m.end_ns + anchor_ns)


def order_processes(plan: Plan) -> None:
    """Natural order — driver/trainer, actor ranks, rollout replicas, ... — as merged pids."""

    def key(p: ProcessInfo) -> tuple[int, int, str, int]:
        order = _ROLE_ORDER.get(p.role or "", 8 if p.role else 9)
        idx = p.rank if p.rank is not None else (p.replica if p.replica is not None else 1 << 30)
        return order, idx, p.key.host, p.key.pid

    for index, proc in enumerate(sorted(plan.processes.values(), key=key)):
        proc.merged_pid = planned_pid(index)
        proc.sort_index = index


def apply_records_to_artifacts(plan: Plan) -> None:
    """Copy step/role/rank from the owning process (record entries were applied when linking)."""
    for art in plan.artifacts:
        owner = plan.processes.get(art.info.owner) if art.info.owner else None
        if owner is None:
            continue
        if art.record_entry is None and art.info.kind in EVENT_KINDS:
            apply_record(art, owner)
