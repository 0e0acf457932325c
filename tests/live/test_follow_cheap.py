"""The watch's cheap path between steps reads exactly what the plain one read.

A look runs every ``--poll`` seconds over every file of a run, so the follower walks with
``os.scandir`` and reads with ``os.pread`` sized to the file (no ``pathlib``, no buffered files),
the step windows are kept until a marker arrives, and mere progress is saved and published at most
every ``PROGRESS_S`` (docs/watch.md "Costs"). Each of these is checked here against the plain
reading it replaced: the same files in the same order, the same lines at the same byte offsets,
the same markers and windows — and a watch killed between two saves resumes counting every line
once.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trace_observer.analysis.live import follow
from rl_trace_observer.analysis.live.follow import FileMark, Follower, walk
from rl_trace_observer.analysis.live.options import WatchOptions
from rl_trace_observer.analysis.live.seen import Seen
from rl_trace_observer.analysis.live.watch import PROGRESS_S, Watch, load_state
from rl_trace_observer.merge.timeline.steps import windows_from_markers

from ..conftest import requires
from ..corpus.live_run import LiveRun


def plain_walk(root: Path, skip: Path | None = None) -> list[tuple[str, int]]:
    """The walk as it was (``os.walk`` + ``pathlib``): (relative path, inode) of every file."""
    skip_real = skip.resolve() if skip is not None else None
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(
            d
            for d in dirnames
            if not d.startswith(".") and (skip_real is None or (here / d).resolve() != skip_real)
        )
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            try:
                st_ = os.stat(here / name)
            except OSError:
                continue
            out.append((str((here / name).relative_to(root)), st_.st_ino))
    return out


names = st.sampled_from(["a", "b", "B", "_x", ".h", "z.jsonl", "a.jsonl", "r.json", "s p", "ü"])
trees = st.recursive(
    st.dictionaries(names, st.just(b"x\n"), max_size=4),
    lambda kids: st.dictionaries(names, st.one_of(st.just(b"1\n"), kids), max_size=4),
    max_leaves=12,
)


def build(folder: Path, tree: dict[str, object]) -> None:
    for name, what in tree.items():
        if isinstance(what, dict):
            (folder / name).mkdir()
            build(folder / name, what)
        else:
            assert isinstance(what, bytes)
            (folder / name).write_bytes(what)


@settings(max_examples=60, deadline=None)
@given(tree=trees, link=st.booleans(), dangling=st.booleans(), skip=st.booleans())
def test_the_walk_lists_what_os_walk_listed_in_its_order(
    tmp_path_factory: pytest.TempPathFactory, tree: dict[str, object], link: bool, dangling: bool, skip: bool
) -> None:
    root = tmp_path_factory.mktemp("walk") / "run"
    root.mkdir()
    build(root, tree)
    if link:  # a symlinked folder is listed by os.walk but not entered
        target = root.parent / "elsewhere"
        target.mkdir()
        (target / "in.jsonl").write_bytes(b"1\n")
        (root / "linked").symlink_to(target, target_is_directory=True)
    if dangling:
        (root / "gone.jsonl").symlink_to(root.parent / "nothing")
    dirs = sorted(p for p in root.rglob("*") if p.is_dir() and not p.is_symlink())
    skipped = dirs[0] if skip and dirs else None
    got = [(rel, s.st_ino) for rel, s in walk(root, skipped)]
    assert got == plain_walk(root, skipped)


def plain_lines(data: bytes) -> list[tuple[int, bytes, int]]:
    """Every complete, non-blank line of a file: (1-based number, bytes, byte offset of its start)."""
    out, at = [], 0
    for number, line in enumerate(data.split(b"\n")[:-1], 1):
        if line.strip():
            out.append((number, line, at))
        at += len(line) + 1
    return out


@settings(max_examples=80, deadline=None)
@given(
    lines=st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=25),
    cuts=st.lists(st.integers(min_value=0, max_value=900), max_size=6),
    chunk=st.integers(min_value=1, max_value=64),
)
def test_lines_offsets_and_numbers_equal_a_whole_file_read_whatever_the_chunk(
    tmp_path_factory: pytest.TempPathFactory, lines: list[bytes], cuts: list[int], chunk: int
) -> None:
    folder = tmp_path_factory.mktemp("read")
    data = b"".join(line + b"\n" for line in lines) + b"torn"
    path = folder / "x.jsonl"
    path.write_bytes(b"")
    f = Follower(folder)
    got: list[tuple[int, bytes, int]] = []
    written = 0
    old, follow.CHUNK = follow.CHUNK, chunk  # reads cut anywhere inside a line, or a line over chunks
    try:
        for cut in sorted({min(c, len(data)) for c in cuts} | {len(data)}):
            with path.open("ab") as fh:
                fh.write(data[written:cut])
            written = cut
            f.poll(lambda _rel, n, line, at: got.append((n, line, at)))
    finally:
        follow.CHUNK = old
    assert got == plain_lines(data)
    for _, line, at in got:
        assert data[at : at + len(line)] == line
    assert f.marks["x.jsonl"].offset == len(data) - len(b"torn")


def open_paths(folder: Path) -> list[str]:
    """What this process holds open under ``folder``, as the kernel names it (a deleted file's name
    ends in " (deleted)")."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(folder)):
            out.append(target)
    return out


def test_held_files_are_let_go_when_gone_replaced_or_closed(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(b"1\n")
    b.write_bytes(b"2\n")
    f = Follower(tmp_path)
    got: list[tuple[str, int, bytes]] = []
    f.poll(lambda rel, n, line, _at: got.append((rel, n, line)))
    assert sorted(open_paths(tmp_path)) == [str(a), str(b)]  # kept open for the next look
    b.unlink()  # the drain removed it: its inode must not stay allocated by the watch
    with a.open("r+b") as fh:  # rewritten in place, shorter: the same inode started anew
        fh.write(b"\n")
        fh.truncate(1)
    f.poll(lambda rel, n, line, _at: got.append((rel, n, line)))
    assert open_paths(tmp_path) == [str(a)]
    a.write_bytes(b"3\n4\n")  # a longer rewrite of the same inode: read from byte 0 again
    a.rename(tmp_path / "a.old")
    a.write_bytes(b"5\n")  # and then a new file under the old name
    f.poll(lambda rel, n, line, _at: got.append((rel, n, line)))
    assert got == [("a.jsonl", 1, b"1"), ("b.jsonl", 1, b"2"), ("a.jsonl", 1, b"5")]
    assert open_paths(tmp_path) == [str(a)]  # the new file; not the old inode under its new name
    f.close()
    assert open_paths(tmp_path) == []


def test_more_files_than_are_kept_open_are_all_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(follow, "MAX_HELD", 2)
    paths = [tmp_path / f"f{i}.jsonl" for i in range(5)]
    f = Follower(tmp_path)
    got: list[tuple[str, bytes]] = []
    for k in range(3):
        for p in paths:
            with p.open("ab") as fh:
                fh.write(b"%d\n" % k)
        f.poll(lambda rel, _n, line, _at: got.append((rel, line)))
    assert sorted(got) == sorted((p.name, b"%d" % k) for p in paths for k in range(3))
    assert len(open_paths(tmp_path)) == 2
    f.close()


@given(st.builds(FileMark, *(st.integers(-(2**62), 2**62) for _ in range(7))))
def test_a_mark_spelt_out_is_asdict(mark: FileMark) -> None:
    from dataclasses import asdict

    assert mark.to_json() == asdict(mark) and FileMark.from_json(mark.to_json()) == mark


def test_markers_learnt_by_the_follower_equal_a_plain_read_of_the_same_files(tmp_path: Path) -> None:
    run = LiveRun(tmp_path / "run")
    run.add_sampler()
    seen, follower = Seen(), Follower(run.folder)
    try:
        for step in (1, 2, 3):
            run.step(step)
            follower.poll(seen.line)
            assert seen.windows() == windows_from_markers(seen.markers)  # kept, and still right
        run.step(4, finish=False)
        follower.poll(seen.line)
    finally:
        run.close()
    plain = Seen()
    for path in sorted(p for p in run.folder.rglob("*.jsonl") if not p.name.startswith(".")):
        rel = str(path.relative_to(run.folder))
        for number, line, at in plain_lines(path.read_bytes()):
            plain.line(rel, number, line, at)
    assert seen.to_json() == plain.to_json()
    assert [w.step for w in seen.windows()] == [1, 2, 3]


@requires("pyarrow")
def test_a_watch_killed_between_progress_saves_resumes_counting_every_line_once(tmp_path: Path) -> None:
    now = [0.0]
    run = LiveRun(tmp_path / "run")
    run.add_sampler()
    out = tmp_path / "watch"

    def on_disk() -> int:
        return sum(
            p.read_bytes().count(b"\n") for p in run.folder.rglob("*.jsonl") if not p.name.startswith(".")
        )

    try:
        watch = Watch(WatchOptions(run.folder, out, settle_s=0), clock=lambda: now[0])
        run.step(1)
        assert watch.look() == [1]
        run.step(2, finish=False)  # the run goes past its last step: shown, and saved, at once
        now[0] = 0.1
        version = watch.version
        watch.look()
        assert watch.version > version and load_state(out)["seen"]["lines"] == on_disk()
        run.step(3, finish=False)  # more lines, nothing the status names beyond progress
        now[0] = 0.2
        version = watch.version
        watch.look()
        assert watch.version == version  # neither saved nor published yet
        assert watch.status()["lines"] == on_disk() > load_state(out)["seen"]["lines"]
        # killed here: a new watch resumes from the last save and reads the bytes after it once
        again = Watch(WatchOptions(run.folder, out, settle_s=0), clock=lambda: now[0])
        assert again.look(final=True) == []
        assert again.seen.to_json() == watch.seen.to_json()
        assert again.seen.lines == on_disk()
        now[0] = 0.2 + PROGRESS_S  # the first watch, left running: its progress is saved in time
        watch.look()
        assert watch.version > version and load_state(out)["seen"]["lines"] == on_disk()
    finally:
        run.close()
