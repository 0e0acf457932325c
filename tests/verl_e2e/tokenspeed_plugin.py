"""Test-only: log a checksum of every weight bucket the ``tokenspeed`` adapter sends.

Loaded with ``VERL_USE_EXTERNAL_MODULES=tests.verl_e2e.plugin,tests.verl_e2e.tokenspeed_plugin`` in the
TokenSpeed end-to-end test. It wraps the adapter's ``_send_bucket`` (the product code is unchanged
otherwise) and appends, per bucket, the sha256 the stand-in server's ranks compute over what they
receive (:func:`tests.tokenspeed_standin.ranks.checksum`) to
``$TOKENSPEED_STANDIN_LOG_DIR/weights-sender.jsonl``.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

from rl_trace_observer.integrations.tokenspeed import adapter

from ..tokenspeed_standin.ranks import checksum

_original = adapter.TokenSpeedServerAdapter._send_bucket


@functools.wraps(_original)
async def _send_bucket(self: Any, bucket: list[tuple[str, Any]], server: Any, version: Any) -> None:
    line = {"version": None if version is None else str(version), "names": [n for n, _ in bucket]}
    line["sha256"] = checksum(bucket)
    await _original(self, bucket, server, version)
    out = Path(os.environ.get("TOKENSPEED_STANDIN_LOG_DIR", ".")) / "weights-sender.jsonl"
    with open(out, "a") as f:
        f.write(json.dumps(line) + "\n")


if not getattr(adapter.TokenSpeedServerAdapter._send_bucket, "__wrapped__", None):
    adapter.TokenSpeedServerAdapter._send_bucket = _send_bucket  # type: ignore[method-assign]
