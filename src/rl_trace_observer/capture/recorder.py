"""The per-process recorder: event log + process record, lazily created from ``RL_TRACE_*``.

Everything here runs inside training processes, so every public method swallows its own failures
(one warning per kind of problem per process) and never blocks on anything but a short lock and
one ``write`` system call. The process record is rewritten atomically whenever identity,
artifacts or clock data change, at most every ``RL_TRACE_RECORD_INTERVAL_S`` for event counts,
and at exit.
"""

from __future__ import annotations

import atexit
import copy
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import config as config_mod
from ..common.atomic import write_atomic
from ..common.encoding import dumps_line, dumps_pretty
from . import identity
from .clock import SYSTEM_CLOCK, Clock, snapshot
from .event_log import EventLog

_dumps_line = dumps_line  # module-global lookup is cheaper than attribute access on the hot path

log = logging.getLogger("rl_trace_observer")

PROCESS_RECORD_SCHEMA = "rl-trace-process/1"
EVENT_LOG_NAME = "rl-insight-{host}-pid-{pid}.chrome.jsonl"
PROCESS_RECORD_NAME = "rl-trace-process-{host}-pid-{pid}.json"
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
        self._next_record_mono = 0
        log_name = EVENT_LOG_NAME.format(host=self.host, pid=self.pid)
        self.record_path = self.output_dir / PROCESS_RECORD_NAME.format(host=self.host, pid=self.pid)
        self.events = EventLog(
            self.output_dir / log_name,
            lambda msg: self.warn_once("event_log", msg),
            on_tick=self._refresh_record_if_due,
        )
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
        self.write_record()

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
                self.events.write_line(dumps_line(meta))
        if persist:
            self.write_record()  # rare (once per lane), and a killed Ray worker never reaches atexit
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
        """A scalar metric sample, kept as a Chrome counter event (a counter track after merge)."""
        ts_ns = self.clock.wall_ns() if wall_ns is None else wall_ns
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
        self.events.write_line(line)

    def _refresh_record_if_due(self) -> None:
        """Called by the event log's flusher thread: event counts reach the record off the hot path."""
        if time.monotonic_ns() > self._next_record_mono:
            self.write_record()

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
            self.write_record()

    def clock_snapshot(self, reason: str, **extra: Any) -> dict[str, Any]:
        snap = snapshot(self.clock, reason, **extra)
        with self._lock:
            self._append_snapshot(snap)
        self.write_record()
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
        self.write_record()

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
        p = Path(path)
        try:
            rel = os.path.relpath(p.resolve(), self.output_dir.resolve())
        except ValueError:
            rel = str(p)
        if rel.startswith(".."):
            extra.setdefault("outside_output_dir", True)
            rel = str(p.resolve())
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
            return copy.deepcopy(self._record)

    def write_record(self) -> None:
        try:
            self.events.flush()  # the counts below then describe what is on disk
            with self._lock:
                self._refresh_identity()
                self._record["events"] = {"written": self.events.written, "dropped": self.events.dropped}
                # A fresh snapshot on every rewrite: the last one tells the merger how the clocks
                # related when the process was last seen alive.
                self._record["clock_at_update"] = snapshot(self.clock, "update")
                self._record["updated_wall_ns"] = self._record["clock_at_update"]["wall_ns"]
                data = dumps_pretty(self._record)
                self._next_record_mono = time.monotonic_ns() + int(self.config.record_interval_s * 1e9)
                self.output_dir.mkdir(parents=True, exist_ok=True)
                write_atomic(self.record_path, data)
        except Exception as exc:
            self.warn_once("record", f"cannot write process record {self.record_path}: {exc}")

    def close(self) -> None:
        self.write_record()
        self.events.close()


# --------------------------------------------------------------- process singleton
_RECORDER: Recorder | None = None
_CHECKED = False
_SINGLETON_LOCK = threading.Lock()
_FORK_HOOK_INSTALLED = False


def _after_fork_in_child() -> None:
    global _RECORDER, _CHECKED, _SINGLETON_LOCK
    _SINGLETON_LOCK = threading.Lock()
    if _RECORDER is not None:
        _RECORDER.events.forget_after_fork()
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
    for problem in cfg.problems:
        log.warning("[rl-trace-observer] pid %s: %s", os.getpid(), problem)
    with _SINGLETON_LOCK:
        old = _RECORDER
        _RECORDER, _CHECKED = (Recorder(cfg, clock, host=host) if cfg.capture_enabled else None), True
        if not _FORK_HOOK_INSTALLED:
            os.register_at_fork(after_in_child=_after_fork_in_child)
            atexit.register(_close_at_exit)
            _FORK_HOOK_INSTALLED = True
    if old is not None and old is not _RECORDER:
        old.close()
    return _RECORDER


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


def _close_at_exit() -> None:
    rec = _RECORDER
    if rec is not None and rec.pid == os.getpid():
        rec.close()
