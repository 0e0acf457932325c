"""The names capture gives its files, in one place: the collector, the merger's sniffing and the live
watch recognise a process record or an event log by these, never by a copy of the literal."""

from __future__ import annotations

import re

EVENT_LOG_NAME = "rl-insight-{host}-pid-{pid}.chrome.jsonl"
PROCESS_RECORD_PREFIX = "rl-trace-process-"
PROCESS_RECORD_NAME = PROCESS_RECORD_PREFIX + "{host}-pid-{pid}.json"
PROCESS_RECORD_RE = re.compile(rf"^{re.escape(PROCESS_RECORD_PREFIX)}.+-pid-\d+\.json$")


def is_process_record(name: str) -> bool:
    """Whether a file's base name is one capture gives a process record."""
    return PROCESS_RECORD_RE.match(name) is not None
