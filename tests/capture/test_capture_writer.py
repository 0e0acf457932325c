"""The capture writer: line framing on a disk that fills and frees, the bounded buffer, removed
files, a drain that dies or cannot start, and forked children (real files and processes)."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl_trace_observer.capture import frames
from rl_trace_observer.capture.line_file import LineFile
from rl_trace_observer.capture.sink import Sink

from ..capture_helpers import process_gone, traced, wait_until
from ..conftest import clean_env
from ..trace_files import event_logs, process_records, spans


# ------------------------------------------------------------------ a disk that fills and frees
class FakeDisk:
    """One file on a disk with ``free`` bytes left: a write takes what fits (a short write), or
    fails with ENOSPC when nothing fits, or with EIO when told to; truncating frees space (and may
    itself fail). Speaks the ``os`` calls :class:`LineFile` makes."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.free = 0
        self.fail_next: int | None = None  # errno for the next write
        self.truncate_fails = False
        self.open_fd: int | None = None

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        pass

    def open(self, path: str, flags: int, mode: int = 0o777) -> int:
        self.open_fd = 3
        return 3

    def close(self, fd: int) -> None:
        self.open_fd = None

    def write(self, fd: int, data: Any) -> int:
        if self.fail_next is not None:
            code, self.fail_next = self.fail_next, None
            raise OSError(code, os.strerror(code))
        n = min(len(data), self.free)
        if n == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.data += bytes(data[:n])
        self.free -= n
        return n

    def ftruncate(self, fd: int, length: int) -> None:
        if self.truncate_fails:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        self.free += len(self.data) - length
        del self.data[length:]

    def pread(self, fd: int, n: int, offset: int) -> bytes:
        return bytes(self.data[offset : offset + n])

    def fstat(self, fd: int) -> Any:
        return SimpleNamespace(st_size=len(self.data), st_nlink=1, st_dev=1, st_ino=1)

    def stat(self, path: str) -> Any:
        return self.fstat(3)


def _line(i: int, pad: int) -> bytes:
    return json.dumps({"i": i, "pad": "x" * pad}).encode() + b"\n"


STEP = st.one_of(
    st.tuples(st.just("batch"), st.lists(st.integers(0, 300), min_size=1, max_size=12)),
    st.tuples(st.just("free"), st.integers(0, 4000)),  # space returns (or a little of it)
    st.tuples(st.just("fail"), st.sampled_from([errno.ENOSPC, errno.EIO, errno.EDQUOT])),
    st.tuples(st.just("truncate_fails"), st.booleans()),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(STEP, min_size=1, max_size=40), start_free=st.integers(0, 3000))
def test_framing_keeps_only_whole_lines_and_counts_honestly(steps: list[Any], start_free: int) -> None:
    """Random short writes, ENOSPC, EIO and failing truncates: the file only ever holds whole lines,
    in the order they were sent; ``written`` is exactly the lines in it; ``dropped`` the rest."""
    disk = FakeDisk()
    disk.free = start_free
    answers: list[dict[str, Any]] = []
    sink = Sink(1 << 30, answers.append, ops=disk)
    spec = json.dumps({"path": "/d/log.jsonl", "record": None, "resume": False}).encode()
    sink.handle([frames.Frame(frames.OPEN, 1, 0, 0, 0, spec)])
    sent: list[bytes] = []
    for kind, arg in steps:
        if kind == "batch":
            lines = [_line(len(sent) + k, pad) for k, pad in enumerate(arg)]
            sent += lines
            sink.handle([frames.Frame(frames.LINES, 1, len(sent), len(lines), 0, b"".join(lines))])
            sink._streams[1].retry_at = 0.0  # reopen at once after an error (the writer waits ~1 s)
        elif kind == "free":
            disk.free += arg
        elif kind == "fail":
            disk.fail_next = arg
        else:
            disk.truncate_fails = arg
        fragment = bytes(disk.data).rpartition(b"\n")[2]
        if disk.open_fd is not None:  # while open, never a fragment; a closed file is repaired on open
            assert fragment == b""
    sink.handle([frames.Frame(frames.SYNC, 0, 7, 0, 0, b"")])
    disk.truncate_fails, disk.free = False, 1 << 20
    sink._streams[1].file.open()  # a later open repairs any fragment a failed truncate left
    content = bytes(disk.data)
    assert content == b"" or content.endswith(b"\n")
    on_disk = content.splitlines(keepends=True)
    assert all(json.loads(line) for line in on_disk)  # every line parses
    it = iter(sent)
    assert all(line in it for line in on_disk), "lines on disk are sent lines, in order, none cut"
    written, dropped = answers[-1]["counts"]["1"]  # what the drain sends back as JSON
    assert written == len(on_disk) and dropped == len(sent) - written


def test_a_short_write_is_cut_back_to_its_last_whole_line() -> None:
    disk = FakeDisk()
    disk.free = 25
    lf = LineFile("/d/x.jsonl", ops=disk)
    lf.open()
    written, err = lf.append(b'{"a":1}\n{"b":22}\n{"c":333}\n', 3)
    assert bytes(disk.data) == b'{"a":1}\n{"b":22}\n' and written == 2 and lf.lines == 2
    assert err is not None and err.errno == errno.ENOSPC
    disk.free = 100
    assert lf.append(b'{"d":4}\n', 1) == (1, None)
    assert bytes(disk.data) == b'{"a":1}\n{"b":22}\n{"d":4}\n'  # nothing glued onto a fragment


def test_open_repairs_a_cut_tail_and_a_resuming_writer_counts_its_lines(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"a":1}\n{"b":2}\n{"c":')  # a writer killed between short write and truncate
    lf = LineFile(str(path))
    assert not lf.open(existing_lines_are_ours=True)
    assert path.read_bytes() == b'{"a":1}\n{"b":2}\n' and lf.lines == 2
    other = LineFile(str(path))
    other.open()  # a new stream on an existing file: lines there are not its own
    assert other.lines == 0
    lf.close()
    other.close()


# ------------------------------------------------------------------ the sink on real files
def _sink(answers: list[dict[str, Any]], cap: int = 1 << 30) -> Sink:
    return Sink(cap, answers.append)


def _open(sink: Sink, sid: int, path: Path, record: Path | None = None) -> None:
    spec = {"path": str(path), "record": str(record) if record else None, "resume": False}
    sink.handle([frames.Frame(frames.OPEN, sid, 0, 0, 0, json.dumps(spec).encode())])


def _lines(sid: int, emitted: int, lines: list[bytes]) -> frames.Frame:
    return frames.Frame(frames.LINES, sid, emitted, len(lines), 0, b"".join(lines))


def test_a_removed_directory_is_detected_and_a_new_file_starts_with_the_lane_names(tmp_path: Path) -> None:
    out = tmp_path / "out"
    log, record = out / "log.jsonl", out / "record.json"
    answers: list[dict[str, Any]] = []
    sink = _sink(answers)
    _open(sink, 1, log, record)
    header = b'{"ph":"M","name":"thread_name","tid":1}\n'
    sink.handle([_lines(1, 3, [header, _line(1, 0), _line(2, 0)])])
    sink.handle([frames.Frame(frames.HEADER, 1, 0, 1, 0, header)])
    sink.handle([frames.Frame(frames.RECORD, 1, 3, 1, 0, b'{"pid": 7}')])
    assert json.loads(record.read_text())["events"] == {"written": 3, "dropped": 0}
    subprocess.run(["rm", "-rf", str(out)], check=True)
    sink.check_files()
    warnings = [a for a in answers if a.get("warn") == "removed"]
    assert len(warnings) == 1 and "3 lines are lost" in warnings[0]["msg"]
    assert log.read_bytes() == header  # the new file reads on its own: lane names first
    assert json.loads(record.read_text())["events"] == {"written": 1, "dropped": 3}
    sink.handle([_lines(1, 4, [_line(3, 0)])])
    sink.check_files()  # the new file is the live one: nothing more to report
    sink.handle([frames.Frame(frames.SYNC, 0, 1, 0, 0, b"")])
    assert list(answers[-1]["counts"]["1"]) == [2, 3]  # header replayed + line 3; the 3 lost lines dropped
    assert len([a for a in answers if a.get("warn") == "removed"]) == 1


def test_a_replaced_file_is_detected_too(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    answers: list[dict[str, Any]] = []
    sink = _sink(answers)
    _open(sink, 1, log)
    sink.handle([_lines(1, 2, [_line(1, 0), _line(2, 0)])])
    os.rename(log, tmp_path / "old.jsonl")
    log.write_bytes(b"")  # another file under the same name
    sink.check_files()
    sink.handle([_lines(1, 3, [_line(3, 0)]), frames.Frame(frames.SYNC, 0, 1, 0, 0, b"")])
    assert log.read_bytes() == _line(3, 0)
    assert list(answers[-1]["counts"]["1"]) == [1, 2]


def test_past_the_buffer_cap_batches_are_dropped_counted_and_warned_once(tmp_path: Path) -> None:
    answers: list[dict[str, Any]] = []
    sink = _sink(answers, cap=1100)
    _open(sink, 1, tmp_path / "log.jsonl")
    batch = [_line(i, 90) for i in range(5)]  # 525 bytes: two batches fit
    sink.put([_lines(1, 5 * (k + 1), batch) for k in range(4)])  # the writer is "hung": nothing taken
    assert len([a for a in answers if a.get("warn") == "buffer"]) == 1
    sink.finish()
    sink.run()  # the disk is back: what was queued is written
    sink.handle([frames.Frame(frames.SYNC, 0, 1, 0, 0, b"")])
    assert list(answers[-1]["counts"]["1"]) == [10, 10]
    assert len((tmp_path / "log.jsonl").read_bytes().splitlines()) == 10


def test_disk_full_then_space_again_on_a_real_file(tmp_path: Path) -> None:
    """``/dev/full`` refuses every write: counted as dropped, one warning, the stream goes on."""
    answers: list[dict[str, Any]] = []
    sink = _sink(answers)
    _open(sink, 1, Path("/dev/full"))
    sink.handle([_lines(1, 2, [_line(1, 0), _line(2, 0)]), frames.Frame(frames.SYNC, 0, 1, 0, 0, b"")])
    assert list(answers[-1]["counts"]["1"]) == [0, 2]
    assert [a["warn"] for a in answers if "warn" in a] == ["event_log"]


# ------------------------------------------------------------------ the drain process itself
def test_a_killed_drain_is_replaced_and_resumes_the_same_file(out_dir: Path) -> None:
    code = """
        import logging, os, signal, sys, time
        logging.basicConfig(stream=sys.stderr)
        from rl_trace_observer.capture import get_recorder
        rec = get_recorder()
        for i in range(100):
            rec.span("a", i, i + 1, lane="rank_0")
        assert rec.flush()
        first = rec.events._channel.drain_pid
        os.kill(first, signal.SIGKILL)
        time.sleep(0.3)
        rec.write_record()
        assert rec.flush(10)  # the new drain counts the lines already in the file before any news
        print(rec.events.written, rec.events.dropped)
        for i in range(100, 200):
            rec.span("a", i, i + 1, lane="rank_0")
            time.sleep(0.005)
        assert rec.flush(10)
        print(first, rec.events._channel.drain_pid, rec.events.written, rec.events.dropped)
    """
    proc = traced(code, out_dir)
    resumed, last = (list(map(int, line.split())) for line in proc.stdout.splitlines())
    assert resumed == [101, 0]
    first, second, written, dropped = last
    assert first != second
    (events,) = event_logs(out_dir).values()
    got = [e["ts_ns"] for e in spans(events)]
    assert got == sorted(got) and got[:100] == list(range(100))  # everything before the kill is kept
    assert written == len(events) and written + dropped == 201  # lane name + 200 spans
    (record,) = process_records(out_dir).values()
    assert record["events"] == {"written": written, "dropped": dropped}
    warnings = [line for line in proc.stderr.splitlines() if "drain process" in line]
    assert len(warnings) == 1 and "exited" in warnings[0]


def test_without_a_drain_process_a_writer_thread_takes_over(out_dir: Path) -> None:
    code = """
        import logging, sys
        logging.basicConfig(stream=sys.stderr)
        sys.executable = ""  # an embedded interpreter: nothing to start the drain with
        from rl_trace_observer.capture import get_recorder
        rec = get_recorder()
        for i in range(50):
            rec.span("a", i, i + 1)
        assert rec.flush()
        print(rec.events.written)
    """
    proc = traced(code, out_dir)
    assert proc.stdout.split() == ["51"]
    assert len(spans(next(iter(event_logs(out_dir).values())))) == 50
    warnings = [line for line in proc.stderr.splitlines() if "rl-trace-observer" in line]
    assert len(warnings) == 1 and "writing from a thread of this process" in warnings[0]


def test_a_forked_child_does_not_keep_the_parents_drain_alive(out_dir: Path) -> None:
    """The child closes its inherited copy of the parent's pipe: the parent's drain sees the end
    when the parent exits, not when a long-lived dataloader worker does."""
    code = """
        import os, sys, time
        from rl_trace_observer.capture import get_recorder
        rec = get_recorder()
        rec.span("parent", 1, 2)
        rec.flush()
        pid = os.fork()
        if pid == 0:
            time.sleep(20)
            os._exit(0)
        print(rec.events._channel.drain_pid, pid, flush=True)
    """
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=clean_env(RL_TRACE_OUTPUT_DIR=str(out_dir)),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    drain, child = map(int, proc.stdout.readline().split())
    try:
        proc.wait(30)
        assert wait_until(lambda: process_gone(drain), 10), "the drain waited for the forked child"
        assert not process_gone(child)
    finally:
        os.kill(child, signal.SIGKILL)


def test_the_drain_is_detached_and_leaves_no_process_behind(out_dir: Path) -> None:
    code = """
        import os
        from rl_trace_observer.capture import get_recorder
        rec = get_recorder()
        rec.span("a", 1, 2)
        rec.flush()
        drain = rec.events._channel.drain_pid
        with open(f"/proc/{drain}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        print(drain, fields[1], os.getpid(), fields[2], os.getsid(0), fields[3])
    """
    drain, ppid, me, pgrp, my_sid, sid = map(int, traced(code, out_dir).stdout.split())
    assert ppid != me, "not the training process's direct child (Ray kills those at worker exit)"
    assert sid != my_sid and pgrp == sid, "its own session and process group"
    assert wait_until(lambda: process_gone(drain), 10), "and it ends once its process has exited"


def test_a_record_that_cannot_be_built_costs_that_record_only(tmp_path: Path) -> None:
    """The pump builds records; one that raises must not stop the lines of any stream."""
    from rl_trace_observer.capture.streams import open_stream

    problems: list[tuple[str, str]] = []

    def broken() -> bytes:
        raise ValueError("no")

    bad = open_stream(
        tmp_path / "a.jsonl",
        record=tmp_path / "a.json",
        record_source=broken,
        on_problem=lambda kind, msg: problems.append((kind, msg)),
    )
    good = open_stream(tmp_path / "b.jsonl")
    bad.append(b'{"a":1}\n')
    good.append(b'{"b":1}\n')
    assert good.flush() and bad.close() and good.close()
    assert (tmp_path / "a.jsonl").read_bytes() == b'{"a":1}\n'
    assert (tmp_path / "b.jsonl").read_bytes() == b'{"b":1}\n'
    assert problems and problems[0][0] == "record" and "no" in problems[0][1]


# ------------------------------------------------------------------ killed in the middle of a write
class Killed(Exception):
    """The process got SIGKILL: the write in progress stops, and nothing after it runs."""


class PageCopyDisk(FakeDisk):
    """A disk that copies each write page by page, as the kernel does for a buffered write, and is
    killed before page copy number ``kill_at``: a write cut there keeps the pages it copied."""

    def __init__(self, kill_at: int) -> None:
        super().__init__()
        self.free = 1 << 30
        self.kill_at = kill_at
        self.copies = 0
        self.cut_writes: list[bytes] = []  # writes a kill cut after some of their pages

    def write(self, fd: int, data: Any) -> int:
        data = bytes(data)
        done = 0
        while done < len(data):
            if self.copies == self.kill_at:
                if done:
                    self.cut_writes.append(data)
                raise Killed
            self.copies += 1
            step = min(len(data) - done, 4096 - len(self.data) % 4096)
            self.data += data[done : done + step]
            done += step
        return done


@settings(max_examples=300, deadline=None)
@given(
    pads=st.lists(st.integers(0, 9000), min_size=1, max_size=40),
    start=st.integers(0, 5000),
    kill_at=st.integers(0, 200),
)
def test_a_kill_mid_write_cuts_no_line_but_one_written_alone(
    pads: list[int], start: int, kill_at: int
) -> None:
    """Issue 34 4a: a 10 MiB write SIGKILLed after a frozen disk thawed left a file ending inside a
    line. Now a write spans pages only when it is one line: a kill between pieces leaves whole lines,
    and a kill inside a piece can cut only that lone line (the kernel's window between two pages)."""
    disk = PageCopyDisk(kill_at)
    disk.data += b"\n" * start  # the file's offset decides where the page boundaries fall
    lf = LineFile("/d/x.jsonl", ops=disk)
    lf.open()
    lines = [_line(i, pad) for i, pad in enumerate(pads)]
    try:
        lf.append(b"".join(lines), len(lines))
    except Killed:
        pass
    content = bytes(disk.data)
    if content == b"" or content.endswith(b"\n"):
        assert not disk.cut_writes or all(w.count(b"\n") == 1 for w in disk.cut_writes)
        return
    (cut,) = disk.cut_writes  # a fragment: only from a write the kill cut, and that write was one line
    assert cut.count(b"\n") == 1 and cut in lines
