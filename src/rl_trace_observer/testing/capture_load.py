"""A training loop for fault tests: ``python -m rl_trace_observer.testing.capture_load --rate 5000``.

Emits RL-Insight spans through the real ``rl_insight`` API and our backend at a steady rate (where
RL-Insight is not installed: the same recorder calls our backend makes, :class:`RecorderCalls`), on
one lane, each with a sequence number (``args.seq``), and times every call. It takes commands on
stdin (one per line) and answers on stdout (one JSON object per line), so a test or benchmark can
freeze, fill or remove the output disk between commands without this process touching that disk:

- ``window NAME``: later calls are timed under ``NAME``;
- ``specials NAME``: a second thread makes each other kind of observer call once and times it
  under ``NAME/<kind>`` (even while the loop's own thread is blocked): a span on a new lane, a
  step-boundary clock snapshot (what VERL's step hook does), an artifact registration, an
  identity update, a metric, a rollout request (client and server spans) and a weight-sync phase;
  a call still running shows ``pending_ms`` in reports;
- ``report``: answers ``{"windows": {...}, "lines": n, "seq": n, "drain": pid}``: per window the
  number of calls, p50/p99/p99.9/max in ms, calls over 1 ms, the slowest 1 % (``tail_ms``), the
  seconds it covered, the scheduler's figures for the main thread, the pump thread, the process and
  its drain (``sched``: CPU time, time runnable but waiting for a CPU, timeslices) and the pump's
  cycles (``pump``: count, wall and CPU time, the longest, the largest outbox); ``lines``: lines handed
  to the event log so far (spans, lane names, metrics), ``seq``: spans emitted;
- ``counts``: the writer's ``written``/``dropped`` after a flush (at most 2 s);
- ``exit``: stops, answers a last report, and exits normally (through the exit hooks).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any


def _stats(samples: list[int], seconds: float) -> dict[str, Any]:
    if not samples:
        return {"n": 0, "seconds": round(seconds, 3)}
    s = sorted(samples)

    def q(p: float) -> float:
        return round(s[min(len(s) - 1, int(len(s) * p))] / 1e6, 3)

    return {
        "n": len(s),
        "seconds": round(seconds, 3),
        "p50_ms": q(0.5),
        "p99_ms": q(0.99),
        "p999_ms": q(0.999),
        "max_ms": round(s[-1] / 1e6, 3),
        "over_1ms": len(s) - bisect.bisect_right(s, 1_000_000),
        # the worst 1 % (slowest first): enough to pool up to 10 windows' p99.9 exactly
        "tail_ms": [round(x / 1e6, 3) for x in s[: -max(1, len(s) // 100) - 1 : -1]],
    }


def pooled_q(windows: list[dict[str, Any]], p: float) -> float | None:
    """The ``p`` quantile (ms) of all calls of ``windows`` together, from each one's slowest 1 %:
    the same figure as one window holding all their calls, while the pooled tail is in those
    (up to 10 windows for p99.9); None beyond."""
    n = sum(w.get("n", 0) for w in windows)
    tail = sorted((x for w in windows for x in w.get("tail_ms", ())), reverse=True)
    rank = n - 1 - int(n * p)  # 0-based from the slowest, as _stats counts
    return tail[rank] if 0 <= rank < len(tail) else None


def _schedstat(path: str) -> tuple[int, int, int]:
    """(on-CPU ns, runnable-but-waiting ns, timeslices) of one task, from the scheduler."""
    try:
        run, wait, slices = open(path).read().split()[:3]  # noqa: SIM115 (tiny /proc read)
    except (OSError, ValueError):
        return (0, 0, 0)
    return int(run), int(wait), int(slices)


def _drain_schedstat(pid: int | None) -> tuple[int, int, int]:
    if pid is None:
        return (0, 0, 0)
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return (0, 0, 0)
    rows = [_schedstat(f"/proc/{pid}/task/{t}/schedstat") for t in tids]
    return sum(r[0] for r in rows), sum(r[1] for r in rows), sum(r[2] for r in rows)


class PumpMeter:
    """Times every pump cycle (wall and the pump thread's CPU) and its outbox, per window: whether
    the pump does more work, or holds the interpreter longer, while the disk is frozen. Wraps the
    pump's ``_cycle`` when this capture version has one (a ``--before`` checkout may not)."""

    def __init__(self, window: Any) -> None:
        self.window = window  # a callable: the loop's current window name
        self.by_window: dict[
            str, list[int]
        ] = {}  # name -> [cycles, wall ns, max wall ns, cpu ns, max outbox]
        try:
            from rl_trace_observer.capture import pump
        except ImportError:
            return
        inner = getattr(pump.Channel, "_cycle", None)
        if inner is None:
            return
        meter = self

        def cycle(channel: Any) -> None:
            t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
            try:
                inner(channel)
            finally:
                wall, cpu = time.perf_counter_ns() - t0, time.thread_time_ns() - c0
                row = meter.by_window.setdefault(meter.window(), [0, 0, 0, 0, 0])
                row[0] += 1
                row[1] += wall
                row[2] = max(row[2], wall)
                row[3] += cpu
                row[4] = max(row[4], len(getattr(channel, "_outbox", ())))

        setattr(pump.Channel, "_cycle", cycle)  # noqa: B010 (a test meter around a private method)

    def stats(self, name: str) -> dict[str, Any] | None:
        row = self.by_window.get(name)
        if row is None:
            return None
        n, wall, wmax, cpu, box = row
        return {
            "cycles": n,
            "wall_ms": round(wall / 1e6, 2),
            "max_cycle_ms": round(wmax / 1e6, 3),
            "cpu_ms": round(cpu / 1e6, 2),
            "max_outbox_kib": round(box / 1024, 1),
        }


class RecorderCalls:
    """Without RL-Insight (a light install: ``.[test,viztracer]``), the very recorder calls our
    backend makes for the two RL-Insight calls the loop uses, on the same lanes with the same
    attributes: what the fault runs test is the writer below them, which is the same either way."""

    def __init__(self) -> None:
        from rl_trace_observer.capture import get_recorder

        self._recorder = get_recorder

    @contextlib.contextmanager
    def trace_state(self, state_name: str, *, state_lane_id: str, **labels: Any) -> Iterator[None]:
        t0 = time.time_ns()
        try:
            yield
        finally:
            rec = self._recorder()
            if rec is not None:
                attrs = {**labels, "state_lane_id": state_lane_id, "monitor.trace_segment": "state_interval"}
                rec.rl_insight_span(state_name, t0, time.time_ns(), attrs)

    def metric_gauge(self, name: str, value: float, step: str | None = None) -> None:
        rec = self._recorder()
        if rec is not None:
            rec.counter(name, float(value), kind="gauge", labels={} if step is None else {"step": step})


def rl_insight_api() -> Any:
    """The real ``rl_insight`` with our backend installed, else :class:`RecorderCalls`."""
    try:
        import rl_insight
    except ImportError:
        return RecorderCalls()
    from rl_trace_observer.integrations.rl_insight import install

    assert install(), "our RL-Insight backend did not install"
    rl_insight.init()
    return rl_insight


class Loop:
    def __init__(self, rate: float) -> None:
        self.rl_insight = rl_insight_api()
        self.period = 1.0 / rate
        self.commands: queue.Queue[str] = queue.Queue()
        self.windows: dict[str, list[int]] = {"start": []}
        self.spans: dict[str, tuple[float, float]] = {"start": (time.monotonic(), time.monotonic())}
        self.window = "start"
        self.pending: dict[str, int] = {}  # calls still running: when they began
        self.seq = 0
        self.lanes = 0
        self.lines = self._count_lines()
        self.meter = PumpMeter(lambda: self.window)
        self.sched: dict[str, dict[str, Any]] = {}  # closed windows: scheduler figures per thread
        self._sched0 = self._sched_now()

    def _drain_pid(self) -> int | None:
        from rl_trace_observer.capture import get_recorder

        rec = get_recorder()
        channel = getattr(rec.events, "_channel", None) if rec is not None else None
        return getattr(channel, "drain_pid", None)

    def _sched_now(self) -> dict[str, tuple[int, int, int]]:
        """Scheduler counters now: this (main) thread, the pump thread, the whole process, the drain."""
        rows = {"main": _schedstat(f"/proc/self/task/{threading.get_native_id()}/schedstat")}
        pump = next((t for t in threading.enumerate() if t.name == "rl-trace-pump"), None)
        if pump is not None and pump.native_id is not None:
            rows["pump"] = _schedstat(f"/proc/self/task/{pump.native_id}/schedstat")
        rows["process"] = _drain_schedstat(os.getpid())
        rows["drain"] = _drain_schedstat(self._drain_pid())
        return rows

    def _sched_since(self, then: dict[str, tuple[int, int, int]]) -> dict[str, Any]:
        now = self._sched_now()
        out = {}
        for key, (run, wait, slices) in now.items():
            r0, w0, s0 = then.get(key, (0, 0, 0))
            out[key] = {
                "cpu_ms": round((run - r0) / 1e6, 1),
                "wait_ms": round((wait - w0) / 1e6, 1),
                "slices": slices - s0,
            }
        return out

    @staticmethod
    def _count_lines() -> list[int]:
        """Count every line handed to the event log (wrapping its append on this instance: the
        same count whatever the capture version, so the file can be checked against it)."""
        from rl_trace_observer.capture import get_recorder

        rec = get_recorder()
        assert rec is not None, "RL_TRACE_OUTPUT_DIR is not set"
        count = [0]
        for name in ("append", "write_line"):
            inner = getattr(rec.events, name, None)
            if inner is None:
                continue

            def counted(line: bytes, inner: Any = inner) -> None:
                count[0] += 1
                inner(line)

            setattr(rec.events, name, counted)
        return count

    def _timed(self, window: str, fn: Any) -> None:
        t0 = time.perf_counter_ns()
        self.pending[window] = t0
        fn()
        self.windows.setdefault(window, []).append(time.perf_counter_ns() - t0)
        self.pending.pop(window, None)

    def span(self) -> None:
        with self.rl_insight.trace_state("actor_update", state_lane_id="rank_0", seq=self.seq):
            pass
        self.seq += 1

    def specials(self, name: str) -> None:
        try:
            self._specials(name)
        except Exception as exc:  # a report says so rather than a silent thread
            self.windows[f"{name}/error"] = []
            _say({"error": repr(exc)})

    def _specials(self, name: str) -> None:
        from rl_trace_observer.capture import get_recorder
        from rl_trace_observer.capture import requests as rq

        rec = get_recorder()
        assert rec is not None
        self.lanes += 1
        lane = f"lane_{self.lanes}"

        def new_lane() -> None:
            with self.rl_insight.trace_state("special", state_lane_id=lane):
                pass

        self._timed(f"{name}/new_lane", new_lane)
        self._timed(f"{name}/step_snapshot", lambda: rec.clock_snapshot("step_begin", step=self.lanes))
        path = rec.output_dir / f"artifact-{self.lanes}.json"
        self._timed(f"{name}/artifact", lambda: rec.register_artifact(path, "torch", step=self.lanes))
        self._timed(f"{name}/identity", lambda: rec.update_identity(role=f"actor{self.lanes}"))
        self._timed(f"{name}/metric", lambda: self.rl_insight.metric_gauge("loss", 0.5, step=str(self.lanes)))

        def request() -> None:
            c = rq.begin_client(f"r{self.lanes}", session="s")
            srv = rq.begin_server(f"r{self.lanes}", replica=0)
            rq.end_server(srv, status="ok")
            rq.end_client(c, status="ok")

        self._timed(f"{name}/request", request)

        def sync() -> None:
            with rq.weight_sync("update_weights", version=self.lanes):
                pass

        self._timed(f"{name}/weight_sync", sync)

    def report(self) -> dict[str, Any]:
        from rl_trace_observer.capture import get_recorder

        rec = get_recorder()
        channel = getattr(rec.events, "_channel", None) if rec is not None else None
        now = time.monotonic()
        out = {}
        for name, samples in list(self.windows.items()):
            start, end = self.spans.get(name, (now, now))
            out[name] = _stats(samples, (end if name != self.window else now) - start)
            sched = self.sched.get(name) if name != self.window else self._sched_since(self._sched0)
            if sched is not None:
                out[name]["sched"] = sched
            pump = self.meter.stats(name)
            if pump is not None:
                out[name]["pump"] = pump
        for name, t0 in list(self.pending.items()):
            if name != self.window:  # a special call that has not returned yet
                out.setdefault(name, {"n": 0})["pending_ms"] = round((time.perf_counter_ns() - t0) / 1e6, 1)
        return {
            "windows": out,
            "lines": self.lines[0],
            "seq": self.seq,
            "drain": getattr(channel, "drain_pid", None),
        }

    def counts(self) -> dict[str, Any]:
        """The writer's counts after waiting (briefly) for it to settle what it was handed."""
        from rl_trace_observer.capture import get_recorder

        rec = get_recorder()
        assert rec is not None
        try:
            rec.events.flush(2.0)
        except TypeError:  # a capture version whose flush takes no timeout
            rec.events.flush()
        return {"written": rec.events.written, "dropped": rec.events.dropped, "lines": self.lines[0]}

    def run(self) -> None:
        next_t = time.monotonic()
        while True:
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                cmd = None
            if cmd is not None:
                verb, _, arg = cmd.partition(" ")
                if verb == "window":
                    self.sched[self.window] = self._sched_since(self._sched0)
                    self._sched0 = self._sched_now()
                    now = time.monotonic()
                    self.spans[self.window] = (self.spans[self.window][0], now)
                    self.window, self.spans[arg] = arg, (now, now)
                elif verb == "report":
                    _say(self.report())
                elif verb == "counts":
                    _say(self.counts())
                elif verb == "exit":
                    _say(self.report())
                    return
            self._timed(self.window, self.span)
            next_t += self.period
            delay = next_t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            elif delay < -0.5:
                next_t = time.monotonic()  # far behind (a blocked call): do not burst to catch up


def _say(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=5000.0, help="spans per second")
    args = ap.parse_args()
    loop = Loop(args.rate)

    def read_commands() -> None:
        for line in sys.stdin:
            verb, _, arg = line.strip().partition(" ")
            if verb == "specials":  # on a second training thread, now: even while the loop waits
                threading.Thread(target=loop.specials, args=(arg,), daemon=True).start()
            else:
                loop.commands.put(line.strip())
        loop.commands.put("exit")

    threading.Thread(target=read_commands, daemon=True).start()
    _say({"ready": os.getpid()})
    loop.run()


if __name__ == "__main__":
    main()
