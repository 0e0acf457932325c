"""The merge manifest (``<output>.manifest.json``): what went in, what came out, what went wrong.

Written atomically even when the merge fails, so a user (or CI) can always see which file broke it —
beside an earlier output it leaves in place, as ``<output>.failed.manifest.json`` (:mod:`.pair`).
Schema ``rl-trace-merge-manifest/1``:

- ``status``: ``ok`` | ``partial`` (problems, output written) | ``failed`` (no output);
- ``output``: path, format, size, written, ``tail_crc32``/``tail_bytes`` (what the readers check the
  pair by), ``kept_earlier`` (a failed merge that left an earlier output); ``timeline``: ``base_ns``
  (JSON ``ts`` = (ns - base)/1000), first/last event ns, and ``clock`` (the clock-alignment section,
  ``{"mode": "wall"}`` when none);
- ``counts``: events read/kept/dropped/filtered, and slices/flows/counters/processes/threads as
  written — exactly what Perfetto will import;
- ``runs``, ``sessions`` (step windows), ``processes``, ``artifacts`` (kind, size, sha256, owner,
  complete, step, role, rank, selected, anchor, events read/kept/dropped), ``problems``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ... import __version__
from ...common.atomic import write_atomic
from ...common.encoding import dumps_pretty
from ..formats import format_of
from ..timeline.model import Problem

SCHEMA = "rl-trace-merge-manifest/1"


def manifest_path_for(output: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(output)}.manifest.json")


def new_manifest(output: str, fmt: str, inputs: list[str], options: dict[str, Any]) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "tool": {"name": "rl-trace-observer", "version": __version__},
        "created_wall_ns": time.time_ns(),
        "status": "failed",
        "output": {"path": output, "format": fmt, "size": None, "written": False},
        "inputs": inputs,
        "options": options,
        "timeline": {"base_ns": None, "start_ns": None, "end_ns": None, "clock": {"mode": "wall"}},
        "counts": {},
        "runs": [],
        "sessions": [],
        "processes": [],
        "artifacts": [],
        "ignored": [],
        "problems": [],
    }


def set_problems(manifest: dict[str, Any], problems: list[Problem]) -> None:
    seen: set[tuple[str, str, str]] = set()
    out = []
    for p in problems:
        key = (p.kind, p.path, p.detail)
        if key not in seen:
            seen.add(key)
            out.append(p.as_dict())
    manifest["problems"] = out


LINES_PER_KIND = 10  # stderr names this many files per problem kind; the manifest lists them all
# kinds about the run rather than one file's content (hosts' clocks, runs, steps, nodes): one line each
RUN_KINDS = frozenset({"clock", "mixed_runs", "no_step_window", "node"})


def problem_summary(problems: list[dict[str, str]]) -> list[str]:
    """One line per file and problem kind, saying what is wrong with THAT file (at most
    ``LINES_PER_KIND`` per kind, then how many more the manifest lists); one line per kind for the
    run's own problems (``RUN_KINDS``)."""
    by_kind: dict[str, list[dict[str, str]]] = {}
    for p in problems:
        by_kind.setdefault(p["kind"], []).append(p)
    lines = []
    for kind, items in by_kind.items():
        shown = 1 if kind in RUN_KINDS else LINES_PER_KIND
        for p in items[:shown]:
            lines.append(f"{kind}: {p['path']}: {p['detail']}")
        if len(items) > shown:
            if shown == 1:
                lines[-1] += f" (+{len(items) - 1} more in the manifest)"
            else:
                lines.append(f"{kind}: +{len(items) - shown} more files in the manifest")
    return lines


def strict_failure(problems: list[dict[str, str]]) -> str:
    """``--strict``'s one line: how many problems, and the first, naming its file."""
    if not problems:
        return "--strict: problems were found"
    first = problems[0]
    more = f" (+{len(problems) - 1} more in the manifest)" if len(problems) > 1 else ""
    return f"--strict: {first['path']}: {first['kind']}: {first['detail']}{more}"


def why_nothing(manifest: dict[str, Any]) -> str:
    """Why a merge kept no event, in one line: what became of the inputs that could hold events."""
    reasons: dict[str, int] = {}
    for art in manifest.get("artifacts") or []:
        fmt = format_of(str(art.get("kind")))
        if fmt is not None and not fmt.events:  # process records, our own outputs
            continue
        why = art.get("skip_reason") or ("no events" if art.get("selected") else "not selected")
        reasons[why] = reasons.get(why, 0) + 1
    if not reasons:
        failed = [p["detail"] for p in manifest.get("problems") or [] if "merge failed" in p["detail"]]
        return failed[0] if failed else "no trace files among the inputs"
    return ", ".join(f"{n} file{'s' if n > 1 else ''}: {why}" for why, n in sorted(reasons.items()))


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, dumps_pretty(manifest))
