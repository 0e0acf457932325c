"""Readers for what the capture layer writes, kept independent of the merger on purpose."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every line must parse: a corrupt line fails the test that reads it."""
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"", f"{path} does not end with a newline"
    return [json.loads(line) for line in lines[:-1]]


def event_logs(out_dir: Path) -> dict[int, list[dict[str, Any]]]:
    return {
        int(p.name.rsplit("-pid-", 1)[1].split(".")[0]): read_jsonl(p)
        for p in sorted(out_dir.glob("rl-insight-*-pid-*.chrome.jsonl"))
    }


def process_records(out_dir: Path) -> dict[int, dict[str, Any]]:
    return {
        rec["pid"]: rec
        for rec in (json.loads(p.read_text()) for p in sorted(out_dir.glob("rl-trace-process-*.json")))
    }


def spans(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["ph"] == "X"]
