"""A loopback OTLP/HTTP receiver for tests: it answers the real exporter as a Collector would and
writes each request body to a file as it came (``<pb>/otlp-<n>.binpb``), and the same request in the
OTLP/JSON encoding (``<json>/otlp-<n>.otlp.json``).

Why the JSON twin is converted here: the Python SDK 1.45 in this environment exports OTLP protobuf
only (its OTLP/JSON exporter, 0.66b1, pins older exporter packages than Ray's), so the JSON files are
the real bodies re-encoded with protobuf's own JSON mapping plus OTLP/JSON's one rule of its own: ids
as hex text, not base64.
"""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

_ID_KEYS = ("traceId", "spanId", "parentSpanId")


def to_otlp_json(body: bytes) -> dict[str, Any]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    doc = MessageToDict(request, use_integers_for_enums=True)

    def hexify(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in _ID_KEYS and isinstance(value, str):
                    node[key] = base64.b64decode(value).hex()
                else:
                    hexify(value)
        elif isinstance(node, list):
            for item in node:
                hexify(item)

    hexify(doc)
    return doc


class Collector:
    """``with Collector(pb_dir, json_dir) as c:`` ... ``c.endpoint`` is the traces URL to export to."""

    def __init__(self, out: Path, json_out: Path) -> None:
        self.out, self.json_out = out, json_out
        out.mkdir(parents=True, exist_ok=True)
        json_out.mkdir(parents=True, exist_ok=True)
        self.count = 0
        self._lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                assert self.path == "/v1/traces", self.path
                assert self.headers.get("Content-Type") == "application/x-protobuf"
                with collector._lock:
                    collector.count += 1
                    n = collector.count
                (collector.out / f"otlp-{n:03d}.binpb").write_bytes(body)
                (collector.json_out / f"otlp-{n:03d}.otlp.json").write_text(json.dumps(to_otlp_json(body)))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Collector:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
