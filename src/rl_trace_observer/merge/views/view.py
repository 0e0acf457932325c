"""Perfetto outputs written from span shards: one step, some roles — never the raw inputs again.

``rl-trace merge SHARDS_DIR -o step3.pftrace --step 3`` (or ``--split-steps``, ``--role``) rebuilds
the merged events from the rows of the selected parts and writes them with the merge's own writers,
job by job in the merged trace's order (so a ``.pftrace`` keeps one packet sequence per job, and
memory follows the largest job, not the run). A view holds:

- the rows whose ``step`` column is selected (the artifact's step, else the step window the event
  starts in) and whose process has a selected role;
- of flows, only links whose both ends are in the view (a half flow is an import error in Perfetto);
- the names of exactly the processes and threads it uses, as the full trace names them.

Its manifest (``<output>.manifest.json``) gives the counts Perfetto will show and the browser-memory
estimate (:mod:`..manifest.ui`).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import orjson

from ...common.atomic import atomic_output
from ..job.spec import SLICE_PHASES, Job, Outcome
from ..manifest.document import manifest_path_for, new_manifest, write_manifest
from ..manifest.pair import failed_path, identity, record_failure
from ..manifest.ui import ui_section
from ..options import MergeOptions, MergeResult, UsageError, output_format, step_output
from ..output import chrome_json
from ..output.writeback import WritebackFile
from ..shards.arrow import compute
from ..shards.dataset import Shards, trace_order
from ..shards.layout import ShardsError
from ..timeline.identity import ProcessDecl, ThreadDecl
from ..timeline.model import Event, Problem

_FLOW_PHASES = ("s", "t", "f")


@dataclass(frozen=True)
class ViewSelection:
    """Which rows a view holds, and (a Perfetto archive's per-host files) how its times move."""

    steps: list[int] | None = None  # None: every step (and none)
    roles: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()
    shift_ns: int = 0  # added to every time (a host's own clock: its measured offset)
    base_ns: int | None = None  # the timeline origin written (default: the shards')


@dataclass
class _Mapper:
    """What the protobuf writer asks a job's identity mapper for: the tracks it declares."""

    processes: dict[int, ProcessDecl] = field(default_factory=dict)
    threads: dict[tuple[int, int], ThreadDecl] = field(default_factory=dict)


def merge_view(shards_dir: str, output: str, opts: MergeOptions) -> MergeResult:
    """One view of the shards in ``shards_dir`` (selection: ``opts.steps``, ``opts.roles``)."""
    fmt = output_format(output)
    steps = sorted({s for lo, hi in opts.steps for s in range(lo, hi + 1)}) if opts.steps else None

    def rows(shards: Shards, out: Path, manifest: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
        return write_rows(shards, out, fmt, ViewSelection(steps, tuple(opts.roles)))

    return write_view(shards_dir, output, opts, fmt, rows)


Maker = Callable[[Shards, Path, dict[str, Any]], tuple[dict[str, Any], list[Any]]]


def write_view(shards_dir: str, output: str, opts: MergeOptions, fmt: str, make: Maker) -> MergeResult:
    """A file made from shards (``make``: a view, an archive) with its own manifest."""
    unsupported = [
        name
        for name, on in (
            ("--time-window", opts.time_window is not None),
            ("--min-duration-us", opts.min_duration_us > 0),
            ("--shards", bool(opts.shards)),
            ("--run", bool(opts.run)),
        )
        if on
    ]
    if unsupported:
        raise UsageError(
            f"{shards_dir}: a view of span shards selects by --step and --role only ({unsupported[0]})"
        )
    try:
        shards = Shards.open(shards_dir)
    except ShardsError as exc:
        raise UsageError(str(exc)) from None
    started = time.monotonic()
    out = Path(output)
    steps = sorted({s for lo, hi in opts.steps for s in range(lo, hi + 1)}) if opts.steps else None
    manifest = new_manifest(str(out), fmt, [str(shards_dir)], {"steps": steps, "roles": list(opts.roles)})
    manifest["view_of"] = {
        "shards": str(Path(shards_dir).resolve()),
        "trace": shards.doc.get("trace", {}).get("path"),
    }
    try:
        counts, state = make(shards, out, manifest)
    except Empty:  # nothing selected: an earlier file at ``output`` stays as it was
        counts, state = {"events_kept": 0}, []
        manifest["problems"] = [
            {
                "kind": "no_step_window",
                "path": str(shards_dir),
                "detail": "no row of the shards matches the selection",
            }
        ]
    written = counts["events_kept"] > 0
    manifest["counts"] = counts
    manifest["timeline"].update(
        {
            "base_ns": shards.base_ns,
            "clock": (shards.manifest() or {}).get("timeline", {}).get("clock") or {"mode": "wall"},
        }
    )
    manifest["output"].update({"written": written, "size": None, "ui_memory": ui_section(counts)})
    manifest["processes"] = state
    manifest.setdefault("problems", []).extend(_source_problems(shards, str(shards_dir)))
    manifest["status"] = "failed" if not written else ("partial" if manifest["problems"] else "ok")
    manifest["elapsed_s"] = round(time.monotonic() - started, 3)
    mpath = Path(opts.manifest) if opts.manifest else manifest_path_for(out)
    if not written:  # an earlier view at ``output`` keeps the manifest that describes it
        mpath = record_failure(out, mpath, manifest)
        return MergeResult(str(out), str(mpath), manifest, 1, [])
    manifest["output"].update(identity(out))  # the readers check the pair (..manifest.pair)
    write_manifest(mpath, manifest)
    failed_path(mpath).unlink(missing_ok=True)
    # --strict as for a merge: a view of shards whose merge lost something fails (the view is written)
    problems = [Problem(p["kind"], p["path"], p["detail"]) for p in manifest["problems"]]
    return MergeResult(str(out), str(mpath), manifest, 1 if opts.strict and problems else 0, problems)


def _source_problems(shards: Shards, where: str) -> list[dict[str, Any]]:
    """What the merge that wrote the shards lost, or parts left out here: one problem, so that
    ``--strict`` fails a view of an incomplete run as it fails the merge itself."""
    found = []
    lost = len((shards.manifest() or {}).get("problems") or [])
    if lost:
        found.append(
            {
                "kind": "source_problems",
                "path": where,
                "detail": f"the merge that wrote these shards reported {lost} problem(s); see its manifest",
            }
        )
    line = shards.missing_line()
    if line:
        found.append({"kind": "missing_parts", "path": where, "detail": line})
    return found


def view_steps(shards_dir: str) -> list[int]:
    """The steps the rows have (an artifact's own step, or a recorded step window)."""
    try:
        shards = Shards.open(shards_dir)
    except ShardsError as exc:
        raise UsageError(str(exc)) from None
    return sorted({int(p["step"]) for p in shards.parts() if p.get("step") is not None} | set(shards.steps))


def split_views(shards_dir: str, output: str, opts: MergeOptions) -> list[MergeResult]:
    steps = (
        sorted({s for lo, hi in opts.steps for s in range(lo, hi + 1)})
        if opts.steps
        else view_steps(shards_dir)
    )
    if not steps:
        raise UsageError(f"{shards_dir}: no row of the shards has a step; select with --role instead")
    return [
        merge_view(shards_dir, step_output(output, s), MergeOptions(roles=opts.roles, steps=((s, s),)))
        for s in steps
    ]


# ------------------------------------------------------------------------------------- writing
def _jobs(shards: Shards, steps: list[int] | None, hosts: tuple[str, ...]) -> dict[int, list[Path]]:
    """Part files per job, in job order (a job's rows may be in several step parts)."""
    by_job: dict[int, list[Path]] = defaultdict(list)
    for part in shards.parts(steps=steps, hosts=hosts or None):
        by_job[int(part["job"])].append(shards.root / part["path"])
    return dict(sorted(by_job.items()))


def write_rows(
    shards: Shards, out: Path, fmt: str, sel: ViewSelection
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The selected rows as one Perfetto file (atomically); its counts and the processes it names.
    Raises ``Empty`` (and leaves ``out`` alone) when no row is selected."""
    from ..shards.arrow import parquet, pyarrow

    pa, pc, pq = pyarrow(), compute(), parquet()
    names = {p["trace_pid"]: p for p in shards.processes}
    thread_names = {(t["trace_pid"], t["trace_tid"]): t for t in shards.threads}
    counts: dict[str, Any] = {"events_kept": 0, "phases": {}, "flows": 0}
    used_pids: set[int] = set()
    used_threads: set[tuple[int, int]] = set()
    header = shards.doc.get("trace", {}).get("header") or {}
    base = shards.base_ns if sel.base_ns is None else sel.base_ns
    steps, roles = sel.steps, sel.roles
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(out) as raw:
        f = WritebackFile(raw)
        sink: Any = _Output(f, fmt, base, header)
        for job, paths in _jobs(shards, steps, sel.hosts).items():
            table = pa.concat_tables([pq.read_table(p) for p in paths])
            if roles:
                table = table.filter(
                    pc.is_in(pc.fill_null(table.column("role"), ""), value_set=pa.array(list(roles)))
                )
            if steps is not None:
                table = table.filter(pc.is_in(table.column("step"), value_set=pa.array(steps, pa.int64())))
            if sel.hosts:
                table = table.filter(pc.is_in(table.column("host"), value_set=pa.array(list(sel.hosts))))
            if sel.shift_ns:
                table = table.set_column(
                    table.schema.get_field_index("ts_ns"),
                    "ts_ns",
                    pc.add(table.column("ts_ns"), sel.shift_ns),
                )
            if not table.num_rows:
                continue
            events, links = _events(trace_order(table))
            counts["flows"] += links
            counts["events_kept"] += len(events)
            for e in events:
                counts["phases"][e.ph] = counts["phases"].get(e.ph, 0) + 1
                used_pids.add(e.pid)  # type: ignore[arg-type]
                used_threads.add((e.pid, e.tid))  # type: ignore[arg-type]
            sink.add(job, events, names, thread_names)
        procs = [names[p] for p in sorted(used_pids) if p in names]
        threads = [thread_names[k] for k in sorted(used_threads) if k in thread_names]
        if counts["events_kept"]:
            sink.close(procs, threads)
            f.flush()
        else:
            raise Empty()
    phases = counts["phases"] = dict(sorted(counts["phases"].items()))
    counts["slices"] = sum(phases.get(p, 0) for p in SLICE_PHASES)
    counts["counter_samples"] = phases.get("C", 0)
    counts["processes"], counts["threads"] = len(procs), len(threads)
    return counts, procs


class Empty(Exception):
    """No row matches the selection."""


class _Output:
    """Chrome JSON pieces, or one protobuf packet sequence per job, into the view's file."""

    def __init__(self, f: Any, fmt: str, base: int, header: dict[str, Any]) -> None:
        from ..output.compress import GzipMember

        self.fmt, self.base, self.f = fmt, base, f
        self.json = None
        self.gz = None
        if fmt.startswith("json"):
            self.json = chrome_json.ChromeJsonWriter(f, gzip=fmt == "json.gz", header=header)
        elif fmt.endswith(".gz"):
            self.gz = GzipMember(f)

    def add(self, job: int, events: list[Event], names: dict[int, Any], threads: dict[Any, Any]) -> None:
        if self.json is not None:
            pieces, _, _ = chrome_json.encode_pieces(events, self.base, self.fmt == "json.gz")
            self.json.add(pieces)
            return
        from ..job.emit_pftrace import PftraceEmitter
        from ..output.compress import write_any_piece

        titles = {pid: p["name"] for pid, p in names.items()}
        mapper = _Mapper()
        for e in events:
            pid, tid = int(e.pid), int(e.tid)  # type: ignore[arg-type]
            if pid in names and pid not in mapper.processes:
                mapper.processes[pid] = ProcessDecl(pid, None)
            t = threads.get((pid, tid))
            if t is not None and (pid, tid) not in mapper.threads:
                mapper.threads[(pid, tid)] = ThreadDecl(pid, tid, t["name"], t["sort_index"])
        sink = PftraceEmitter(Job([], self.base, self.fmt, {}, titles, sequence_id=job))
        sink.add(events, mapper, Outcome(job))  # type: ignore[arg-type]
        pieces, _ = sink.finish()
        for piece in pieces:
            write_any_piece(self.f, self.gz, piece)

    def close(self, procs: list[dict[str, Any]], threads: list[dict[str, Any]]) -> None:
        if self.json is not None:
            meta = chrome_json.metadata_events(
                [(p["trace_pid"], p["name"], p["sort_index"]) for p in procs],
                [(t["trace_pid"], t["trace_tid"], t["name"], t["sort_index"]) for t in threads],
            )
            self.json.close(meta)
        elif self.gz is not None:
            self.gz.close()


# ------------------------------------------------------------------------------------- rows
def _events(table: Any) -> tuple[list[Event], int]:
    """Rows → merge events (docs/FORMATS.md §3), keeping only flows whose both ends are here."""
    rows = table.to_pylist()
    starts: dict[int, int] = defaultdict(int)  # flow id -> events that send (s, t, X flow_out)
    ends: dict[int, int] = defaultdict(int)
    for r in rows:
        if r["flow_out_id"] is not None:
            starts[r["flow_out_id"]] += 1
        if r["flow_in_id"] is not None:
            ends[r["flow_in_id"]] += 1
    whole = {fid for fid in starts if ends.get(fid)}
    events = []
    links = 0
    per_flow: dict[int, int] = defaultdict(int)
    for r in rows:
        e = _event(r, whole)
        if e is None:
            continue
        events.append(e)
        for fid in {r["flow_out_id"], r["flow_in_id"]} & whole:
            per_flow[fid] += 1
    links = sum(n - 1 for n in per_flow.values() if n > 1)
    return events, links


def _event(r: dict[str, Any], whole: set[int]) -> Event | None:
    ph = r["ph"]
    e = Event(ph=ph, pid=r["trace_pid"], tid=r["trace_tid"], ts=r["ts_ns"])
    if r["name"] is not None:
        e.name = r["name"]
    if r["category"] is not None:
        e.cat = r["category"]
    if r["dur_ns"] is not None:
        e.dur = r["dur_ns"]
    out_id, in_id = r["flow_out_id"], r["flow_in_id"]
    if ph in _FLOW_PHASES:
        fid = out_id if out_id is not None else in_id
        if fid not in whole:
            return None  # half a flow: its other end is outside the view
        e.id = fid
    elif ph in ("b", "e", "n") and r["async_id"] is not None:
        e.id = r["async_id"]
    elif out_id is not None or in_id is not None:  # a slice's v2 binding
        bind = out_id if out_id is not None else in_id
        if bind in whole:
            e.bind_id = bind
            if out_id is not None:
                e.flow_out = True
            if in_id is not None:
                e.flow_in = True
    if r["args"] is not None:
        e.args = msgspec.Raw(r["args"].encode())
    if r["extra"] is not None:
        _extra(e, orjson.loads(r["extra"]))
    return e


def _extra(e: Event, fields: dict[str, Any]) -> None:
    for name, value in fields.items():
        if name == "id2":
            e.id2 = msgspec.Raw(orjson.dumps(value))
        elif name in ("id", "bind_id", "bp", "s", "scope", "cname"):
            setattr(e, name, value)
