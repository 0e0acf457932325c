"""Hostile inputs never fail the merge (issue 33): one bad event is dropped and counted, one bad file
is left out, each named on its own stderr line and in the manifest with the reason; the rest is
merged and the merge exits 0 (``--strict``: 1, with one line naming the file).

Fixtures are made by hand, each with one quirk, beside a good Kineto trace; the real CLI runs them.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl_trace_observer.merge.files.inflate import Oversized, RunGuard
from rl_trace_observer.merge.formats.base.chrome_json import WHY_DEEP, WHY_FIELDS, decode
from rl_trace_observer.merge.formats.base.json_split import split_document
from rl_trace_observer.merge.formats.rl_insight.format import WHY_DEEP_LINE
from rl_trace_observer.merge.job.counts import WHY_VALUES
from rl_trace_observer.merge.transform.passes import WHY_BAD_PID

from ..cli_run import rl_trace
from ..conftest import clean_env, need
from ..corpus.kineto_cpu import kineto_cpu_events

T0 = 1_764_000_000_000_000_000  # the good files' anchor (epoch ns)
GOOD = 187  # events of the good Kineto trace beside every bad file
NEST = "[" * 1200 + "]" * 1200  # args nested deeper than any recursive JSON decoder goes


def _kineto(pid: int, n: int, extra: list[str] = (), first: list[str] = ()) -> bytes:  # type: ignore[assignment]
    events = kineto_cpu_events(pid, n)
    body = ",".join(list(first) + [json.dumps(e) for e in events] + list(extra))
    head = f'{{"schemaVersion":1,"deviceProperties":[],"baseTimeNanoseconds":{T0},'
    return (head + '"traceEvents":[' + body + "]}").encode()


def _op(pid: int, ts: str = "1500.0", args: str = "{}", pid_text: str | None = None) -> str:
    """One Kineto op; ``pid_text``: what to write as its pid ("": none at all)."""
    who = "" if pid_text == "" else f'"pid":{pid_text or pid},'
    return f'{{"ph":"X","cat":"cpu_op","name":"bad",{who}"tid":{pid},"ts":{ts},"dur":5.0,"args":{args}}}'


# file name -> (bytes, the reason its one bad event is dropped for)
BAD_EVENTS: dict[str, tuple[bytes, str]] = {
    "no_pid_pid301.json": (_kineto(301, 50, [_op(301, pid_text="")]), WHY_BAD_PID),
    "deep_args_pid302.json": (_kineto(302, 50, [_op(302, args='{"a":' + NEST + "}")]), WHY_DEEP),
    "huge_ts_pid303.json": (_kineto(303, 50, [_op(303, ts="99999999999999999999999")]), WHY_VALUES),
    "nan_ts_pid304.json": (_kineto(304, 50, [_op(304, ts="NaN")]), WHY_FIELDS),
    "text_ts_pid305.json": (_kineto(305, 50, [_op(305, ts='"abc"')]), WHY_FIELDS),
    "huge_pid_pid306.json": (_kineto(306, 50, [_op(306, pid_text="99999999999999999999999")]), WHY_BAD_PID),
    # the file's first event, with neither pid nor tid (the fused loop once failed the whole file)
    "no_ids_first_pid307.json": (
        _kineto(307, 50, first=['{"ph":"X","cat":"cpu_op","name":"bad","ts":1500.0,"dur":5.0}']),
        WHY_BAD_PID,
    ),
}


def _rl_insight_log(pid: int) -> bytes:
    lines = [
        json.dumps(
            {"ph": "X", "name": f"s{i}", "pid": pid, "tid": 1, "ts_ns": T0 + 10**6 * i, "dur_ns": 1000}
        )
        for i in range(20)
    ]
    lines.append(
        f'{{"ph":"X","name":"deep","pid":{pid},"tid":1,"ts_ns":{T0},"dur_ns":5,"args":{{"a":{NEST}}}}}'
    )
    return ("\n".join(lines) + "\n").encode()


def _write_bad_events(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "good_pid200.json").write_bytes(_kineto(200, GOOD))
    for name, (data, _) in BAD_EVENTS.items():
        (root / name).write_bytes(data)
    (root / "rl-insight-h1-pid-310.chrome.jsonl").write_bytes(_rl_insight_log(310))
    return root


def _manifest(out: Path) -> dict[str, Any]:
    return json.loads(Path(f"{out}.manifest.json").read_text())


def _entries(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {Path(a["path"]).name: a for a in manifest["artifacts"]}


def _stderr_lines_naming(stderr: str, name: str) -> list[str]:
    return [line for line in stderr.splitlines() if f"/{name}:" in line]


@pytest.fixture(scope="module")
def bad_events(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The bad-event run merged by the CLI into both formats (and once with --strict)."""
    root = tmp_path_factory.mktemp("hostile")
    inputs = _write_bad_events(root / "in")
    runs = {}
    for fmt in ("json.gz", "pftrace"):
        out = root / f"out.{fmt}"
        runs[fmt] = (rl_trace("merge", str(inputs), "-o", str(out)), out)
    strict_out = root / "strict.json.gz"
    runs["strict"] = (rl_trace("merge", str(inputs), "-o", str(strict_out), "--strict"), strict_out)
    return {"inputs": inputs, "runs": runs, "root": root}


@pytest.mark.parametrize("fmt", ["json.gz", "pftrace"])
def test_one_bad_event_costs_only_itself(bad_events: dict[str, Any], fmt: str) -> None:
    proc, out = bad_events["runs"][fmt]
    assert proc.returncode == 0, proc.stderr
    manifest = _manifest(out)
    entries = _entries(manifest)
    assert entries["good_pid200.json"]["events"]["kept"] == GOOD
    # args nested 1,200 deep: Python 3.11's decoder hits its recursion limit and the event is dropped
    # and named; 3.12's C recursion is not bounded by it, so the event is read, kept and written whole
    deep = entries["deep_args_pid302.json"]
    deep_kept = (
        deep["events"]["kept"] == 51 and deep["events"]["dropped"] == 0 and not deep.get("dropped_why")
    )
    for name, (_, why) in BAD_EVENTS.items():
        entry = entries[name]
        if name == "deep_args_pid302.json" and deep_kept:
            continue
        assert entry["events"]["kept"] == 50 and entry["events"]["dropped"] == 1, (name, entry)
        assert entry["dropped_why"] == {why: 1}, (name, entry)
        (line,) = _stderr_lines_naming(proc.stderr, name)  # one line for the file, saying why
        assert "1 events left out" in line and why in line, line
    log = entries["rl-insight-h1-pid-310.chrome.jsonl"]
    log_kept = deep_kept and log["events"]["kept"] == 21 and not log.get("dropped_why")  # the same on 3.12
    assert log_kept or (log["events"]["kept"] == 20 and log["dropped_why"] == {WHY_DEEP_LINE: 1}), log
    assert manifest["counts"]["events_kept"] == GOOD + 50 * len(BAD_EVENTS) + 20 + int(deep_kept) + int(
        log_kept
    )


def test_strict_fails_naming_the_file(bad_events: dict[str, Any]) -> None:
    proc, _ = bad_events["runs"]["strict"]
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --strict: ") and "/in/" in last and "dropped_events" in last, last


def test_the_mixed_merge_loads_in_perfetto_with_no_error(bad_events: dict[str, Any], engine: Any) -> None:
    for fmt in ("json.gz", "pftrace"):
        _, out = bad_events["runs"][fmt]
        loaded = engine.load(out)
        assert loaded.ok, loaded.summary()
        assert loaded.slices == _manifest(out)["counts"]["slices"], loaded.summary()


def test_bad_events_do_not_reach_the_span_shards(bad_events: dict[str, Any]) -> None:
    need("pyarrow")
    root = bad_events["root"]
    out, shards = root / "sh.json.gz", root / "shards"
    proc = rl_trace("merge", str(bad_events["inputs"]), "-o", str(out), "--shards", str(shards))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((shards / "rl-trace-shards.json").read_text())
    assert doc["rows"] == _manifest(out)["counts"]["events_kept"]


# ------------------------------------------------------------------ the non-recursive JSON cut
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.text(max_size=8))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
events_lists = st.lists(st.dictionaries(st.text(max_size=6), json_values, max_size=5), max_size=8)
tops = st.dictionaries(st.text(max_size=8).filter(lambda k: k != "traceEvents"), json_values, max_size=4)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tops, events_lists, st.integers(0, 10**6), st.booleans())
def test_split_document_finds_every_event_and_top_value(
    top: dict[str, Any], events: list[dict[str, Any]], cut: int, spaced: bool
) -> None:
    """Every event and top-level value, exactly; a document cut anywhere gives a prefix of the events
    and never raises."""
    doc = {**top, "traceEvents": events}
    data = json.dumps(doc, indent=1 if spaced else None).encode()
    split = split_document(data)
    assert split is not None and split.complete
    assert [json.loads(e) for e in split.events] == events
    assert {k: json.loads(v) for k, v in split.top.items()} == top
    cut_at = cut % (len(data) + 1)
    partial = split_document(data[:cut_at])
    if partial is not None:
        got = [json.loads(e) for e in partial.events]
        assert got == events[: len(got)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.booleans(), min_size=1, max_size=8), st.integers(5000, 9000))
def test_a_deep_event_costs_itself_alone(deep_at: list[bool], depth: int) -> None:
    """Events nested deeper than the decoder's limit are dropped and counted; every other event is
    decoded, in order, and the top-level anchor is kept. (Deeper than ``NEST``: hypothesis raises the
    recursion limit while it runs a test.)"""
    nest = "[" * depth + "]" * depth
    raws = [
        f'{{"ph":"X","name":"e{i}","pid":1,"tid":1,"ts":{i},"dur":1'
        + (',"args":{"a":' + nest + "}" if deep else "")
        + "}"
        for i, deep in enumerate(deep_at)
    ]
    data = (f'{{"baseTimeNanoseconds":{T0},"traceEvents":[' + ",".join(raws) + "]}").encode()
    dec = decode(data, "x.json")
    assert [e.name for e in dec.doc.traceEvents] == [f"e{i}" for i, d in enumerate(deep_at) if not d]
    assert dec.dropped == sum(deep_at) and dec.dropped_why == (
        {WHY_DEEP: sum(deep_at)} if any(deep_at) else {}
    )
    assert dec.doc.baseTimeNanoseconds == T0
    msgspec.json.encode(dec.doc)  # what is kept can be written again


# ------------------------------------------------------------------ only regular files are read
SPECIAL_ENTRIES = {  # name -> the words its stderr line must hold
    "fifo.json": "a FIFO (named pipe), not a regular file",
    "loop_a.json": "a symlink loop",
    "loop_b.json": "a symlink loop",
    "dangling.json": "a dangling symlink",
    "dir_link": "a symlink to a directory",
    "locked_pid207.json": "cannot be read (Permission denied)",
}


def _write_special_entries(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "good_pid200.json").write_bytes(_kineto(200, GOOD))
    os.mkfifo(root / "fifo.json")
    (root / "loop_a.json").symlink_to("loop_b.json")
    (root / "loop_b.json").symlink_to("loop_a.json")
    (root / "dangling.json").symlink_to(root / "gone" / "x.json")
    elsewhere = root.parent / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "other_pid201.json").write_bytes(_kineto(201, 5))
    (root / "dir_link").symlink_to(elsewhere)
    locked = root / "locked_pid207.json"
    locked.write_bytes(_kineto(207, 5))
    locked.chmod(0)
    return root


def _without_file_override() -> list[str]:
    """A command prefix that takes away root's power to read any file (so chmod 000 means what it says
    for this test, which runs as root here); empty where we are not root, or setpriv is missing."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: a chmod 000 file stays readable")
    return [setpriv, "--bounding-set=-all", "--inh-caps=-all", "--"]


def test_only_regular_files_are_read(tmp_path: Path) -> None:
    """A FIFO never hangs the merge; a symlink loop never gives a traceback; each special entry is
    named on its own line with what it is, and left out; the good file is merged; exit 0."""
    inputs = _write_special_entries(tmp_path / "in")
    out = tmp_path / "out.json.gz"
    cli = [sys.executable, "-m", "rl_trace_observer.cli.main", "merge", str(inputs), "-o", str(out)]
    proc = subprocess.run(
        [*_without_file_override(), *cli],
        capture_output=True,
        text=True,
        timeout=60,  # a FIFO opened for reading would block here forever
        env=clean_env(),
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    entries = _entries(_manifest(out))
    assert entries["good_pid200.json"]["events"]["kept"] == GOOD
    for name, words in SPECIAL_ENTRIES.items():
        (line,) = _stderr_lines_naming(proc.stderr, name)
        assert line.startswith("warning: unreadable: ") and words in line, line
        assert entries[name]["selected"] is False and words in entries[name]["skip_reason"]


# ------------------------------------------------------------------ decompression bombs
def _gzip_stream(path: Path, parts: list[tuple[bytes, int]]) -> None:
    """Write a gzip file from (block, times) without ever holding what it inflates to."""
    with gzip.open(path, "wb", compresslevel=6) as f:
        for block, times in parts:
            for _ in range(times):
                f.write(block)


PEAK_RSS = """
import resource, subprocess, sys
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
sys.stderr.write(proc.stderr)
print(proc.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
"""


def _merge_peak(*args: str, prefix: list[str] | None = None) -> tuple[int, int, str]:
    """(exit code, peak RSS in bytes of the merge and its workers, stderr) of ``rl-trace merge ARGS``."""
    cli = [*(prefix or []), sys.executable, "-m", "rl_trace_observer.cli.main", "merge", *args]
    proc = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, *cli], capture_output=True, text=True, timeout=120, env=clean_env()
    )
    code, peak = proc.stdout.split()
    return int(code), int(peak), proc.stderr


def test_a_whitespace_bomb_is_left_out_without_taking_its_size(tmp_path: Path) -> None:
    """300 MiB of whitespace inside a trace's event array (a 300 KB .gz): before, held 2-3 times over
    (2.4 GB of RSS for 2.3 GB); now the read stops at the first 64 MiB run, names the file, and the
    good file beside it is merged."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "good_pid200.json").write_bytes(_kineto(200, GOOD))
    head = f'{{"schemaVersion":1,"baseTimeNanoseconds":{T0},"traceEvents":['.encode()
    _gzip_stream(inputs / "bomb_pid300.json.gz", [(head, 1), (b" " * (1 << 20), 300), (b"]}", 1)])
    assert (inputs / "bomb_pid300.json.gz").stat().st_size < 1 << 20
    out = tmp_path / "out.json.gz"
    code, peak, stderr = _merge_peak(str(inputs), "-o", str(out))
    assert code == 0, stderr
    (line,) = [x for x in _stderr_lines_naming(stderr, "bomb_pid300.json.gz") if "oversized" in x]
    assert "a run of over 64 MiB of whitespace" in line, line
    assert _entries(_manifest(out))["good_pid200.json"]["events"]["kept"] == GOOD
    assert peak < 300 << 20, f"peak RSS {peak >> 20} MiB"  # the bomb alone would be 300 MiB


def test_a_file_past_what_the_process_can_hold_is_left_out_not_the_merge(tmp_path: Path) -> None:
    """A .gz of 150 MiB of short events, merged by a process allowed 600 MiB of data (``prlimit``, as a
    container or ``ulimit`` would): before, the merge died of MemoryError and kept nothing, the good
    file beside it included; now that file is named (``oversized``, with the memory it would need)
    before it is read past the bound, and the rest is merged."""
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        pytest.skip("prlimit (util-linux) is not installed")
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "good_pid200.json").write_bytes(_kineto(200, GOOD))
    event = b'{"ph":"X","cat":"cpu_op","name":"op","pid":1,"tid":1,"ts":1000.5,"dur":5.0,"args":{"k":"v"}},'
    head = f'{{"baseTimeNanoseconds":{T0},"traceEvents":['.encode()
    blocks = (150 << 20) // (len(event) * 1000)
    _gzip_stream(inputs / "big_pid1.json.gz", [(head, 1), (event * 1000, blocks), (b"{}]}", 1)])
    out = tmp_path / "out.json.gz"
    code, peak, stderr = _merge_peak(
        str(inputs), "-o", str(out), prefix=[prlimit, f"--data={600 << 20}", "--"]
    )
    assert code == 0, stderr
    (line,) = _stderr_lines_naming(stderr, "big_pid1.json.gz")
    assert line.startswith("warning: oversized: ") and "memory this process may still use" in line, line
    assert _entries(_manifest(out))["good_pid200.json"]["events"]["kept"] == GOOD
    assert peak < 400 << 20, f"peak RSS {peak >> 20} MiB"  # stopped at the bound, not at 600 MiB


# ------------------------------------------------------------------ messages that say what is wrong
def test_each_message_says_what_is_wrong_with_that_file(tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "good_pid200.json").write_bytes(_kineto(200, GOOD))
    # fixed bytes: with os.urandom, the CI run of 255c6ce drew bytes after the broken header that read
    # as a gzip of nothing (also left out, with that message instead of this one)
    noise = gzip.compress(random.Random(36).randbytes(20_000), mtime=0)
    (inputs / "bad_header.json.gz").write_bytes(noise[:3] + b"\xff" + noise[4:])  # reserved flag bits
    (inputs / "empty.json").write_bytes(b"")
    (inputs / "empty.json.gz").write_bytes(gzip.compress(b""))
    (inputs / "blank.json").write_bytes(b" \n\n ")
    whole = _kineto(300, 400).decode()
    anchor_last = whole.replace(f'"baseTimeNanoseconds":{T0},', "")[:-1] + f',"baseTimeNanoseconds":{T0}}}'
    (inputs / "cut_anchor_last_pid300.json").write_text(anchor_last[: len(anchor_last) // 2])
    out = tmp_path / "out.json.gz"
    proc = rl_trace("merge", str(inputs), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    said = {
        "bad_header.json.gz": "unreadable: .* starts like gzip but does not inflate",
        "empty.json": r"incomplete: .* empty file \(0 bytes",
        "empty.json.gz": r"incomplete: .* a gzip stream of nothing \(20 bytes stored, 0 inflated\)",
        "blank.json": r"incomplete: .* holds only whitespace \(4 bytes\)",
    }
    for name, pattern in said.items():
        (line,) = _stderr_lines_naming(proc.stderr, name)
        assert re.search(pattern, line), line
    cut = _stderr_lines_naming(proc.stderr, "cut_anchor_last_pid300.json")
    assert any(re.search(r"JSON ends early, after \d+ whole events", x) for x in cut), cut
    assert any("none of its" in x and "cut short" in x for x in cut), cut
    assert "kept the" not in proc.stderr  # it kept none of them
    assert _entries(_manifest(out))["cut_anchor_last_pid300.json"]["events"]["kept"] == 0


# ------------------------------------------------------------------ the bomb guard, on any cut
def _longest_run(data: bytes) -> int:
    """The longest run of JSON whitespace, or of one other byte repeated."""
    best = run = 0
    prev = None
    for b in data:
        cls = "ws" if b in b" \t\r\n" else b
        run = run + 1 if cls == prev else 1
        prev = cls
        best = max(best, run)
    return best


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([b" ", b"\n", b"\t", b"a", b"{", b"\0"]), st.integers(1, 40)), max_size=30
    ),
    st.integers(8, 40),
    st.randoms(use_true_random=False),
)
def test_the_run_guard_stops_exactly_past_its_bound(
    pieces: list[tuple[bytes, int]], limit: int, rnd: random.Random
) -> None:
    """However the bytes are cut into blocks (none longer than the bound, as inflate's are), the guard
    stops a file iff it holds a run longer than the bound."""
    data = b"".join(c * n for c, n in pieces)
    guard = RunGuard(limit)
    at, stopped = 0, False
    try:
        while at < len(data):
            step = rnd.randint(1, limit)
            guard.feed(data[at : at + step])
            at += step
    except Oversized:
        stopped = True
    assert stopped == (_longest_run(data) > limit)


def test_a_file_that_breaks_a_stage_is_left_out_not_the_merge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last line of defence, for a case no reader foresaw: a reader that raises (here made to, for
    one file) costs that file alone, named with what broke; the others are merged."""
    from rl_trace_observer.merge.formats import format_for
    from rl_trace_observer.merge.options import MergeOptions
    from rl_trace_observer.merge.pipeline import merge

    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "good_pid200.json").write_bytes(_kineto(200, GOOD))
    (inputs / "breaks_pid300.json").write_bytes(_kineto(300, 50))
    kineto = format_for("torch")
    real_read = kineto.read

    def read(data: bytes, ctx: Any) -> Any:
        if ctx.name.startswith("breaks"):
            raise TypeError("an unforeseen case")
        return real_read(data, ctx)

    monkeypatch.setattr(kineto, "read", read)
    res = merge([str(inputs)], str(tmp_path / "out.json.gz"), MergeOptions(workers=0))
    assert res.exit_code == 0
    entries = _entries(res.manifest)
    assert entries["good_pid200.json"]["events"]["kept"] == GOOD
    assert entries["breaks_pid300.json"]["events"]["kept"] == 0
    (problem,) = [p for p in res.manifest["problems"] if p["path"].endswith("breaks_pid300.json")]
    assert problem["kind"] == "not_a_trace" and "TypeError: an unforeseen case" in problem["detail"]
