"""What ``rl-trace report`` reads: a merged trace (+ its manifest), or a run directory merged first.

The manifest (``<trace>.manifest.json``, written by ``rl-trace merge``) is where the report finds
clock-alignment quality and artifact completeness; without one the report says "unknown" instead of
guessing. The merge itself is :func:`rl_trace_observer.merge.pipeline.merge` (imported lazily).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ...merge.shards.layout import is_shards_dir
from ...merge.shards.schema import MANIFEST_NAME

__all__ = ["InputError", "ResolvedInput", "artifacts_section", "clock_section", "merge", "resolve"]

MAX_LISTED = 50


class InputError(ValueError):
    """Bad report input; the message names the path and what to do."""


@dataclass
class ResolvedInput:
    trace: Path
    manifest: dict[str, Any] | None
    manifest_path: Path | None
    merged_from: Path | None = None  # the run directory, when the report merged it
    shards: Path | None = None  # span shards to read instead of the trace (merge --shards)
    manifest_note: str | None = None  # why the manifest beside the trace was not used (one line)


def merge(inputs: list[Path], output: Path, shards: Path | None = None, *, temporary: bool = False) -> Path:
    """Merge ``inputs`` into ``output`` (format by suffix; span shards into ``shards`` when given);
    returns the manifest path.

    Raises ``InputError`` when nothing usable was merged, saying why (and where the manifest is,
    unless it is ``temporary``: about to be removed with its folder).
    """
    from ...merge.manifest.document import why_nothing
    from ...merge.options import MergeOptions, UsageError
    from ...merge.pipeline import merge as run_merge

    try:
        opts = MergeOptions(shards=str(shards) if shards is not None else None)
        result = run_merge([str(p) for p in inputs], str(output), opts)
    except UsageError as exc:
        raise InputError(str(exc)) from None
    if not result.written:
        see = "" if temporary else f"; see {result.manifest_path}"
        raise InputError(f"{inputs[0]}: nothing usable to merge ({why_nothing(result.manifest)}){see}")
    return Path(result.manifest_path)


@contextlib.contextmanager
def merged_first(path: Path) -> Iterator[ResolvedInput]:
    """``path`` merged into a temporary ``.json.gz`` (removed afterwards): a run directory, or a file
    the report cannot read as it is (a cut-short profiler trace, whose events before the cut the
    merger keeps and names as an ``incomplete`` problem)."""
    tmp = Path(tempfile.mkdtemp(prefix="rl-trace-report-"))
    try:
        out = tmp / "merged.json.gz"
        mpath = merge([path], out, temporary=True)
        yield ResolvedInput(out, _read_manifest(mpath), mpath, merged_from=path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _read_manifest(path: Path) -> dict[str, Any] | None:
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return (
        data if isinstance(data, dict) and str(data.get("schema", "")).startswith("rl-trace-merge") else None
    )


@contextlib.contextmanager
def resolve(path: str | Path, manifest: str | Path | None = None) -> Iterator[ResolvedInput]:
    """A merged trace to read; a run directory is merged into a temporary ``.json.gz`` first."""
    p = Path(path)
    if p.is_dir() and is_shards_dir(p):
        mpath = Path(manifest) if manifest else p / MANIFEST_NAME
        copy = _read_manifest(mpath) if mpath.is_file() else None
        other = shards_mismatch(copy, p)  # a merge killed between its manifest copy and its document
        if other is not None:
            note = f"{mpath}: not the manifest of these shards: {other}"
            yield ResolvedInput(p, None, None, shards=p, manifest_note=note)
            return
        yield ResolvedInput(p, copy, mpath if copy is not None else None, shards=p)
        return
    if p.is_dir():
        with merged_first(p) as merged:
            yield merged
        return
    if not p.is_file():
        raise InputError(
            f"{p}: no such file or directory; give a merged trace (.json, .json.gz) or a run directory"
        )
    mpath = Path(manifest) if manifest else Path(f"{p}.manifest.json")
    found, note = paired_manifest(p, mpath)
    if p.name.endswith((".pftrace", ".pftrace.gz")):
        if note is not None:
            raise InputError(f"{note}; re-run the merge (or report on its span shard directory)")
        shards = _shards_of(found)
        other = shards_mismatch(found, shards)
        if other is not None:
            raise InputError(f"{p}: {other}; report on that directory itself, or re-run the merge")
        if shards is None:
            raise InputError(
                f"{p}: a .pftrace is reported on from its span shards, and this merge wrote none; "
                f"re-run the merge with --shards DIR (then: rl-trace report DIR), or merge to .json.gz"
            )
        yield ResolvedInput(p, found, mpath, shards=shards)
        return
    yield ResolvedInput(p, found, mpath if found is not None else None, manifest_note=note)


def paired_manifest(trace: Path, mpath: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The manifest at ``mpath`` when it describes ``trace``; else None and, when there is one that
    does not (a merge killed between its two renames, an older tool's failed merge), why, in one line
    naming it (:mod:`rl_trace_observer.merge.manifest.pair`)."""
    from ...merge.manifest.pair import mismatch

    found = _read_manifest(mpath) if mpath.is_file() else None
    if found is None:
        return None, None
    why = mismatch(trace, found)
    if why is None:
        return found, None
    return None, f"{mpath}: not the manifest of {trace.name}: {why} (a merge was interrupted or failed)"


def shards_mismatch(manifest: dict[str, Any] | None, shards: Path | None) -> str | None:
    """Why the span shards in ``shards`` are not the ones ``manifest`` names (another merge wrote
    them: one killed between its shards and its output), or None."""
    want = ((manifest or {}).get("shards") or {}).get("merge_id")
    if shards is None or not isinstance(want, str):
        return None  # no shards, or a manifest from before merge ids: nothing to compare
    from ...merge.shards.layout import ShardsError, read_doc

    try:
        found = read_doc(shards).get("merge_id")
    except ShardsError:
        return None  # the readers name a damaged document themselves
    if found == want:
        return None
    return f"the span shards in {shards} were written by another merge than its manifest's (merge id {found})"


def _shards_of(manifest: dict[str, Any] | None) -> Path | None:
    """The span shard directory a merge manifest names, when it is still there."""
    folder = ((manifest or {}).get("shards") or {}).get("dir")
    if isinstance(folder, str) and is_shards_dir(folder):
        return Path(folder)
    return None


# ------------------------------------------------------------------------------ manifest sections
def clock_section(manifest: dict[str, Any] | None, trace_metadata: dict[str, Any]) -> dict[str, Any]:
    """How well the clocks of the merged sources agree: method, per-host bounds, a one-word verdict."""
    clock = ((manifest or {}).get("timeline") or {}).get("clock")
    if not isinstance(clock, dict):
        mode = (trace_metadata.get("rl_trace_observer") or {}).get("clock")
        return {"mode": mode, "quality": "unknown", "why": "no merge manifest next to the trace", "hosts": []}
    hosts = []
    for name, h in sorted((clock.get("hosts") or {}).items()):
        h = h if isinstance(h, dict) else {}
        hosts.append(
            {
                "host": name,
                "method": h.get("method"),
                "applied": h.get("applied"),
                "offset_ns": h.get("offset_ns"),
                "uncertainty_ns": h.get("uncertainty_ns"),
                "drift_ppm": h.get("drift_ppm"),
            }
        )
    tolerance_ns = int(float(clock.get("tolerance_us") or 0) * 1000) or None
    worst = clock.get("worst_uncertainty_ns")
    causality = clock.get("causality") or {}
    clock_problems = [p for p in (manifest or {}).get("problems", []) if p.get("kind") == "clock"]
    quality, why = _verdict(hosts, worst, tolerance_ns, causality, clock_problems)
    return {
        "mode": clock.get("mode"),
        "reference_host": (clock.get("reference") or {}).get("host"),
        "worst_uncertainty_ns": worst,
        "tolerance_ns": tolerance_ns,
        "causality": {"checked": causality.get("checked", 0), "failed": causality.get("failed", 0)},
        "quality": quality,
        "why": why,
        "hosts": hosts,
        "problems": [p.get("detail") for p in clock_problems][:MAX_LISTED],
    }


def _verdict(
    hosts: list[dict[str, Any]],
    worst: Any,
    tolerance_ns: int | None,
    causality: dict[str, Any],
    problems: list[dict[str, Any]],
) -> tuple[str, str]:
    if causality.get("failed"):
        return (
            "poor",
            f"{causality['failed']} of {causality.get('checked')} cross-host causality checks failed",
        )
    if problems:
        return "poor", f"{len(problems)} clock problem(s) in the manifest"
    if len(hosts) <= 1:
        return "exact", "one host: every source shares its wall clock"
    unmeasured = [h["host"] for h in hosts if h.get("uncertainty_ns") is None]
    if unmeasured:
        return "unknown", f"offset never measured for {', '.join(unmeasured[:5])}"
    if tolerance_ns is not None and isinstance(worst, int) and worst > tolerance_ns:
        return "poor", f"worst bound ±{worst / 1e3:.0f} µs exceeds the tolerance ±{tolerance_ns / 1e3:.0f} µs"
    return "good", f"every host within ±{(worst or 0) / 1e3:.0f} µs"


def artifacts_section(manifest: dict[str, Any] | None) -> dict[str, Any] | None:
    """Which files went into the trace, which were incomplete or skipped, and the merge's problems."""
    if manifest is None:
        return None
    by_kind: dict[str, dict[str, int]] = {}
    incomplete, skipped = [], []
    for a in manifest.get("artifacts") or []:
        if not isinstance(a, dict):
            continue
        kind = str(a.get("kind") or "unknown")
        row = by_kind.setdefault(kind, {"files": 0, "complete": 0, "incomplete": 0, "skipped": 0})
        row["files"] += 1
        if a.get("skip_reason"):  # process records are unselected with no reason: not traces, not skipped
            row["skipped"] += 1
            skipped.append({"path": a.get("path"), "kind": kind, "reason": a.get("skip_reason")})
        elif a.get("complete", True):
            row["complete"] += 1
        else:
            row["incomplete"] += 1
            incomplete.append({"path": a.get("path"), "kind": kind})
    problems = [
        {"kind": p.get("kind"), "path": p.get("path"), "detail": p.get("detail")}
        for p in manifest.get("problems") or []
        if isinstance(p, dict)
    ]
    return {
        "status": manifest.get("status"),
        "files": sum(r["files"] for r in by_kind.values()),
        "by_kind": dict(sorted(by_kind.items())),
        "incomplete": incomplete[:MAX_LISTED],
        "skipped": skipped[:MAX_LISTED],
        "problems": problems[:MAX_LISTED],
        "problem_count": len(problems),
        "missing": sum(1 for p in problems if p["kind"] == "missing"),
        "counts": manifest.get("counts") or {},
        "metrics": [  # what each metric sampler sampled (GPUs found or why not, targets, outages)
            a["metrics"] for a in manifest.get("artifacts") or [] if isinstance(a, dict) and "metrics" in a
        ][:MAX_LISTED],
    }
