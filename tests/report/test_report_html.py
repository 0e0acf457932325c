"""The HTML report, opened in headless Chromium over DevTools: it renders, logs no console error,
shows its three charts, and shows a span named ``<script>alert(1)</script>`` as text.

The page is loaded from ``file://`` (as a user would open it) with the network blocked, so it also
proves the report is self-contained. A full-page screenshot is kept as a test artifact
(``<pytest tmp dir>/report.png``, path printed with ``-s``).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rl_trace_observer.analysis.report.output import summarize, write_outputs
from rl_trace_observer.testing.perfetto import browser as browser_mod

from .test_report import XSS, fixture_manifest, write_fixture


class Page:
    """One tab over the DevTools pipe, keeping every event (console, exceptions, dialogs)."""

    def __init__(self, browser: Any) -> None:
        self.cdp = browser.cdp
        self.events: list[dict[str, Any]] = []
        self.cdp.session = None
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.cdp.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1200, "height": 900, "deviceScaleFactor": 1, "mobile": False},
        )

    def call(self, method: str, params: dict[str, Any] | None = None, timeout_s: float = 30.0) -> Any:
        want, deadline = self.cdp.send(method, params), time.monotonic() + timeout_s
        while True:
            msg = self.cdp.recv(deadline)
            assert msg is not None, f"no answer to {method}"
            if msg.get("id") == want:
                assert "error" not in msg, msg["error"]
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def wait_for(self, method: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(e["method"] == method for e in self.events):
            msg = self.cdp.recv(deadline)
            assert msg is not None, f"no {method} within {timeout_s} s"
            if "method" in msg:
                self.events.append(msg)

    def js(self, expr: str) -> Any:
        res = self.call("Runtime.evaluate", {"expression": expr, "returnByValue": True})
        assert "exceptionDetails" not in res, res["exceptionDetails"]
        return res["result"].get("value")

    def problems(self) -> list[str]:
        out = []
        for e in self.events:
            p = e.get("params", {})
            if e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "warning", "assert"):
                out.append(f"console.{p['type']}: {p.get('args')}")
            elif e["method"] == "Runtime.exceptionThrown":
                out.append(f"exception: {p.get('exceptionDetails', {}).get('text')}")
            elif e["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") in ("error", "warning"):
                out.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
            elif e["method"] == "Page.javascriptDialogOpening":
                out.append(f"dialog: {p.get('message')}")
        return out


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        path = browser_mod.find_browser()
    except browser_mod.EngineUnavailable as exc:
        pytest.skip(str(exc))
    b = browser_mod.Browser(path, "http://127.0.0.1:1")
    try:
        yield b
    finally:
        b.close()


@pytest.fixture(scope="module")
def loaded(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Page, Path]:
    tmp = tmp_path_factory.mktemp("html")
    summary = summarize(write_fixture(tmp / "merged.json.gz", manifest=fixture_manifest()))
    html = tmp / "report.html"
    write_outputs(summary, html=html)
    page = Page(browser)
    page.call("Page.navigate", {"url": html.as_uri()})
    page.wait_for("Page.loadEventFired")
    shot = page.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
    png = tmp / "report.png"
    png.write_bytes(base64.b64decode(shot["data"]))
    print(f"screenshot: {png}")
    return page, png


def test_renders_without_console_errors(loaded: tuple[Page, Path]) -> None:
    page, png = loaded
    assert page.js("document.title") == "RL Trace Observer report"
    assert page.problems() == []
    assert png.stat().st_size > 20_000  # a real rendering, not a blank page
    assert page.js("document.documentElement.scrollHeight") > 2000


def test_charts_are_present_and_drawn(loaded: tuple[Page, Path]) -> None:
    page, _ = loaded
    charts = page.js(
        "Array.from(document.querySelectorAll('svg.chart')).map(s => ({cls: s.getAttribute('class'),"
        " h: s.getBoundingClientRect().height, w: s.getBoundingClientRect().width,"
        " bars: s.querySelectorAll('rect[width]').length}))"
    )
    kinds = {c["cls"].split()[1] for c in charts}
    assert kinds == {"breakdown", "gantt", "overlap"}
    for c in charts:
        assert c["h"] > 60 and c["w"] > 600 and c["bars"] >= 5, c
    # bar widths scale with time: the gantt's 600 ms span is 6x its 100 ms span
    widths = page.js(
        "Array.from(document.querySelectorAll('svg.gantt rect title')).filter(t => t.textContent.startsWith("
        "'vllm_generate')).map(t => parseFloat(t.parentNode.getAttribute('width')))"
    )
    assert max(widths) / min(widths) == pytest.approx(6.0, rel=1e-3)


def test_script_named_span_is_text(loaded: tuple[Page, Path]) -> None:
    page, _ = loaded
    assert page.js("document.querySelectorAll('script').length") == 0
    assert XSS in page.js("document.body.innerText")
    assert page.js(f"Array.from(document.querySelectorAll('td')).some(td => td.textContent === {XSS!r})")
    titles = "Array.from(document.querySelectorAll('svg.gantt title'))"
    tips = f"{titles}.some(t => t.textContent.startsWith({XSS!r}))"
    assert page.js(tips)
    assert not [e for e in page.events if e["method"] == "Page.javascriptDialogOpening"]


def test_no_network_requests(loaded: tuple[Page, Path]) -> None:
    page, _ = loaded
    resources = page.js("performance.getEntriesByType('resource').map(r => r.name)")
    assert resources == []
