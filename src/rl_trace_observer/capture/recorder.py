"""The per-process recorder: event log + process record, lazily created from ``RL_TRACE_*``.

Everything here runs inside training processes, so every public method swallows its own failures
(one warning per kind of problem per process) and never waits on the output disk: events and
record rewrites are handed to this process's writer (:mod:`.streams`) — a deque append — and
written by a separate drain process. The process record is rewritten (by the writer, with the
event counts it knows to be on disk) whenever identity, artifacts or clock data change, at most
every ``RL_TRACE_RECORD_INTERVAL_S`` for event counts, and at exit.
"""

from __future__ import annotations

import copy
import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .. import config as config_mod
from ..common.encoding import dumps_line
from . import identity
from .clock import SYSTEM_CLOCK, Clock, snapshot
from .file_names import EVENT_LOG_NAME, PROCESS_RECORD_NAME
from .streams import DEFAULT_FLUSH_S, open_stream

_dumps_line = dumps_line  # module-global lookup is cheaper than attribute access on the hot path

log = logging.getLogger("rl_trace_observer")

PROCESS_RECORD_SCHEMA = "rl-trace-process/1"
SOURCE_LABEL = "RL-Insight"
MAX_CLOCK_SNAPSHOTS = 512  # a long run's step boundaries must not grow the record without bound


def expected_event_log(record: Mapping[str, Any]) -> str | None:
    """The event log a process record promises to exist, or ``None`` when it promises none.

    Every record names its event log, but the file is created by the first event only: a process
    that never recorded one (a clock responder, an idle worker) names a file that was never
    written. ``events == {"written": 0, "dropped": 0}`` says so; a record without usable counts,
    or one whose events were dropped (the log could not be opened), still expects it. Collectors
    and mergers ask here instead of reporting such a log as missing.
    """
    name = record.get("event_log")
    if not isinstance(name, str) or not name:
        return None
    events = record.get("events")
    if isinstance(events, Mapping) and all(
        type(events.get(k)) is int and events.get(k) == 0 for k in ("written", "dropped")
    ):
        return None
    return name


class Recorder:
    """Writes this process's events and keeps its process record current."""

    def __init__(
        self,
        config: config_mod.Config,
        clock: Clock = SYSTEM_CLOCK,
        *,
        host: str | None = None,
        pid: int | None = None,
    ) -> None:
        assert config.output_dir is not None, "Recorder needs RL_TRACE_OUTPUT_DIR"
        self.config = config
        self.clock = clock
        self.host = host or identity.hostname()
        self.pid = pid if pid is not None else os.getpid()
        self.output_dir: Path = config.output_dir
        self._warned: set[str] = set()
        self._lock = threading.RLock()
        self._lanes: dict[str, int] = {}
        self._totals: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        log_name = EVENT_LOG_NAME.format(host=self.host, pid=self.pid)
        self.record_path = self.output_dir / PROCESS_RECORD_NAME.format(host=self.host, pid=self.pid)
        self._record: dict[str, Any] = {
            "schema": PROCESS_RECORD_SCHEMA,
            "hostname": self.host,
            "pid": self.pid,
            "ppid": os.getppid(),
            "argv": list(sys.argv[:8]),
            "run_id": config.run_id,
            "run_id_source": "RL_TRACE_RUN_ID" if config.run_id else None,
            "role": config.role,
            "rank": None,
            "world_size": None,
            "local_rank": None,
            "ray": {},
            "versions": identity.versions(),
            "event_log": log_name,
            "clock_snapshots": [snapshot(clock, "start")],
            "clock_offsets": [],
            "artifacts": [],
            "lanes": {},
            "events": {"written": 0, "dropped": 0},
        }
        self._refresh_identity()
        self.events = open_stream(
            self.output_dir / log_name,
            record=self.record_path,
            record_source=self._record_bytes,
            record_interval_s=config.record_interval_s,
            on_problem=self.warn_once,
            config=config,
        )

    # ----------------------------------------------------------------- problems
    def warn_once(self, key: str, message: str) -> None:
        """Log the first problem of each kind at WARNING; training never sees an exception."""
        if key in self._warned:
            return
        self._warned.add(key)
        log.warning("[rl-trace-observer] pid %s: %s", self.pid, message)

    # ------------------------------------------------------------------- events
    def _tid_for(self, lane: str, persist: bool = True) -> int:
        tid = self._lanes.get(lane)
        if tid is not None:
            return tid
        with self._lock:
            tid = self._lanes.get(lane)
            if tid is None:
                tid = len(self._lanes) + 1
                self._lanes[lane] = tid
                if persist:
                    self._record["lanes"][lane] = tid
                meta = {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": self.pid,
                    "tid": tid,
                    "args": {"name": f"{SOURCE_LABEL} · {lane}", "lane": lane},
                }
                self.events.append_header(dumps_line(meta))  # heads any later file of this log too
        if persist:
            self.events.record_changed()  # rare (once per lane), and a killed Ray worker never reaches atexit
        return tid

    def lane_tid(self, lane: str, *, persist: bool = True) -> int:
        """The track (tid) of ``lane``, named in the event log on first use.

        ``persist=False`` keeps the lane out of the process record and skips the record rewrite:
        request slot lanes (:mod:`.requests`) come by the hundred, and their name line in the event
        log is all the merger needs.
        """
        return self._lanes.get(lane) or self._tid_for(lane, persist)

    def write_event(self, event: dict[str, Any]) -> None:
        """Append one already-built Chrome event (the capture layer's own event kinds)."""
        self._write(event)

    def span(
        self,
        name: str,
        start_ns: int,
        end_ns: int,
        *,
        lane: str | None = None,
        cat: str = "rl_insight",
        args: dict[str, Any] | None = None,
    ) -> None:
        """One complete span; ``start_ns``/``end_ns`` are wall-clock epoch ns and are kept exactly."""
        lane = lane if lane is not None else str(self.pid)
        dur_ns = end_ns - start_ns
        event: dict[str, Any] = {
            "ph": "X",
            "cat": cat,
            "name": name,
            "pid": self.pid,
            "tid": self._tid_for(lane),
            "ts": start_ns / 1000,
            "dur": max(dur_ns, 0) / 1000,
            "ts_ns": start_ns,
            "dur_ns": dur_ns,
            "args": args or {},
        }
        self._write(event)

    def rl_insight_span(self, name: str, start_ns: int, end_ns: int, attributes: dict[str, Any]) -> None:
        """The hot path for RL-Insight trace events: one dict, one encode, one buffered append.

        ``attributes`` are kept verbatim as ``args`` (``state_lane_id``, ``monitor.trace_segment``,
        labels); the lane picks the track. Flattened on purpose: each Python call layer costs ~0.1 µs
        and this runs for every span of every training process.
        """
        lane = attributes.get("state_lane_id")
        lane = str(self.pid) if lane is None else str(lane)
        tid = self._lanes.get(lane) or self._tid_for(lane)
        dur_ns = end_ns - start_ns
        event = {
            "ph": "X",
            "cat": "rl_insight",
            "name": name,
            "pid": self.pid,
            "tid": tid,
            "ts": start_ns / 1000,
            "dur": (dur_ns if dur_ns > 0 else 0) / 1000,
            "ts_ns": start_ns,
            "dur_ns": dur_ns,
            "args": attributes,
        }
        self._write(event)

    def counter(
        self,
        name: str,
        value: float,
        *,
        wall_ns: int | None = None,
        kind: str = "gauge",
        labels: dict[str, Any] | None = None,
    ) -> None:
        """A scalar metric sample, kept as a Chrome counter event (a counter track after merge).

        ``kind="counter"`` samples are increments (RL-Insight's ``metric_count(name, amount)``): the
        track shows their running total per ``(name, labels)``, as Prometheus reads a counter.
        """
        ts_ns = self.clock.wall_ns() if wall_ns is None else wall_ns
        if kind == "counter":
            key = (name, tuple(sorted((str(k), str(v)) for k, v in (labels or {}).items())))
            with self._lock:
                value = self._totals[key] = self._totals.get(key, 0.0) + value
        event: dict[str, Any] = {
            "ph": "C",
            "cat": f"rl_insight.{kind}",
            "name": name,
            "pid": self.pid,
            "tid": 0,
            "ts": ts_ns / 1000,
            "ts_ns": ts_ns,
            "args": {"value": value},
            "labels": labels or {},
        }
        self._write(event)

    def _write(self, event: dict[str, Any]) -> None:
        try:
            line = _dumps_line(event)
        except Exception as exc:  # an attribute we cannot encode must not lose the span
            self.warn_once("encode", f"cannot encode event {event.get('name')!r}: {exc}")
            event["args"] = {k: repr(v) for k, v in (event.get("args") or {}).items()}
            event.pop("labels", None)
            line = dumps_line(event)
        self.events.append(line)

    # ------------------------------------------------------------------- record
    def _refresh_identity(self) -> None:
        rec = self._record
        dist = identity.distributed()
        for key, value in dist.items():
            if value is not None:
                rec[key] = value
        ray = identity.ray_ids()
        if ray:
            rec["ray"].update({k: v for k, v in ray.items() if v is not None})
        if rec["run_id_source"] in (None, "default") and ray.get("job_id"):
            rec["run_id"], rec["run_id_source"] = f"ray-{ray['job_id']}", "ray_job_id"
        if rec["run_id"] is None:
            rec["run_id"], rec["run_id_source"] = "local", "default"

    def update_identity(self, **fields: Any) -> None:
        """Integrations that know better (role, rank, actor name) set it here."""
        with self._lock:
            changed = any(self._record.get(k) != v for k, v in fields.items())
            self._record.update(fields)
        if changed:
            self.events.record_changed()

    def clock_snapshot(self, reason: str, **extra: Any) -> dict[str, Any]:
        snap = snapshot(self.clock, reason, **extra)
        with self._lock:
            self._append_snapshot(snap)
        self.events.record_changed()
        return snap

    def _append_snapshot(self, snap: dict[str, Any]) -> None:
        snaps = self._record["clock_snapshots"]
        snaps.append(snap)
        if len(snaps) > MAX_CLOCK_SNAPSHOTS:
            del snaps[1 : len(snaps) - MAX_CLOCK_SNAPSHOTS + 1]  # keep "start" and the newest

    def add_clock_offset(self, measurement: dict[str, Any], *, snapshot_reason: str | None = None) -> None:
        """Store one measured offset against the reference clock (see integrations.ray.clock_sync).

        ``snapshot_reason`` also appends a clock snapshot, in the same single record rewrite.
        """
        with self._lock:
            if snapshot_reason is not None:
                self._append_snapshot(snapshot(self.clock, snapshot_reason, step=measurement.get("step")))
            self._record["clock_offsets"].append(measurement)
        self.events.record_changed()

    def register_artifact(
        self,
        path: str | os.PathLike[str],
        kind: str,
        *,
        step: int | None = None,
        role: str | None = None,
        rank: int | None = None,
        **extra: Any,
    ) -> None:
        """Tell the merger and the collector that this process wrote ``path``."""
        # Lexical paths only: resolving symlinks would stat the output disk, which may hang.
        absolute = os.path.abspath(path)
        rel = os.path.relpath(absolute, os.path.abspath(self.output_dir))
        if rel.startswith(".."):
            extra.setdefault("outside_output_dir", True)
            rel = absolute
        entry = {"path": rel, "kind": kind, "step": step, "role": role, "rank": rank, **extra}
        with self._lock:
            arts = self._record["artifacts"]
            if entry in arts:
                return
            arts.append(entry)
        self.clock_snapshot("artifact", path=rel)

    def record(self) -> dict[str, Any]:
        """A copy of the current process record (for tests and integrations)."""
        with self._lock:
            self._record["events"] = {"written": self.events.written, "dropped": self.events.dropped}
            return copy.deepcopy(self._record)

    def _record_bytes(self) -> bytes:
        """The record as JSON, built on the pump thread; the writer fills in ``events`` itself."""
        with self._lock:
            self._refresh_identity()
            # A fresh snapshot on every rewrite: the last one tells the merger how the clocks
            # related when the process was last seen alive.
            self._record["clock_at_update"] = snapshot(self.clock, "update")
            self._record["updated_wall_ns"] = self._record["clock_at_update"]["wall_ns"]
            return dumps_line(self._record)

    def write_record(self) -> None:
        """Ask for the process record to be rewritten (by the writer, within ~2 ms; never waits)."""
        self.events.record_changed()

    def flush(self, timeout_s: float = DEFAULT_FLUSH_S) -> bool:
        """Rewrite the record and wait until it and every event so far are on disk (tests, tools)."""
        self.events.record_changed()
        return self.events.flush(timeout_s)

    def close(self, timeout_s: float = DEFAULT_FLUSH_S) -> bool:
        """Final record and close; waits at most ``timeout_s`` for the writer to confirm."""
        return self.events.close(timeout_s)


# --------------------------------------------------------------- process singleton
_RECORDER: Recorder | None = None
_CHECKED = False
_SINGLETON_LOCK = threading.Lock()
_FORK_HOOK_INSTALLED = False


def _after_fork_in_child() -> None:
    global _RECORDER, _CHECKED, _SINGLETON_LOCK
    _SINGLETON_LOCK = threading.Lock()  # the parent's streams are dropped by streams' own fork hook
    _RECORDER, _CHECKED = None, False  # the child gets its own files under its own pid on first use


def configure(
    config: config_mod.Config | None = None, clock: Clock = SYSTEM_CLOCK, *, host: str | None = None
) -> Recorder | None:
    """Create this process's recorder now (``None`` when capture is off); replaces an earlier one.

    ``clock`` and ``host`` exist for tests that play several hosts on one machine (a shifted clock
    per simulated host); in production both are left out.
    """
    global _RECORDER, _CHECKED, _FORK_HOOK_INSTALLED
    cfg = config if config is not None else config_mod.load()
    config_mod.warn_problems(cfg)
    with _SINGLETON_LOCK:
        old, _RECORDER = _RECORDER, None
        if old is not None:  # first: its final record must not overwrite the new one's
            old.close()
        _RECORDER, _CHECKED = (Recorder(cfg, clock, host=host) if cfg.capture_enabled else None), True
        if not _FORK_HOOK_INSTALLED:
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _FORK_HOOK_INSTALLED = True
        rec = _RECORDER
    if rec is not None:
        for hook in _AFTER_CONFIGURE:
            try:
                hook(cfg, rec)
            except Exception as exc:
                rec.warn_once(f"hook:{hook.__name__}", f"{hook.__name__} failed: {exc}")
    return rec  # closed at exit by the writer's own exit hook (streams)


# Called with every new recorder, never on a hot path; they must not wait. The one user: the node's
# metric sampler (``sampler/__init__.py`` registers its join: this process becomes a member).
_AFTER_CONFIGURE: list[Callable[[config_mod.Config, Recorder], None]] = []


def after_configure(hook: Callable[[config_mod.Config, Recorder], None]) -> None:
    """Run ``hook(config, recorder)`` whenever a recorder is created (idempotent per hook)."""
    if hook not in _AFTER_CONFIGURE:
        _AFTER_CONFIGURE.append(hook)


def get_recorder() -> Recorder | None:
    """The process recorder, created from the environment on first use; cheap on the hot path."""
    global _CHECKED
    if _RECORDER is not None or _CHECKED:
        return _RECORDER
    try:
        return configure()
    except Exception as exc:  # never let set-up break the caller
        _CHECKED = True
        log.warning("[rl-trace-observer] pid %s: capture disabled: %s", os.getpid(), exc)
        return None


def reset() -> None:
    """Forget the recorder (tests; or to re-read the environment)."""
    global _RECORDER, _CHECKED
    if _RECORDER is not None:
        _RECORDER.close()
    _RECORDER, _CHECKED = None, False
