"""Demonstration in the real Perfetto engine: per-artifact alignment keeps every VizTracer→Proton flow.

A 3-rank TokenSpeed profile (synthetic, real wire format) whose Proton clocks are off by +40, −25 and
0 µs is merged into one Chrome JSON by :func:`write_merged` — deliberately simple: per-rank pids,
numeric flow ids, a flow end on every Proton scope (as TokenSpeed's own merger does), Proton's
events written FIRST (as the merge pipeline writes a rank's files), the Proton correction from
:func:`align_pairs` applied to every Proton time. Perfetto v52 silently drops a flow whose end is
earlier than its start (``flow_end_without_start``, an info stat): without correction the −25 µs
rank loses all of its scope links; with it none is lost.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from rl_trace_observer.merge.clock.pair_events import tokenspeed_pairs
from rl_trace_observer.merge.clock.pairs import PairAlignment, align_pairs
from rl_trace_observer.merge.timeline.model import us_to_ns
from rl_trace_observer.testing.perfetto import engine as pe
from rl_trace_observer.testing.tokenspeed import RankFiles, TokenSpeedSpec, write_profile

pytestmark = pytest.mark.perfetto

SCOPE_FLOWS = "select count(*) from flow f join slice s on s.id = f.slice_in where s.category = 'scope'"
FLOW_STATS = "select name, value from stats where name like 'flow%' and value > 0 order by name"
ID_SPACE = 10**7  # flow ids of rank r: (r + 1) * ID_SPACE + source id (numeric: v1 ids must be)


def _load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = orjson.loads(path.read_bytes())
    return doc


def align_rank(rank: RankFiles, *, apply: bool = True) -> PairAlignment:
    """The Proton file's alignment against its VizTracer report (first part only: one per rank here)."""
    pairs = tokenspeed_pairs(_load(rank.viztracer), _load(rank.proton[0]))
    return align_pairs(
        pairs, artifact=rank.proton[0].name, partner=rank.viztracer.name, pairing="scope_id", apply=apply
    )


def write_merged(ranks: list[RankFiles], alignments: list[PairAlignment], out: Path) -> int:
    """One Chrome JSON of every rank's two files; returns the number of flows in the inputs."""
    base = min(min(r.viztracer_base_ns, *(b for b in r.proton_base_ns if b)) for r in ranks) // 10**9 * 10**9
    events: list[dict[str, Any]] = []
    flows = 0

    def us(ns: int) -> float:
        return round((ns - base) / 1000, 3)

    for n, (rank, al) in enumerate(zip(ranks, alignments, strict=True)):
        corr = al.correction or (lambda t: t)
        ids = (n + 1) * ID_SPACE
        proton_pid = 2_000_000 + n
        for part, anchor in zip(rank.proton, rank.proton_base_ns, strict=True):
            assert anchor is not None
            for e in _load(part)["traceEvents"]:
                e = {**e, "pid": proton_pid}
                if e["ph"] == "M":
                    if e["name"] == "process_name":
                        e["args"] = {"name": f"rank {rank.rank} · Proton"}
                    events.append(e)
                    continue
                start = corr(anchor + us_to_ns(e["ts"]))
                if "dur" in e:
                    e["dur"] = round((corr(anchor + us_to_ns(e["ts"] + e["dur"])) - start) / 1000, 3)
                e["ts"] = us(start)
                if "id" in e:
                    e["id"] += ids
                    flows += e["ph"] == "s"
                events.append(e)
                if e.get("cat") == "scope":
                    end = {"ph": "f", "name": "viztracer->proton", "cat": "tokenspeed.proton", "bp": "e"}
                    sid = e["args"]["scope_id"]
                    events.append({**end, "id": ids + sid, "pid": proton_pid, "tid": e["tid"], "ts": e["ts"]})
        for e in _load(rank.viztracer)["traceEvents"]:
            e = {**e, "pid": rank.pid, "tid": rank.pid}
            if e["ph"] == "M":
                if e["name"] == "process_name":
                    e["args"] = {"name": f"rank {rank.rank} · VizTracer"}
                events.append(e)
                continue
            e["ts"] = us(rank.viztracer_base_ns + us_to_ns(e["ts"]))
            if e["ph"] == "s":
                e["id"] += ids
                flows += 1
            events.append(e)
    out.write_bytes(orjson.dumps({"traceEvents": events}))
    return flows


@pytest.mark.parametrize("drift_ppm", [0.0, 200.0])
def test_no_flow_is_lost_after_correction(tmp_path: Path, engine: pe.Engine, drift_ppm: float) -> None:
    spec = TokenSpeedSpec(
        ranks=3, steps=4, events_per_rank=3000, proton_offsets_us=(40, -25, 0), proton_drift_ppm=drift_ppm
    )
    ranks = write_profile(tmp_path / "run", spec)
    links = sum(r.scope_links for r in ranks)
    total = links + sum(r.launch_flows for r in ranks)

    raw_al = [align_rank(r, apply=False) for r in ranks]
    raw_lost = sum(a.record["raw_acausal_pairs"] for a in raw_al)
    assert raw_lost >= ranks[1].scope_links  # the −25 µs rank, at least (drift adds late pairs)
    assert write_merged(ranks, raw_al, tmp_path / "raw.json") == total
    raw = engine.load(tmp_path / "raw.json", [SCOPE_FLOWS, FLOW_STATS])
    assert raw.loaded, raw.summary()
    assert raw.flows == total - raw_lost  # Perfetto dropped exactly the acausal links ...
    assert raw.query(SCOPE_FLOWS).scalar() == links - raw_lost
    assert raw.query(FLOW_STATS).rows == (("flow_end_without_start", raw_lost),)  # ... as an info stat
    assert raw.ok  # and, being info-level, reports no import error: the loss is silent

    fixed_al = [align_rank(r) for r in ranks]
    assert all(a.correction is not None and not a.problems for a in fixed_al)
    assert write_merged(ranks, fixed_al, tmp_path / "aligned.json") == total
    fixed = engine.load(tmp_path / "aligned.json", [SCOPE_FLOWS, FLOW_STATS])
    assert fixed.ok, fixed.summary()
    assert fixed.flows == total and fixed.query(SCOPE_FLOWS).scalar() == links
    assert fixed.query(FLOW_STATS).rows == ()
    assert sum(a.record["pairs"] for a in fixed_al) == links
