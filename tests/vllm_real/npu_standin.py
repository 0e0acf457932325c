"""A stand-in for Ascend's NPU exporter (there is no NPU here): its documented metric and label names
(``npu_chip_info_*`` per device ``id``, with ``model_name``, ``pcie_bus_info``, ``vdie_id`` and the
container labels; sample lines carry millisecond timestamps, as its pages do), served over real
HTTP as ``text/plain``. Values move with time so tracks have something to draw."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEVICES = 2
GAUGES = {  # name -> (help, value at t seconds for device d)
    "npu_chip_info_utilization": ("the ai core utilization", lambda t, d: float((int(t) * 7 + d * 30) % 100)),
    "npu_chip_info_hbm_used_memory": ("the npu hbm used memory", lambda t, d: 1000.0 + 100 * d + int(t) % 5),
    "npu_chip_info_hbm_total_memory": ("the npu hbm total memory", lambda t, d: 32255.0),
    "npu_chip_info_power": ("the npu power", lambda t, d: 80.0 + d),
    "npu_chip_info_temperature": ("the npu temperature", lambda t, d: 40.0 + d),
    "npu_chip_info_health_status": ("the npu health status", lambda t, d: 1.0),
}


def page(now: float) -> bytes:
    ms = int(now * 1000)
    lines = [
        "# HELP machine_npu_nums Amount of npu installed on the machine.",
        "# TYPE machine_npu_nums gauge",
    ]
    lines.append(f"machine_npu_nums {DEVICES}")
    for name, (text, value) in GAUGES.items():
        lines += [f"# HELP {name} {text}", f"# TYPE {name} gauge"]
        for d in range(DEVICES):
            labels = (
                f'container_name="",id="{d}",model_name="910B-Ascend-V1",namespace="",'
                f'pcie_bus_info="0000:{0x61 + d:02X}:00.0",pod_name="",vdie_id="VDIE-{d}"'
            )
            lines.append(f"{name}{{{labels}}} {value(now, d)} {ms}")
    return ("\n".join(lines) + "\n").encode()


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = page(time.time())
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args: Any) -> None:
        return None


def serve() -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"127.0.0.1:{server.server_address[1]}"
