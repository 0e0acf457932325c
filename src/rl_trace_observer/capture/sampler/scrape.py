"""One Prometheus target: an HTTP GET of ``/metrics`` with a deadline, and back-off when it is dead.

A connection is kept open between scrapes when the server allows it (uvicorn does; prometheus_client's
own server closes it): a fresh TCP connection per scrape costs more than parsing the page. The
deadline covers connecting and the whole body, not just each ``recv``: a server that trickles its
page is cut off like one that never answers. A failing target is tried again after
``interval * 2**failures``, at most ``retry_max_s``; the caller notes the first failure and the
recovery, nothing in between.
"""

from __future__ import annotations

import http.client
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from .exposition import PageReader, Series

MAX_PAGE_BYTES = 32 << 20
ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"  # the classic text format, never protobuf/OpenMetrics


def split_address(address: str) -> tuple[str, int, str]:
    """``host:port``, ``[v6]:port`` or ``http://host:port/path`` → (host, port, path)."""
    text = address.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.hostname is None or parts.port is None:
        raise ValueError(f"not host:port: {address!r}")
    return parts.hostname, parts.port, (parts.path or "/metrics")


@dataclass
class ScrapeResult:
    ok: bool
    t_ns: int  # wall-clock midpoint of the request
    dur_ns: int
    samples: list[tuple[Series, float]] = field(default_factory=list)
    error: str | None = None
    unchanged: bool = False  # the page is byte-identical to the last one: nothing moved


class Target:
    """A registered target and what the sampler knows about it."""

    def __init__(self, spec: dict[str, Any], timeout_s: float, retry_max_s: float) -> None:
        self.spec = spec
        self.address = str(spec["address"])
        self.host, self.port, self.path = split_address(self.address)
        self.timeout_s = timeout_s
        self.retry_max_s = retry_max_s
        self.reader = PageReader()
        self.failures = 0
        self.next_try = 0.0  # monotonic seconds
        self.down = False
        self._last_page: str | None = None
        self._conn: http.client.HTTPConnection | None = None

    # ---------------------------------------------------------------- worker threads
    def scrape(self) -> ScrapeResult:
        t0_wall, t0 = time.time_ns(), time.monotonic_ns()
        unchanged = False
        try:
            text = self._get(time.monotonic() + self.timeout_s)
            unchanged = text == self._last_page  # an idle engine: no need to read it again
            samples = [] if unchanged else self.reader.read(text)
            self._last_page = text
            ok, error = True, None
        except Exception as exc:
            self._close()
            self._last_page = None
            samples, ok, error = [], False, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        dur = time.monotonic_ns() - t0
        return ScrapeResult(ok, t0_wall + dur // 2, dur, samples, error, unchanged)

    def _get(self, deadline: float) -> str:
        conn = self._conn
        if conn is None:
            conn = self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            return self._request(conn, deadline)
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            # a kept-alive connection the server closed meanwhile: one fresh try, same deadline
            self._close()
            conn = self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
            return self._request(conn, deadline)

    def _request(self, conn: http.client.HTTPConnection, deadline: float) -> str:
        conn.timeout = max(0.001, deadline - time.monotonic())
        conn.request("GET", self.path, headers={"Accept": ACCEPT, "Accept-Encoding": "identity"})
        if conn.sock is not None:
            conn.sock.settimeout(max(0.001, deadline - time.monotonic()))
        resp = conn.getresponse()
        chunks: list[bytes] = []
        size = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no complete page within {self.timeout_s:g} s")
            if conn.sock is not None:
                conn.sock.settimeout(left)
            chunk = resp.read1(1 << 16) if hasattr(resp, "read1") else resp.read(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_PAGE_BYTES:
                raise ValueError(f"page larger than {MAX_PAGE_BYTES >> 20} MiB")
        if resp.status != 200:
            raise OSError(f"HTTP {resp.status} {resp.reason}")
        if resp.will_close:
            self._close()
        return b"".join(chunks).decode("utf-8", errors="replace")

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    # ------------------------------------------------------------------ sampler loop
    def due(self, now: float) -> bool:
        return now >= self.next_try

    def after(self, result: ScrapeResult, now: float, interval_s: float) -> str | None:
        """Book the result; returns ``"down"`` on the first failure, ``"up"`` on recovery, else None."""
        if result.ok:
            self.failures = 0
            self.next_try = 0.0
            if self.down:
                self.down = False
                return "up"
            return None
        self.failures += 1
        self.next_try = now + min(self.retry_max_s, interval_s * 2 ** min(self.failures, 20))
        if not self.down:
            self.down = True
            return "down"
        return None

    def close(self) -> None:
        self._close()
