"""Expected versus found: what the process records say should exist, against what the nodes hold.

Process records (docs/FORMATS.md §2) name each process's event log and every artifact it registered,
with role, rank and step. From them we derive, without guessing: per node, registered files that are
absent; per run, ranks of a role with no process record at all (their node may be gone) and profiled
steps a rank has no artifact for. Records of other runs sharing the output directory mark their files
as belonging elsewhere, so ``--run`` collects only what is its own (files no record claims are kept).
Ray's dead nodes are judged here too: lost, back on the same host, or collected by an earlier run.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ...capture.recorder import expected_event_log
from .collect_dest import safe_name
from .collect_report import NodeReport

Listing = Mapping[str, Any]


class AmbiguousRun(ValueError):
    """The output directories hold records of several runs and none was chosen."""


def _records(listing: Listing) -> dict[str, dict[str, Any]]:
    recs = listing.get("records") or {}
    return {rel: rec for rel, rec in recs.items() if isinstance(rec, dict)}


def resolve_run_id(requested: str | None, listings: Iterable[Listing]) -> tuple[str, str]:
    """(run_id, where it came from): explicit, else the single run found in records, else ``local``."""
    if requested:
        return requested, "given"
    counts: Counter[str] = Counter()
    for listing in listings:
        counts.update(str(r["run_id"]) for r in _records(listing).values() if r.get("run_id"))
    if len(counts) == 1:
        return next(iter(counts)), "process records"
    if not counts:
        return "local", "default (no process record names a run)"
    found = ", ".join(f"{run} ({n} processes)" for run, n in counts.most_common())
    raise AmbiguousRun(f"the output directories hold several runs: {found}; pass --run ID (run=...)")


def _claims(rel: str, rec: Mapping[str, Any]) -> set[str]:
    """Files a record accounts for: itself, its event log, its artifacts under the output dir."""
    out = {rel}
    if isinstance(rec.get("event_log"), str):
        out.add(rec["event_log"])
    for art in rec.get("artifacts") or ():
        path = art.get("path")
        if isinstance(path, str) and not art.get("outside_output_dir"):
            out.add(path)
    return out


def other_run_files(listing: Listing, run_id: str) -> tuple[set[str], set[str]]:
    """(files owned only by records of other runs, those run ids)."""
    mine: set[str] = set()
    theirs: set[str] = set()
    runs: set[str] = set()
    for rel, rec in _records(listing).items():
        if rec.get("run_id") in (None, run_id):
            mine |= _claims(rel, rec)
        else:
            theirs |= _claims(rel, rec)
            runs.add(str(rec["run_id"]))
    return theirs - mine, runs


def _under(path: str, present: set[str]) -> bool:
    prefix = path.rstrip("/") + "/"
    return path in present or any(p.startswith(prefix) for p in present)


def node_missing(listing: Listing, run_id: str) -> list[tuple[str, str]]:
    """Registered files of this run that the node does not hold (refused ones are reported apart)."""
    present = {f[0] for f in listing.get("files") or ()} | {r[0] for r in listing.get("refused") or ()}
    out: list[tuple[str, str]] = []
    for rel, rec in sorted(_records(listing).items()):
        if rec.get("run_id") not in (None, run_id):
            continue
        log = expected_event_log(rec)  # None for a record that never wrote an event
        if log is not None and log not in present:
            out.append((log, f"event log named by {rel} is not in the output directory"))
        for art in rec.get("artifacts") or ():
            path = art.get("path")
            if not isinstance(path, str):
                continue
            what = f"{art.get('kind', 'artifact')} artifact registered by {rel}"
            if art.get("outside_output_dir"):
                out.append((path, f"{what} lies outside the output directory: not collected"))
            elif not _under(path, present):
                out.append((path, f"{what} (step {art.get('step')}) is not in the output directory"))
    return out


def _rank_gaps(recs: Sequence[Mapping[str, Any]]) -> list[str]:
    seen: dict[tuple[str, int], set[int]] = defaultdict(set)
    for rec in recs:
        rank, world = rec.get("rank"), rec.get("world_size")
        if isinstance(rank, int) and isinstance(world, int) and world > 0:
            seen[(str(rec.get("role") or "(no role)"), world)].add(rank)
    lines = []
    for (role, world), ranks in sorted(seen.items()):
        gone = sorted(set(range(world)) - ranks)
        if gone:
            lines.append(
                f"role {role}: no process record for rank(s) {', '.join(map(str, gone))} of world size "
                f"{world} (their node may be gone or unreachable)"
            )
    return lines


def _step_gaps(recs: Sequence[Mapping[str, Any]], profiled_steps: Sequence[int] | None) -> list[str]:
    steps: dict[str, dict[Any, set[int]]] = defaultdict(lambda: defaultdict(set))
    for rec in recs:
        for art in rec.get("artifacts") or ():
            step = art.get("step")
            if isinstance(step, int):
                role = str(art.get("role") or rec.get("role") or "(no role)")
                rank = art.get("rank") if art.get("rank") is not None else rec.get("rank")
                steps[role][rank].add(step)
    lines = []
    for role, per_rank in sorted(steps.items()):
        wanted = set().union(*per_rank.values()) | set(profiled_steps or ())
        for rank, have in sorted(per_rank.items(), key=lambda kv: str(kv[0])):
            gap = sorted(wanted - have)
            if gap:
                lines.append(
                    f"role {role} rank {rank}: no artifact for profiled step(s) {', '.join(map(str, gap))}"
                )
    return lines


def run_coverage(
    listings: Iterable[Listing], run_id: str, profiled_steps: Sequence[int] | None = None
) -> list[str]:
    """Run-level gaps across every node that answered: missing ranks per role, missing steps per rank."""
    recs = [
        r for listing in listings for r in _records(listing).values() if r.get("run_id") in (None, run_id)
    ]
    return _rank_gaps(recs) + _step_gaps(recs, profiled_steps)


DONE_BEFORE = ("complete", "shared", "collected-earlier")


def dead_node_reports(
    dead: Iterable[Mapping[str, Any]], alive: Mapping[tuple[str, str], str], previous: Mapping[str, str]
) -> list[NodeReport]:
    """Ray's dead nodes: a problem unless an earlier collection got them or their host is back.

    ``alive`` maps (host, IP) of the nodes collected now to their label: a node that died and
    came back on the same machine has its disk back, so the live node's listing covers it.
    ``previous`` is node id -> status from the last report written under ``DEST/<run_id>``.
    """
    out = []
    for info in dead:
        rep = NodeReport(node_id=str(info["NodeID"]), address=str(info.get("NodeManagerAddress", "?")))
        rep.hostname = str(info.get("NodeManagerHostname") or rep.address)
        rep.label = safe_name(rep.hostname)
        again = alive.get((rep.label, rep.address))
        if previous.get(rep.node_id) in DONE_BEFORE:
            rep.status = "collected-earlier"
        elif again is not None:
            rep.status = "restarted"
            rep.notes.append(f"dead, but its host is back in the cluster (collected as {again})")
        else:
            rep.status = "dead"
            why = info.get("DeathReasonMessage") or "no reason given"
            rep.notes.append(
                f"node was dead before collection ({why}): files only on its disk are out of reach"
            )
        out.append(rep)
    return out
