"""Each merge pass on a handful of hand-built events, and on none; plus the small pure helpers."""

from __future__ import annotations

import gzip
import io
import zlib

import pytest
from msgspec import UNSET, Raw

from rl_trace_observer.merge.formats import format_for
from rl_trace_observer.merge.formats.base import ReadContext, ReadResult
from rl_trace_observer.merge.manifest.document import LINES_PER_KIND, problem_summary
from rl_trace_observer.merge.output import compress
from rl_trace_observer.merge.timeline import identity
from rl_trace_observer.merge.timeline.model import Event, ProcessKey, us_to_ns
from rl_trace_observer.merge.transform import nesting, passes

T0 = 1_700_000_000_000_000_000


def X(name: str, ts: int, dur: int, pid: int = 10, tid: int = 1, **kw: object) -> Event:
    return Event(ph="X", name=name, pid=pid, tid=tid, ts=T0 + ts, dur=dur, **kw)  # type: ignore[arg-type]


def flow(ph: str, fid: int, ts: int, tid: int = 1, name: str = "launch->kernel", cat: str = "flow") -> Event:
    return Event(ph=ph, name=name, cat=cat, id=fid, pid=10, tid=tid, ts=T0 + ts, bp="e")


@pytest.mark.parametrize("p", passes.PASSES)
def test_every_pass_accepts_no_events(p: object) -> None:
    ctx = passes.PassContext(windows=((0, 1),), min_dur_ns=5, scopes={}, collect_scopes=False)
    assert p([], ctx) == []  # type: ignore[operator]


def test_correct_time_offset_and_function() -> None:
    events = [X("a", 0, 100), Event(ph="i", ts=T0 + 50, pid=1, tid=1)]
    out = passes.correct_time(events, passes.PassContext(correction=passes.TimeCorrection(offset_ns=-7)))
    assert [e.ts for e in out] == [T0 - 7, T0 + 43] and out[0].dur == 100
    drift = passes.TimeCorrection(fn=lambda t: t + (t - T0) // 100)  # 1% fast after T0
    (e,) = passes.correct_time([X("a", 1000, 1000)], passes.PassContext(correction=drift))
    assert (e.ts, e.dur) == (T0 + 1010, 1010)  # the end is corrected too: the duration follows drift
    same = [X("a", 0, 1)]
    assert passes.correct_time(same, passes.PassContext()) is same  # identity: untouched


def test_filter_events_windows_and_min_duration() -> None:
    events = [X("early", 0, 10), X("short", 100, 2), X("long", 100, 50), Event(ph="B", ts=T0, pid=1, tid=1)]
    ctx = passes.PassContext(windows=((T0 + 90, T0 + 200),), min_dur_ns=5)
    out = passes.filter_events(events, ctx)
    assert [e.name if e.name is not UNSET else e.ph for e in out] == ["long", "B"]
    assert ctx.stats["filtered"] == 2


def test_namespace_ids_splits_reused_ids_and_separates_artifacts() -> None:
    # Proton: one launch id used for two kernels (s f s f), and again in another file.
    a = [flow("s", 1, 0), flow("f", 1, 10, tid=2), flow("s", 1, 20), flow("f", 1, 30, tid=2)]
    b = [flow("s", 1, 0), flow("f", 1, 10, tid=2)]
    ca, cb = passes.PassContext(namespace=1), passes.PassContext(namespace=2)
    passes.namespace_ids(a, ca)
    passes.namespace_ids(b, cb)
    assert a[0].id == a[1].id != a[2].id == a[3].id
    assert not {e.id for e in a} & {e.id for e in b}
    assert ca.stats["flows"] == 2 and cb.stats["flows"] == 1
    # Kineto order: an end listed before its start still pairs with it.
    k = [flow("f", 9, 10, tid=2), flow("s", 9, 0)]
    passes.namespace_ids(k, passes.PassContext(namespace=3))
    assert k[0].id == k[1].id


def test_namespace_ids_one_start_many_ends_is_one_flow_per_end() -> None:
    """A CUDA-graph launch: one ``s``, one ``f`` per kernel of the graph, all with the launch's id.
    Perfetto links every end to the start: same id, one link per end; a new start splits."""
    events = [flow("s", 5, 0)] + [flow("f", 5, 10 + k, tid=2) for k in range(3)] + [flow("s", 5, 20)]
    ctx = passes.PassContext(namespace=1)
    passes.namespace_ids(events, ctx)
    assert len({e.id for e in events[:4]}) == 1 and events[4].id != events[0].id
    assert ctx.stats["flows"] == 3 and ctx.stats["unpaired_flow_events"] == 1


def test_move_overlaps_follows_perfettos_stack_rule() -> None:
    """Start order, longer first at equal starts; a slice ending after the open one (which Perfetto
    would drop) goes to the thread's overlap track, named after it and sorted beside it, with the flow
    events bound to it: the last slice to start at or before a flow's time, or (an ``f`` without
    ``bp: "e"``) the next one to start."""
    events = [
        X("child-first", 0, 10),  # the longer one at the same start is its parent, whatever the order
        X("parent", 0, 100),
        X("inside", 20, 10),
        X("overlaps", 95, 10),  # starts in the parent, ends after it: Perfetto would drop it
        flow("f", 7, 95),  # its launch arrow ends on it
        flow("s", 8, 97),  # a flow leaving from it (the last slice to start before 97)
        flow("s", 9, 30),  # from "inside" (ended at 30, still the newest on the stack): stays
        Event(ph="f", name="launch->kernel", cat="flow", id=6, pid=10, tid=1, ts=T0 + 90),  # binds next
        X("after", 100, 5),  # the parent has ended: a new top-level slice
        X("other thread", 95, 10, tid=2),
    ]
    mapper = _mapper()
    mapper.threads[(10, 1)] = identity.ThreadDecl(10, 1, "Torch · stream 7", 42)
    ctx = passes.PassContext(mapper=mapper)
    kept = passes.move_overlaps(events, ctx)
    side = identity.overlap_tid(1, 1)
    assert [(e.name, e.ph, e.id if e.ph != "X" else None) for e in kept if e.tid == side] == [
        ("overlaps", "X", None),
        ("launch->kernel", "f", 7),
        ("launch->kernel", "s", 8),
        ("launch->kernel", "f", 6),
    ]
    assert len(kept) == len(events)  # nothing is dropped
    assert mapper.threads[(10, side)] == identity.ThreadDecl(10, side, "Torch · stream 7 (overlap)", 42)
    assert ctx.stats == {"overlap_moved": 1, "overlap_tracks": 1}


def test_move_overlaps_stacks_layers_and_drops_only_past_the_last() -> None:
    """Slices that all overlap each other: one overlap track each, up to the limit; past it, dropped
    and counted (never seen in a real trace: consecutive kernels need one)."""
    n = nesting.MAX_OVERLAP_LAYERS + 3
    events = [X(f"s{k}", k, 1000) for k in range(n)]
    ctx = passes.PassContext(mapper=_mapper())
    kept = passes.move_overlaps(events, ctx)
    assert len(kept) == nesting.MAX_OVERLAP_LAYERS + 1
    assert len({e.tid for e in kept}) == nesting.MAX_OVERLAP_LAYERS + 1
    assert ctx.stats == {
        "overlap_moved": nesting.MAX_OVERLAP_LAYERS,
        "overlap_tracks": nesting.MAX_OVERLAP_LAYERS,
        "overlapping_slices": 2,
    }


def _mapper() -> passes.IdentityMapper:
    torch = format_for("torch")
    return passes.IdentityMapper(torch, ReadResult(), ReadContext("f", "f"), "h", 256, None, {})


def test_namespace_ids_async_and_bind_ids() -> None:
    ev = [
        Event(ph="b", cat="req", id="0x1", ts=T0, pid=1, tid=1),
        Event(ph="e", cat="req", id="0x1", ts=T0 + 5, pid=1, tid=1),
        X("out", 0, 5, bind_id=4, flow_out=True),
        X("in", 10, 5, bind_id=4, flow_in=True),
    ]
    ctx = passes.PassContext(namespace=5)
    passes.namespace_ids(ev, ctx)
    assert ev[0].id == ev[1].id and isinstance(ev[0].id, int) and ev[0].id >> 40 == 5
    assert ev[2].bind_id == ev[3].bind_id and ev[2].bind_id >> 40 == 5  # type: ignore[operator]
    assert ctx.stats["flows"] == 1


def test_link_scopes_ends_on_the_proton_scope_and_links_within_the_rank() -> None:
    scope = X("attention", 5, 50, pid=0, tid=7, cat="scope", args=Raw(b'{"scope_id": 42}'))
    proton = passes.PassContext(collect_scopes=True, scope_namespace=3)
    out = passes.link_scopes([scope], proton)
    assert proton.scopes == {42}
    end = out[1]
    assert (end.ph, end.pid, end.tid, end.ts, end.bp) == ("f", 0, 7, T0 + 5, "e")
    starts = [
        Event(ph="s", name=passes.SCOPE_FLOW_NAME, cat=passes.SCOPE_FLOW_CAT, id=42, ts=T0 + 4, pid=9, tid=9),
        Event(ph="s", name=passes.SCOPE_FLOW_NAME, cat=passes.SCOPE_FLOW_CAT, id=43, ts=T0 + 4, pid=9, tid=9),
    ]
    viz = passes.PassContext(scopes=proton.scopes, scope_namespace=3)
    linked = passes.link_scopes(starts, viz)
    assert [e.id for e in linked] == [end.id]  # scope 43 was never recorded by Proton: dropped
    assert viz.stats == {"unlinked_scope_flows": 1, "flows": 1, "scope_links": 1}
    other_rank = passes.PassContext(collect_scopes=True, scope_namespace=4)
    assert (
        passes.link_scopes(
            [X("a", 5, 50, pid=0, tid=7, cat="scope", args=Raw(b'{"scope_id": 42}'))], other_rank
        )[1].id
        != end.id
    )


def test_remap_identity_gpu_lanes_under_owner_and_threads_per_source() -> None:
    kineto = format_for("torch")
    res = ReadResult(
        process_labels={0: "GPU 0", 1234: "CPU"}, thread_names={(1234, 1234): "thread 1234 (python)"}
    )
    mapper = passes.IdentityMapper(
        kineto,
        res,
        ReadContext("p", "n", owner_pid=1234),
        "h",
        512,
        ProcessKey("h", 1234),
        {ProcessKey("h", 1234): 512},
    )
    ev = [X("op", 0, 5, pid=1234, tid=1234), X("kernel", 1, 2, pid=0, tid=7)]
    passes.remap_identity(ev, passes.PassContext(mapper=mapper))
    assert ev[0].pid == 512 and ev[1].pid == 512 + identity.sub_slot("GPU 0")
    assert ev[0].tid == identity.merged_tid(kineto.order, 1234)
    names = {t.name for t in mapper.threads.values()}
    assert names == {"Torch · thread 1234 (python)", "Torch · stream 7"}


def test_identity_numbers_fit_and_never_collide_across_hosts() -> None:
    """pids (and their sub-processes) below 2**31: ``.pftrace`` holds them as int32, JSON as uint32."""
    a, b = identity.fallback_pid(ProcessKey("a", 1)), identity.fallback_pid(ProcessKey("b", 1))
    assert a != b and 2**30 <= a < 2**31 - 255 and 2**30 <= b < 2**31 - 255
    assert identity.planned_pid(0) == 256 and identity.planned_pid(identity.PLANNED_LIMIT - 1) + 255 < 2**30
    assert identity.merged_tid(15, 2**28 - 1) < 2**32 and identity.merged_tid(1, "lane") < 2**32
    assert len({identity.sub_slot(f"GPU {i}") for i in range(8)} | {identity.sub_slot("Proton")}) == 9


def test_us_to_ns_is_exact_for_kineto_relative_times() -> None:
    for ns in (5_113_223_833_696_262, 7_999_999_999_999_999, 1, 999):
        us = float(f"{ns // 1000}.{ns % 1000:03d}")
        assert us_to_ns(us) == ns


def test_gzip_pieces_make_one_member() -> None:
    buf = io.BytesIO()
    member = compress.GzipMember(buf)
    member.write(b"head,")
    member.write_piece(*compress.deflate_piece(b"x" * 100_000))
    member.write(b"tail")
    member.close()
    data = buf.getvalue()
    assert gzip.decompress(data) == b"head," + b"x" * 100_000 + b"tail"
    dec = zlib.decompressobj(31)
    dec.decompress(data)
    assert dec.eof and dec.unused_data == b""  # exactly one member


def test_problem_summary_is_one_line_per_file_and_kind() -> None:
    """Each file with a problem is named on its own line (what is wrong with THAT file), up to
    LINES_PER_KIND per kind; the rest are counted, and all listed in the manifest."""
    lines = problem_summary(
        [
            {"kind": "unlinked", "path": "a.json", "detail": "x"},
            {"kind": "unlinked", "path": "b.json", "detail": "y"},
            {"kind": "incomplete", "path": "c.json.gz", "detail": "z"},
            {"kind": "clock", "path": "h1", "detail": "u"},
            {"kind": "clock", "path": "h2", "detail": "v"},
        ]
    )
    assert lines == [
        "unlinked: a.json: x",
        "unlinked: b.json: y",
        "incomplete: c.json.gz: z",
        "clock: h1: u (+1 more in the manifest)",  # the run's own problems: one line per kind
    ]
    many = [{"kind": "unlinked", "path": f"{i}.json", "detail": "x"} for i in range(LINES_PER_KIND + 3)]
    lines = problem_summary(many)
    assert len(lines) == LINES_PER_KIND + 1 and lines[-1] == "unlinked: +3 more files in the manifest"


def test_drop_unbound_flows_leaves_out_what_no_slice_can_take() -> None:
    """A flow event binds to the slice on top of its thread's stack: none before it on its thread
    (a thread of flows only, or a flow before the first slice) means Perfetto drops it; so do we."""
    events = [
        X("launch", 10, 5),
        flow("s", 1, 10),  # at its slice's start: bound
        flow("s", 2, 30),  # after it (the slice ended, still the newest): bound
        flow("s", 3, 5),  # before any slice of its thread
        flow("s", 4, 50, tid=9),  # a thread with no slice at all
        flow("f", 4, 50, tid=2),  # bp "e" on a thread with no slice
        Event(ph="f", name="launch->kernel", cat="flow", id=5, pid=10, tid=2, ts=T0),  # binds next: kept
    ]
    ctx = passes.PassContext()
    kept = passes.drop_unbound_flows(events, ctx)
    assert [(e.ph, e.id) for e in kept] == [("X", UNSET), ("s", 1), ("s", 2), ("f", 5)]
    assert ctx.stats == {"unbound_flow_events": 3, "flows": -1, "unpaired_flow_events": -1}  # 4 was a link


def test_a_numeric_text_tid_is_the_same_thread() -> None:
    """torch 1.8-1.9 write ``"tid": "24572"`` on slices and ``24572`` on their flow starts."""
    assert identity.same_thread("24572") == 24572 and identity.same_thread(24572) == 24572
    assert (
        identity.same_thread("stream 7") == "stream 7"
        and identity.same_thread("99999999999") == "99999999999"
    )
    mapper = _mapper()
    assert mapper.resolve(5, "24572") == mapper.resolve(5, 24572)
