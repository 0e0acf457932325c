"""Will it open? An estimate of the memory the Perfetto UI needs for a trace, from its event counts.

The browser UI runs the trace processor in WebAssembly, which stops at about 2 GB however much the
machine has (a tab that goes over shows an out-of-memory error). What a trace needs grows with what
it imports: a merged JSON trace of 6M slices (1.18 GB) took ~8.8 GB of browser memory in UI v52
(measured: ../shared/REFERENCE.md §4), ~1.5 KB per imported slice, flow or counter sample. That one
measurement is the estimate's basis: it is a rough guide, not a guarantee either way — a merge over
the limit says so and names the views that fit (one step, one role), written from span shards.
"""

from __future__ import annotations

from typing import Any

UI_LIMIT_BYTES = 2 << 30
BYTES_PER_EVENT = 1500


def estimate_bytes(counts: dict[str, Any]) -> int:
    events = (
        int(counts.get("slices") or 0)
        + int(counts.get("counter_samples") or 0)
        + int(counts.get("flows") or 0)
    )
    return events * BYTES_PER_EVENT


def ui_section(counts: dict[str, Any]) -> dict[str, Any]:
    """The manifest's ``output.ui_memory``: estimate, limit, and whether it fits."""
    need = estimate_bytes(counts)
    return {"estimate_bytes": need, "limit_bytes": UI_LIMIT_BYTES, "fits": need <= UI_LIMIT_BYTES}


def hint(manifest: dict[str, Any], output: str) -> str | None:
    """One line for a trace that will not open in the browser UI, saying what will."""
    ui = manifest.get("output", {}).get("ui_memory") or {}
    if ui.get("fits", True):
        return None
    need = ui.get("estimate_bytes", 0) / 1e9
    shards = (manifest.get("shards") or {}).get("dir")
    if shards:
        views = f"rl-trace merge {shards} --split-steps -o VIEW.pftrace (or --role ROLE)"
    else:
        views = "re-run the merge with --shards DIR, then: rl-trace merge DIR --split-steps -o VIEW.pftrace"
    return (
        f"{output} needs about {need:.1f} GB in the Perfetto UI (its limit is ~2 GB): open smaller views: "
        f"{views}; or load it in trace_processor"
    )
