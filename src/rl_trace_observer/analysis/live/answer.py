"""Answer one finished step: its piece of span shards and Perfetto view, then its report rows.

Built only on public entry points: the merge (``merge.pipeline.local.merge`` with
``MergeOptions(steps=..., shards=...)``) and the report's summary of span shards
(``analysis.report.output.summarize``).
"""

from __future__ import annotations

import shutil
import time
from typing import Any

import orjson

from ...merge.options import MergeOptions
from ...merge.pipeline.local import merge
from ..report.output import summarize
from .figures import step_figures
from .options import WatchOptions

PIECES_DIR, VIEWS_DIR = "pieces", "views"


def piece_name(step: int, revision: int) -> str:
    return f"step-{step}" if revision == 1 else f"step-{step}.r{revision}"


def answer_step(
    opts: WatchOptions,
    step: int,
    window: tuple[int, int],
    revision: int = 1,
    skip_lines: dict[str, tuple[tuple[int, int], ...]] | None = None,
) -> dict[str, Any]:
    """Merge step ``step`` of the run into a new piece and view; its figures and what it used.

    The merge keeps the events overlapping the step's window widened by ``opts.pad_s`` on both
    sides, not only the step's own (``--step``): the report's telemetry of a step reads the metric
    samples just before and just after it (counter deltas, gauges over the window), which a cut at
    the window's edges would drop, and the post-hoc report has them. Only the step's own rows are
    kept as its figures; the view shows the step with that much context.

    ``window``: the time to merge (before padding): the step's window, reaching back to the
    previous step's end when that ended before this step began (:func:`merge_from`).

    ``skip_lines``: byte runs of the event logs whose events all ended long before the window
    (:meth:`.seen.Seen.skip_lines`): the merge leaves them unread, so a step costs its own part of
    the run, not the whole run read again."""
    t0 = time.monotonic()
    pad = int(opts.pad_s * 1e9)
    name = piece_name(step, revision)
    piece = opts.out_dir / PIECES_DIR / name
    view = opts.out_dir / VIEWS_DIR / f"{name}.pftrace"
    view.parent.mkdir(parents=True, exist_ok=True)
    if piece.exists():  # left by a watch killed before it recorded this step: made again, whole
        shutil.rmtree(piece)
    mopts = MergeOptions(
        time_window=((window[0] - pad) / 1e9, (window[1] + pad) / 1e9),
        shards=str(piece),
        skip_lines=skip_lines,
    )
    if opts.merge is not None:  # a Ray watch: converted on the nodes, only the piece travels
        result = opts.merge(str(view), mopts)
    else:  # the merge's own executor default: in-process when small, else its pool
        result = merge([str(opts.run_dir)], str(view), mopts)
    merged_s = time.monotonic() - t0
    summary = summarize(piece, only_steps={step})  # the piece holds the step before too: not its rows
    record: dict[str, Any] = {
        "step": step,
        "figures": step_figures(summary, step),
        "events": int(result.manifest.get("counts", {}).get("events_kept", 0)),
        "exit_code": result.exit_code,
        "problems": len(result.problems),
        "view": str(view.relative_to(opts.out_dir)),
        "piece": str(piece.relative_to(opts.out_dir)),
        "clock_key": clock_key(result.manifest),
        "identity": identity_of(result.manifest),
        "clock_quality": (summary.get("clock") or {}).get("quality"),
        "corrected": False,
        "answered_wall_ns": time.time_ns(),
        "merge_s": round(merged_s, 4),
        "answer_s": round(time.monotonic() - t0, 4),
    }
    cluster = result.manifest.get("cluster")
    if isinstance(cluster, dict):  # a Ray merge: what travelled, and the nodes it could not reach
        record["cluster"] = {
            "bytes_to_driver": cluster.get("bytes_to_driver"),
            "raw_bytes": cluster.get("raw_bytes"),
            "jobs_missing": cluster.get("jobs_missing"),
            "nodes": {n.get("label"): n.get("status") for n in cluster.get("nodes") or []},
        }
    return record


def merge_from(start_ns: int, since_ns: int | None) -> int:
    """Where a step's merge begins: its start, or the previous step's end (``since_ns``) when that
    came first, so what ran between the two steps (a weight sync: :func:`..report.rollout.sync_step`
    gives it to this step) is in this step's piece as it is in the whole run, however long the gap."""
    return start_ns if since_ns is None else min(start_ns, since_ns)


SKIP_MARGIN_NS = 60 * 10**9  # lines skipped ended this long before the merged window (and more: skip_before)


def skip_before(window_start_ns: int, pad_s: float, key: str | None) -> int:
    """The time before which an event log's lines may go unread for a step starting at
    ``window_start_ns``: its padded window, less :data:`SKIP_MARGIN_NS` and the largest clock offset
    any host was corrected by (the lines' times are the writers' own clocks)."""
    offsets = [0]
    if key:
        for d in (orjson.loads(key).get("hosts") or {}).values():
            if isinstance(d.get("offset"), int):
                offsets.append(abs(d["offset"]) * OFFSET_GRAIN_NS + OFFSET_GRAIN_NS)
    return window_start_ns - int(pad_s * 1e9) - SKIP_MARGIN_NS - max(offsets)


def identity_of(manifest: dict[str, Any]) -> dict[str, list[Any]]:
    """What the merge knew of each process (``host:pid`` -> role, rank, actor, merged pid): a process
    record rewritten later (VERL's workers learn their role after they start) changes the figures
    of the steps answered before, as later clock data does."""
    return {
        f"{p.get('host')}:{p.get('pid')}": [
            p.get("role"),
            p.get("rank"),
            p.get("actor_name"),
            p.get("merged_pid"),
        ]
        for p in manifest.get("processes") or []
        if isinstance(p, dict)
    }


def stale(record: dict[str, Any], latest: dict[str, Any]) -> bool:
    """Whether ``record`` was answered with other clock data or process identities than ``latest``."""
    if record.get("clock_key") != latest.get("clock_key"):
        return True
    now = latest.get("identity") or {}
    return any(key in now and now[key] != was for key, was in (record.get("identity") or {}).items())


OFFSET_GRAIN_NS = 100_000  # a host's offset moving by less than this does not re-answer earlier steps
DRIFT_GRAIN_PPM = 0.1


def clock_key(manifest: dict[str, Any]) -> str:
    """The clock correction a merge applied, per host, as one comparable string (offsets to
    :data:`OFFSET_GRAIN_NS`, drift to :data:`DRIFT_GRAIN_PPM`: periodic re-measurements that move a
    host by less do not make every earlier step be merged again)."""
    clock = (manifest.get("timeline") or {}).get("clock") or {}
    per_host = {}
    for host, d in sorted((clock.get("hosts") or {}).items()):
        d = d or {}
        offset, drift = d.get("offset_ns"), d.get("drift_ppm")
        per_host[host] = {
            "method": d.get("method"),
            "applied": d.get("applied"),
            "offset": None if offset is None else round(offset / OFFSET_GRAIN_NS),
            "drift": None if drift is None else round(drift / DRIFT_GRAIN_PPM),
        }
    return orjson.dumps({"mode": clock.get("mode"), "hosts": per_host}, option=orjson.OPT_SORT_KEYS).decode()
