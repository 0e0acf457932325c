"""``rl-trace view``: the exact bytes, on 127.0.0.1 only, with the CORS the Perfetto UI needs; Ctrl-C
stops the command cleanly."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl_trace_observer.analysis.view_server import (
    PERFETTO_ORIGIN,
    TraceFileServer,
    deep_link,
    vizviewer_command,
    vizviewer_file,
)


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    p = tmp_path / "run one.pftrace"  # a space: the URL must quote it
    # > one copy chunk, every byte value; it starts as a Trace.packet does (view refuses non-traces)
    p.write_bytes(b"\x0a" + os.urandom(3 << 20) + bytes(range(256)))
    return p


def _get(
    url: str, method: str = "GET", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, method=method, headers=headers or {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy
    try:
        with opener.open(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def test_serves_exact_bytes_with_cors(trace: Path) -> None:
    with TraceFileServer(trace) as server:
        assert server.url == f"http://127.0.0.1:{server.port}/run%20one.pftrace"
        status, headers, body = _get(server.url, headers={"Origin": PERFETTO_ORIGIN})
        assert status == 200 and body == trace.read_bytes()
        assert headers["Access-Control-Allow-Origin"] == PERFETTO_ORIGIN
        assert headers["Content-Length"] == str(trace.stat().st_size)
        status, headers, _ = _get(server.url, "OPTIONS", {"Origin": PERFETTO_ORIGIN})
        assert status == 204 and headers["Access-Control-Allow-Private-Network"] == "true"
        status, headers, body = _get(server.url, "HEAD")
        assert status == 200 and body == b""


def test_serves_nothing_else(trace: Path) -> None:
    (trace.parent / "secret.txt").write_text("no")
    with TraceFileServer(trace) as server:
        base = f"http://127.0.0.1:{server.port}"
        for path in ("/", "/secret.txt", "/../secret.txt", "/run%20one.pftrace/..", "/%2e%2e/secret.txt"):
            assert _get(base + path)[0] == 404, path


def _other_local_address() -> str | None:
    """An address of this machine that is not loopback (None when it has none)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET: nothing is sent for UDP connect
            addr = str(s.getsockname()[0])
    except OSError:
        return None
    return None if addr.startswith("127.") else addr


def test_binds_loopback_only(trace: Path) -> None:
    with TraceFileServer(trace) as server:
        assert server.httpd.socket.getsockname()[0] == "127.0.0.1"
        other = _other_local_address()
        if other is not None:  # the same port on the machine's own LAN address must refuse
            with pytest.raises(OSError), socket.create_connection((other, server.port), timeout=5):
                pass
        with socket.create_connection(("127.0.0.1", server.port), timeout=5):
            pass


def test_deep_link_and_viewer_hints(trace: Path) -> None:
    assert (
        deep_link("http://127.0.0.1:1/x.pftrace")
        == "https://ui.perfetto.dev/#!/?url=http://127.0.0.1:1/x.pftrace"
    )
    assert vizviewer_file(trace) is None  # no JSON sibling
    sibling = trace.with_name("run one.json.gz")
    sibling.write_bytes(b"")
    assert vizviewer_file(trace) == sibling
    cmd = vizviewer_command(trace)
    assert cmd is not None and cmd.endswith("'" + str(sibling) + "'") and "vizviewer" in cmd


def test_cli_prints_link_serves_and_stops_on_ctrl_c(trace: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "rl_trace_observer.cli.main", "view", str(trace)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C as a terminal sends it, even when the suite itself runs where SIGINT is ignored (a
        # background job of a non-interactive shell): Python would then inherit the ignoring
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 60
        while not any("ui.perfetto.dev" in ln for ln in lines):
            assert time.monotonic() < deadline and proc.poll() is None, lines
            lines.append(proc.stdout.readline())
        link = next(ln.strip() for ln in lines if "ui.perfetto.dev" in ln)
        m = re.fullmatch(
            r"https://ui\.perfetto\.dev/#!/\?url=(http://127\.0\.0\.1:\d+/run%20one\.pftrace)", link
        )
        assert m, link
        assert _get(m.group(1))[2] == trace.read_bytes()
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Stopped." in err and "Traceback" not in err


def test_cli_missing_file(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "rl_trace_observer.cli.main", "view", str(tmp_path / "nope.pftrace")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # a missing input is a usage error in every subcommand (cli/errors.py)
    assert res.returncode == 2 and "nope.pftrace" in res.stderr and res.stderr.count("\n") == 1


def _raw_request(port: int, method: str, path: str, host: str | None) -> tuple[int, bytes]:
    """One HTTP/1.1 request with exactly this ``Host`` (None: none at all), as a rebinding page's
    browser sends it; returns the status and the body."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        if host is not None:
            conn.putheader("Host", host)
        conn.putheader("Origin", PERFETTO_ORIGIN)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


FORGED_HOSTS = [
    "evil.example",
    "evil.example:{port}",
    "localhost.evil.example:{port}",
    "127.0.0.1.nip.io:{port}",
    "192.168.1.10:{port}",
    "0.0.0.0:{port}",
    "[::2]:{port}",
    "localhost:{port}@evil.example",
    "",
    None,
]
LOOPBACK_HOSTS = [
    "127.0.0.1:{port}",
    "127.0.0.1",
    "localhost:{port}",
    "LOCALHOST",
    "[::1]:{port}",
    "127.8.9.10:{port}",
]


def test_cli_refuses_forged_host_headers(trace: Path) -> None:
    """DNS rebinding (issue 33, item 15): a running ``rl-trace view`` answers a request naming any
    non-loopback host with 403 and not one byte of the trace, on every method; loopback names work."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rl_trace_observer.cli.main", "view", str(trace)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = ""
        deadline = time.monotonic() + 60
        while "ui.perfetto.dev" not in line:
            assert time.monotonic() < deadline and proc.poll() is None, line
            line = proc.stdout.readline()
        m = re.search(r"url=http://127\.0\.0\.1:(\d+)(/\S+)", line)
        assert m, line
        port, path = int(m.group(1)), m.group(2)
        data = trace.read_bytes()
        for forged in FORGED_HOSTS:
            host = None if forged is None else forged.format(port=port)
            for method in ("GET", "HEAD", "OPTIONS"):
                status, body = _raw_request(port, method, path, host)
                assert status == 403, (host, method, status)
                assert data[:64] not in body and len(body) < 1000, (host, method)
        for ok in LOOPBACK_HOSTS:
            status, body = _raw_request(port, "GET", path, ok.format(port=port))
            assert status == 200 and body == data, ok
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(
    "host, ok",
    [
        ("localhost", True),
        ("localhost:8080", True),
        ("localhost.", True),
        ("LocalHost:1", True),
        ("127.0.0.1", True),
        ("127.0.0.1:65535", True),
        ("127.255.0.3:9", True),
        ("[::1]", True),
        ("[::1]:80", True),
        ("[0:0:0:0:0:0:0:1]:80", True),
        (None, False),
        ("", False),
        ("::1", False),  # IPv6 must be bracketed in a Host header
        ("[::1", False),
        ("[::1]x", False),
        ("[::1]:", False),
        ("localhost:", False),
        ("localhost:http", False),
        ("localhost:1:2", False),
        ("127.1", False),
        ("0x7f.0.0.1", False),
        ("128.0.0.1", False),
        ("0.0.0.0", False),
        ("[127.0.0.1]", False),
        ("sub.localhost", False),
        ("localhost.evil.example", False),
        ("127.0.0.1.nip.io", False),
        ("evil.example:80", False),
    ],
)
def test_loopback_host_names(host: str | None, ok: bool) -> None:
    from rl_trace_observer.common.loopback import is_loopback_host

    assert is_loopback_host(host) is ok


@given(st.text(max_size=80))
def test_loopback_host_never_raises_and_accepts_only_loopback(host: str) -> None:
    import ipaddress

    from rl_trace_observer.common.loopback import is_loopback_host

    if is_loopback_host(host):
        name = host.strip()
        if name.startswith("["):
            assert ipaddress.ip_address(name[1 : name.index("]")]) == ipaddress.ip_address("::1")
        else:
            name = name.partition(":")[0].lower().removesuffix(".")
            assert name == "localhost" or ipaddress.ip_address(name) in ipaddress.ip_network("127.0.0.0/8")


@given(st.tuples(st.integers(0, 255), st.integers(0, 255), st.integers(0, 255)), st.integers(0, 65535))
def test_every_127_address_with_any_port_is_loopback(octets: tuple[int, int, int], port: int) -> None:
    from rl_trace_observer.common.loopback import is_loopback_host

    address = "127." + ".".join(map(str, octets))
    assert is_loopback_host(address) and is_loopback_host(f"{address}:{port}")
    assert not is_loopback_host(f"{address}.evil.example:{port}")
