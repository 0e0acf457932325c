"""AReaL's two files read by their formats: property tests for both parsers and the clock bracket.

The parsers take whatever a killed, full or hand-edited disk leaves: a torn last line, garbage lines
anywhere. Every line is either read or counted under a named reason with its line number; nothing
raises. The bracket (a perf trace placed on its session file) always contains the true offset when
the sessions lie inside the rollout batches, as AReaL's synchronous rollout guarantees.
"""

from __future__ import annotations

import json

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trace_observer.capture.requests import CLIENT_SPAN, PHASE_CAT
from rl_trace_observer.merge.formats import ReadContext
from rl_trace_observer.merge.formats.areal import AReaLPerf, AReaLSessions
from rl_trace_observer.merge.formats.areal.layout import perf_place, session_place
from rl_trace_observer.merge.formats.areal.pairing import bracket

SESSIONS = AReaLSessions()
PERF = AReaLPerf()
T0 = 1_780_000_000.0
PERF_PATH = "/r/logs/u/exp/trial/perf_tracer/rollout/traces-r3.jsonl"
SESSIONS_PATH = "/r/logs/u/exp/trial/session_tracer/rollout/sessions-r3.jsonl"

garbage = st.binary(min_size=1, max_size=40).filter(lambda b: b"\n" not in b and b.strip() != b"")


def _session(i: int, status: str = "accepted") -> dict[str, object]:
    submit = T0 + i * 0.01
    return {
        "task_id": i // 2, "session_id": i, "rank": 3, "role": "rollout", "status": status,
        "submit_ts": submit, "finalized_ts": submit + 0.008,
        "phases": {"generate": [{"start_ts": submit + 0.001, "end_ts": submit + 0.005}],
                   "reward": [{"start_ts": submit + 0.005, "end_ts": submit + 0.007}]},
    }  # fmt: skip


def _decodes(line: bytes) -> bool:
    try:
        json.loads(line)
        return True
    except ValueError:
        return False


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(0, 12),
    junk=st.lists(st.tuples(st.integers(0, 12), garbage), max_size=6),
    cut=st.integers(1, 60) | st.none(),
)
def test_session_file_lines_are_read_or_counted_and_named(
    n: int, junk: list[tuple[int, bytes]], cut: int | None
) -> None:
    lines = [json.dumps(_session(i)).encode() for i in range(n)]
    bad = 0
    for at, raw in junk:
        if not _decodes(raw):
            lines.insert(min(at, len(lines)), raw)
            bad += 1
    data = b"\n".join(lines) + b"\n"
    torn = False
    if cut is not None and n:
        last = json.dumps(_session(n)).encode()
        data += last[: min(cut, len(last) - 1)]  # a writer killed mid-line
        torn = True
    res = SESSIONS.read(data, ReadContext(SESSIONS_PATH, "sessions-r3.jsonl"))
    spans = [e for e in res.events if e.name == CLIENT_SPAN]
    assert len(spans) == n
    assert res.dropped == bad + torn
    assert res.complete is (not torn)
    kinds = {p.kind for p in res.problems}
    assert ("incomplete" in kinds) is torn
    if bad:
        (detail,) = [p.detail for p in res.problems if p.kind == "dropped_events"]
        assert "line" in detail and any(ch.isdigit() for ch in detail)
    assert all(isinstance(e.ts, int) for e in res.events)


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(0, 10),
    junk=st.lists(st.tuples(st.integers(0, 10), garbage), max_size=6),
    cut=st.integers(1, 40) | st.none(),
)
def test_perf_trace_lines_are_read_or_counted_and_named(
    n: int, junk: list[tuple[int, bytes]], cut: int | None
) -> None:
    def span(i: int) -> bytes:
        e = {"name": f"s{i}", "ph": "X", "ts": 100 * i, "dur": 50, "pid": 9, "tid": 9, "cat": "compute",
             "args": {"rank": 3, "global_step": i // 3}}  # fmt: skip
        return json.dumps(e).encode()

    lines = [span(i) for i in range(n)]
    bad = 0
    for at, raw in junk:
        if not _decodes(raw):
            lines.insert(min(at, len(lines)), raw)
            bad += 1
    data = b"\n".join(lines) + b"\n" if lines else b""
    torn = cut is not None and n > 0
    if torn:
        data += span(n)[:cut]  # type: ignore[index]
    res = PERF.read(data, ReadContext(PERF_PATH, "traces-r3.jsonl", anchor_ns=T0_NS))
    assert not res.skip
    assert res.dropped == bad + torn
    assert res.complete is (not torn)
    plain = [e for e in res.events if e.name != "global_step"]
    assert len(plain) == n
    assert all(isinstance(e.ts, int) and e.ts >= T0_NS for e in res.events)
    steps = {msgspec.json.decode(bytes(e.args))["step"] for e in res.events if e.name == "global_step"}
    assert steps == {i // 3 for i in range(n)}


T0_NS = int(T0 * 1e9)


def test_a_perf_trace_with_no_anchor_and_no_session_file_is_not_guessed() -> None:
    data = b'{"name": "a", "ph": "X", "ts": 5, "dur": 1, "pid": 1, "tid": 1, "cat": "misc", "args": {}}\n'
    res = PERF.read(data, ReadContext(PERF_PATH, "traces-r3.jsonl"))
    assert res.skip and [p.kind for p in res.problems] == ["unanchored"]
    assert "role rollout rank 3" in res.problems[0].detail


def test_sessions_become_request_spans_with_phases_inside_and_rejections_marked() -> None:
    rows = [_session(0), _session(1, "rejected") | {"reason": "rejected"}, _session(2)]
    rows[2]["submit_ts"] = rows[0]["submit_ts"]  # overlaps session 0: another lane
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    res = SESSIONS.read(data, ReadContext(SESSIONS_PATH, "sessions-r3.jsonl", owner_pid=77))
    spans = [e for e in res.events if e.name == CLIENT_SPAN]
    assert {e.pid for e in res.events} == {77}
    assert len({e.tid for e in spans}) == 2  # two lanes: overlapping sessions never share one
    for s in spans:
        for p in (e for e in res.events if e.cat == PHASE_CAT and e.tid == s.tid):
            if s.ts <= p.ts < s.ts + s.dur:
                assert p.ts + p.dur <= s.ts + s.dur
    rejected = [e for e in res.events if e.ph == "i"]
    assert [e.name for e in rejected] == ["rejected: rejected"]
    args = [msgspec.json.decode(bytes(e.args)) for e in spans]
    assert sum(a.get("rejected", False) for a in args) == 1
    assert res.meta["manifest_entry"]["areal_sessions"]["status"] == {"accepted": 2, "rejected: rejected": 1}


def test_paths_say_rank_role_and_trial() -> None:
    p, s = perf_place(PERF_PATH), session_place(SESSIONS_PATH)
    assert (p.rank, p.role, p.trial) == (3, "rollout", "/r/logs/u/exp/trial")
    assert p.key == s.key
    flat = perf_place("/r/t/perf_tracer/traces-r0.jsonl")
    assert (flat.rank, flat.role, flat.trial) == (0, None, "/r/t")


@settings(max_examples=200, deadline=None)
@given(
    offset=st.integers(-(10**15), 10**15),
    batches=st.lists(
        st.tuples(st.integers(1_000, 10**7), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)),
                                                        min_size=1, max_size=5)),
        min_size=1, max_size=6,
    ),
)  # fmt: skip
def test_the_bracket_always_holds_the_true_offset(offset: int, batches: list) -> None:  # type: ignore[type-arg]
    containers, sessions, t = [], [], 0
    for length, inner in batches:
        start, end = t, t + length + 2 * 10**6
        containers.append((start, end))
        for a, b in inner:
            sub, fin = start + min(a, b), end - max(a, b) // 2
            sessions.append((sub + offset, max(sub, fin) + offset))
        t = end + 5_000
    found = bracket(containers, sessions)
    assert found is not None and found.ranges
    assert any(lo <= offset <= hi for lo, hi in found.ranges)


def test_the_bracket_says_when_nothing_fits() -> None:
    found = bracket([(0, 10)], [(0, 100)])  # a session longer than every batch
    assert found is not None and found.ranges == ()
    assert bracket([], [(0, 1)]) is None


def test_the_watch_keeps_relative_step_spans_until_their_anchor_is_known() -> None:
    from rl_trace_observer.analysis.live.seen import Seen

    seen = Seen()
    line = {"name": "train.rollout", "ph": "X", "ts": 1000, "dur": 500, "pid": 1, "tid": 1,
            "args": {"global_step": 4, "rank": 0}}  # fmt: skip
    seen.line("areal/traces-r0.jsonl", 1, json.dumps(line).encode())
    assert seen.windows() == [] and seen.waiting
    again = Seen.from_json(json.loads(json.dumps(seen.to_json())))  # a restarted watch keeps it
    assert again.place({"areal/traces-r0.jsonl": T0_NS})
    (w,) = again.windows()
    assert (w.step, w.start_ns, w.end_ns) == (4, T0_NS + 1_000_000, T0_NS + 1_500_000)
    assert not again.waiting


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=3000))
def test_any_bytes_are_read_without_raising(data: bytes) -> None:
    for fmt, path in ((PERF, PERF_PATH), (SESSIONS, SESSIONS_PATH)):
        res = fmt.read(data, ReadContext(path, path.rsplit("/", 1)[1], anchor_ns=T0_NS))
        assert all(isinstance(e.ts, int) for e in res.events)
        assert res.dropped == sum(res.dropped_why.values())
