"""The sampler process's loop: targets, GPUs and the host, every interval, until it should leave.

Scrapes run on a small thread pool so that a slow target never delays the others or the GPU and
host samples; a target still in flight at its next tick is skipped, not queued. Everything is
written by this thread alone (:class:`~.wire.SampleWriter`), through the capture writer.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from . import node
from .gpu import Gpus
from .host import Host
from .lifetime import Lifetime
from .scrape import ScrapeResult, Target
from .sink import LineSink
from .wire import SCHEMA, SampleWriter, named

log = logging.getLogger("rl_trace_observer")

STATS_EVERY_S = 10.0
USERS_EVERY_S = 5.0  # how often the processes on each GPU are looked up
MAX_WORKERS = 16


def _parser_missing() -> str | None:
    """Why targets cannot be read (prometheus_client missing), else None: noted once, in the meta line,
    instead of every target failing every scrape."""
    try:
        import prometheus_client.parser  # noqa: F401
    except ImportError:
        log.warning(
            "[rl-trace-observer] sampler: prometheus_client is not installed; targets are not scraped"
        )
        return "prometheus_client is not installed (pip install 'rl-trace-observer[metrics]')"
    return None


def _load_targets(folder: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return out
    import orjson

    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            items = orjson.loads((folder / name).read_bytes())
        except (OSError, ValueError):
            continue
        if isinstance(items, list):
            out.extend(item for item in items if isinstance(item, dict) and item.get("address"))
    return out


class Sampler:
    """One node's sampler; ``nvml``/``psutil`` are the modules to use (stand-ins in tests)."""

    def __init__(
        self,
        config: Any,
        output_dir: Path,
        sink: LineSink,
        *,
        host: str,
        nvml: Any | None = None,
        psutil: Any | None = None,
    ) -> None:
        self.config = config
        self.folder = node.node_dir(output_dir)
        self.writer = SampleWriter(sink)
        self.host = host
        self.targets: dict[tuple[str, str], tuple[int, Target]] = {}
        self.in_flight: dict[int, Future[ScrapeResult]] = {}
        self._targets_mtime: int | None = None
        self._pool = ThreadPoolExecutor(max_workers=MAX_WORKERS, thread_name_prefix="rl-trace-scrape")
        self._cpu0 = time.process_time()
        self._next_stats = time.monotonic() + STATS_EVERY_S
        self._next_users = 0.0
        self._users: dict[int, list[tuple[int, int]]] = {}
        self._located: set[int] = set()
        self._flags_mtime: int | None = None
        self._profiling = False
        self.scrapes = self.failures = 0
        self.gpus = Gpus(nvml)
        self.host_metrics = Host(psutil)
        self.targets_reason = _parser_missing()
        self.wake = threading.Event()  # set to cut a sleep short (an ending signal: process.py)
        self._start(output_dir)

    def _start(self, output_dir: Path) -> None:
        cfg = self.config
        self.writer.header(
            {
                "k": "meta",
                "schema": SCHEMA,
                "host": self.host,
                "pid": os.getpid(),
                "output_dir": str(output_dir),
                "interval_s": cfg.metrics_interval_s,
                "profiled_interval_s": cfg.metrics_profiled_interval_s,
                "timeout_s": cfg.metrics_timeout_s,
                "wall_ns": time.time_ns(),
                "monotonic_ns": time.monotonic_ns(),
                "gpus": {"found": len(self.gpus.devices), "reason": self.gpus.reason},
                "host_metrics": {
                    "available": self.host_metrics.available,
                    "reason": self.host_metrics.reason,
                },
                "targets": {"scraped": self.targets_reason is None, "reason": self.targets_reason},
            }
        )
        self.gpu_src = {
            d.index: self.writer.source("gpu", host=self.host, **d.info) for d in self.gpus.devices
        }
        self.host_src = (
            self.writer.source("host", host=self.host, **self.host_metrics.info)
            if self.host_metrics.available
            else None
        )
        for job, address in cfg.metrics_targets:
            self._add({"job": job, "address": address, "labels": {}, "via": "RL_TRACE_METRICS_TARGETS"})

    # -------------------------------------------------------------------- targets
    def _add(self, spec: dict[str, Any]) -> None:
        key = (str(spec.get("job") or ""), str(spec["address"]))
        if key in self.targets:
            return
        try:
            target = Target(spec, self.config.metrics_timeout_s, self.config.metrics_retry_max_s)
        except ValueError as exc:
            log.warning("[rl-trace-observer] sampler: ignoring target %r: %s", spec.get("address"), exc)
            return
        fields = {k: v for k, v in spec.items() if k not in ("k", "src", "kind", "t")}
        src = self.writer.source("prometheus", **fields)
        self.targets[key] = (src, target)

    def refresh_targets(self) -> None:
        folder = self.folder / node.TARGETS
        try:
            mtime = folder.stat().st_mtime_ns
        except OSError:
            return
        if mtime == self._targets_mtime:
            return
        self._targets_mtime = mtime
        for spec in _load_targets(folder):
            self._add(spec)

    # ---------------------------------------------------------------------- ticks
    def tick(self, interval_s: float) -> None:
        """Harvest finished scrapes, start the due ones, sample GPUs and host."""
        now = time.monotonic()
        self.refresh_targets()
        self._harvest(now, interval_s)
        for src, target in self.targets.values() if self.targets_reason is None else ():
            if src not in self.in_flight and target.due(now):
                self.in_flight[src] = self._pool.submit(target.scrape)
        t0w, t0 = time.time_ns(), time.monotonic_ns()
        if self.gpus.devices:
            for index, values in self.gpus.sample().items():
                self._write_named(self.gpu_src[index], t0w, time.monotonic_ns() - t0, values, "gauge")
        if self.host_src is not None:
            t1w, t1 = time.time_ns(), time.monotonic_ns()
            values = self.host_metrics.sample()
            self._write_named(self.host_src, t1w, time.monotonic_ns() - t1, values, None)
        if self.gpus.devices and now >= self._next_users:
            self._next_users = now + USERS_EVERY_S
            self._gpu_users()
        if now >= self._next_stats:
            self._next_stats = now + STATS_EVERY_S
            self.stats()

    def _gpu_users(self) -> None:
        """Who uses each GPU (pid, CUDA index), written when it changes: where its tracks go."""
        for index, users in self.gpus.users().items():
            if self._users.get(index) != users:
                self._users[index] = users
                self.writer.event(
                    "gpu_users", self.gpu_src[index], time.time_ns(), placement=True, users=users
                )

    def _locate(self, fresh: list[tuple[int, Target]]) -> None:
        """Once per target that answered: the pid serving it, when it is on this node (the merger
        then puts its tracks under that process). One scan of the node's sockets for all of them."""
        self._located.update(src for src, _ in fresh)
        local = [(src, t) for src, t in fresh if is_local(t.host)]
        if not local:
            return
        listeners = listening_pids()
        for src, target in local:
            pid = listeners.get(target.port)
            if pid is not None:
                self.writer.event("server", src, time.time_ns(), placement=True, pid=pid, host=self.host)

    def _write_named(
        self, src: int, t_ns: int, dur_ns: int, values: dict[str, float], kind: str | None
    ) -> None:
        rows = [
            (named(name, kind or ("counter" if name.endswith("_total") else "gauge")), value)
            for name, value in values.items()
        ]
        self.writer.sample(src, t_ns + dur_ns // 2, dur_ns, rows)

    def _harvest(self, now: float, interval_s: float, wait_s: float = 0.0) -> None:
        by_src = {src: target for src, target in self.targets.values()}
        fresh: list[tuple[int, Target]] = []
        for src, future in list(self.in_flight.items()):
            if not future.done():
                if wait_s <= 0:
                    continue
                try:
                    future.result(timeout=wait_s)
                except Exception:
                    continue
            del self.in_flight[src]
            try:
                result = future.result()
            except Exception as exc:  # scrape() catches everything; belt and braces
                result = ScrapeResult(False, time.time_ns(), 0, error=str(exc))
            self.scrapes += 1
            target = by_src[src]
            change = target.after(result, now, interval_s)
            if result.ok:
                self.writer.sample(src, result.t_ns, result.dur_ns, result.samples)
                if src not in self._located:
                    fresh.append((src, target))
            else:
                self.failures += 1
            if change == "down":
                self.writer.event("down", src, result.t_ns, error=result.error, address=target.address)
                log.warning(
                    "[rl-trace-observer] sampler: %s (%s) does not answer: %s; retrying with back-off",
                    target.address,
                    target.spec.get("job"),
                    result.error,
                )
            elif change == "up":
                self.writer.event("up", src, result.t_ns, address=target.address)
        if fresh:
            self._locate(fresh)

    def stats(self) -> None:
        self.writer.line(
            {
                "k": "stats",
                "t": time.time_ns(),
                "cpu_s": round(time.process_time() - self._cpu0, 6),
                "scrapes": self.scrapes,
                "failures": self.failures,
                "samples": self.writer.samples,
                "targets": len(self.targets),
                "gpus": len(self.gpus.devices),
            }
        )

    def close(self) -> None:
        self._harvest(time.monotonic(), self.config.metrics_interval_s, wait_s=self.config.metrics_timeout_s)
        self.stats()
        self._pool.shutdown(wait=False, cancel_futures=True)
        for _, target in self.targets.values():
            target.close()
        self.gpus.close()


def _local_addresses() -> set[str]:
    addrs = {"127.0.0.1", "::1", "localhost", "0.0.0.0", "::"}
    try:
        import psutil

        for entries in psutil.net_if_addrs().values():
            addrs.update(e.address.split("%")[0] for e in entries)
    except Exception:
        pass
    return addrs


def is_local(host: str) -> bool:
    return host.startswith("127.") or host in _local_addresses()


def listening_pids() -> dict[int, int]:
    """Port → pid of every listening TCP socket on this node (psutil; empty when it cannot tell).

    One scan costs tens of ms on a busy node (every process's descriptors): done once per batch of
    new targets, never per scrape."""
    out: dict[int, int] = {}
    try:
        import psutil

        for conn in psutil.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.pid:
                out.setdefault(int(conn.laddr.port), int(conn.pid))
    except Exception:
        return {}
    return out


def profiling(sampler: Sampler) -> bool:
    """Whether a profiled step runs on this node: one ``stat`` while nothing changed and none runs
    (the folder's mtime moves when a flag comes or goes), the full look only otherwise."""
    try:
        mtime = (sampler.folder / node.PROFILING).stat().st_mtime_ns
    except OSError:
        return False
    if mtime == sampler._flags_mtime and not sampler._profiling:
        return False
    sampler._flags_mtime, sampler._profiling = mtime, node.profiling_now(sampler.folder)
    return sampler._profiling


def interval_now(sampler: Sampler) -> float:
    cfg = sampler.config
    return float(cfg.metrics_profiled_interval_s if profiling(sampler) else cfg.metrics_interval_s)


def run(sampler: Sampler, lifetime: Lifetime, *, max_s: float | None = None) -> str:
    """Tick until ``lifetime`` gives a reason to leave (or ``max_s`` passed: benchmarks, tests);
    the reason is returned and written as the file's ``stop`` line."""
    t_end = None if max_s is None else time.monotonic() + max_s
    next_tick = time.monotonic()
    while True:
        interval = interval_now(sampler)
        sampler.tick(interval)
        reason = lifetime.reason()
        if reason is None and t_end is not None and time.monotonic() >= t_end:
            reason = f"ran for {max_s:g} s as asked"
        if reason is not None:
            sampler.writer.line({"k": "stop", "t": time.time_ns(), "reason": reason})
            return reason
        next_tick += interval
        now = time.monotonic()
        if next_tick < now:  # late (a starved machine): skip the missed ticks, never burst
            next_tick = now + interval - (now - next_tick) % interval
        next_tick = _sleep_until(sampler, next_tick, interval)


def _sleep_until(sampler: Sampler, deadline: float, interval: float) -> float:
    """Sleep until ``deadline``, in slices of the profiled interval when that is shorter: a profiled
    step that starts mid-interval is sampled from its first slice on. Returns the next tick's time."""
    fast = sampler.config.metrics_profiled_interval_s
    if fast >= interval:
        if sampler.wake.wait(max(0.0, deadline - time.monotonic())):
            return time.monotonic()
        return deadline
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return deadline
        if sampler.wake.wait(min(left, fast)) or profiling(sampler):
            return time.monotonic()
