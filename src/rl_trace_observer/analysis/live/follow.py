"""Follow a run directory as it is written: per file, only the bytes appended since the last look.

Line files (``*.jsonl``: event logs, metric samples) are read from a stored byte offset up to their
last newline; a torn last line stays unread until its newline arrives (the capture writer only
appends whole batches, but a reader can still look mid-write). A file whose device/inode changed, or
that got shorter, was started anew by the drain (a removed or replaced directory, capture.md): it is
read again from byte 0. Every other file (process records, rewritten atomically; profiler traces,
written whole) is only noticed by its size, mtime and inode: the merge reads those itself.

The offsets are plain data (:class:`FileMark`) so that the watch's state file can hold them: a
restarted watch resumes where it stopped without reading old bytes again.

A look runs every ``--poll`` seconds over every file of the run, so its per-file work is kept to
system calls on plain strings (no ``pathlib`` objects, no buffered file objects, no ``asdict``), and
a line file read once stays open (up to :data:`MAX_HELD` of them) so that a later look only stats
its path and reads: between steps that overhead, not the new bytes, is most of the watch's CPU
(docs/watch.md "Costs"). An open file keeps its inode, so a path whose stat still names it is the
same file; a file gone from the walk or started anew is closed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LINE_SUFFIXES = (".jsonl",)
CHUNK = 4 << 20  # bytes read at once: memory per file read stays bounded whatever the step's size
MAX_HELD = 256  # line files kept open between looks (the rest are opened per look)
SKIP_PREFIXES = (".",)  # hidden temp files of atomic writes (common/atomic.py) are never inputs


@dataclass
class FileMark:
    """Where the watch stands in one file."""

    dev: int = 0
    ino: int = 0
    offset: int = 0  # bytes consumed: always just after a newline (line files)
    lines: int = 0  # complete lines consumed (for naming a bad line by its number)
    size: int = 0
    mtime_ns: int = 0
    restarts: int = 0  # times the file was found started anew

    def to_json(self) -> dict[str, int]:
        return {  # spelt out: ``dataclasses.asdict`` costs ~30 µs a mark, every file, every saved look
            "dev": self.dev,
            "ino": self.ino,
            "offset": self.offset,
            "lines": self.lines,
            "size": self.size,
            "mtime_ns": self.mtime_ns,
            "restarts": self.restarts,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FileMark:
        return cls(**{k: int(v) for k, v in d.items() if k in cls.__dataclass_fields__})


# (relative path, 1-based line number, line bytes, byte offset of the line's start)
LineSink = Callable[[str, int, bytes, int], None]


def is_line_file(name: str) -> bool:
    return name.endswith(LINE_SUFFIXES)


def walk(root: Path, skip: Path | None = None) -> Iterator[tuple[str, os.stat_result]]:
    """Every regular file under ``root`` (relative path, stat), except hidden ones and ``skip``."""
    for rel, _path, st in _walk(root, skip):
        yield rel, st


def _walk(root: Path, skip: Path | None = None) -> Iterator[tuple[str, str, os.stat_result]]:
    """:func:`walk`, with each file's path as a string too (for opening it without joining again).

    ``os.walk``'s order and rules (a folder's files sorted, then its sub-folders sorted, depth first;
    symlinked folders listed but not entered; an unreadable folder passed over), on ``os.scandir``'s
    entries directly: no path is joined twice."""
    skip_real = os.path.realpath(skip) if skip is not None else None
    top = os.fspath(root)
    yield from _walk_dir(top, len(os.path.join(top, "")), skip_real)


def _walk_dir(folder: str, cut: int, skip_real: str | None) -> Iterator[tuple[str, str, os.stat_result]]:
    try:
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        return
    dirs = []
    for entry in entries:
        if entry.name.startswith(SKIP_PREFIXES):
            continue
        try:
            is_dir = entry.is_dir()
        except OSError:
            is_dir = False
        if is_dir:
            dirs.append(entry)
            continue
        try:
            st = os.stat(entry.path)
        except OSError:  # gone between listing and stat (or a dangling link): next look
            continue
        yield entry.path[cut:], entry.path, st
    for entry in dirs:
        if skip_real is not None and os.path.realpath(entry.path) == skip_real:
            continue
        if not entry.is_symlink():
            yield from _walk_dir(entry.path, cut, skip_real)


class Follower:
    """The marks of every file of one run directory; :meth:`poll` hands new complete lines to a sink.
    :meth:`close` (or dropping the follower) closes the files it keeps open."""

    def __init__(self, root: Path, marks: dict[str, FileMark] | None = None, skip: Path | None = None):
        self.root = root
        self.marks: dict[str, FileMark] = dict(marks or {})
        self.skip = skip
        self._held: dict[str, tuple[int, int, int]] = {}  # line file -> (open fd, its dev, its inode)

    def poll(self, sink: LineSink) -> list[str]:
        """Read what was appended everywhere; returns the files that changed (new, grown, replaced)."""
        changed = []
        present = set()
        for rel, path, st in _walk(self.root, self.skip):
            present.add(rel)
            mark = self.marks.get(rel)
            if mark is None:
                mark = self.marks[rel] = FileMark(dev=st.st_dev, ino=st.st_ino)
            elif (st.st_dev, st.st_ino) != (mark.dev, mark.ino) or st.st_size < mark.offset:
                mark.dev, mark.ino, mark.offset, mark.lines, mark.size = st.st_dev, st.st_ino, 0, 0, -1
                mark.restarts += 1
            if (st.st_size, st.st_mtime_ns) == (mark.size, mark.mtime_ns):  # nothing new (a torn tail too)
                continue
            if not is_line_file(rel):
                if (st.st_size, st.st_mtime_ns) != (mark.size, mark.mtime_ns):
                    changed.append(rel)
                mark.size, mark.mtime_ns, mark.offset = st.st_size, st.st_mtime_ns, st.st_size
                continue
            if self._read_lines(rel, path, st, mark, sink):
                changed.append(rel)
            mark.size, mark.mtime_ns = st.st_size, st.st_mtime_ns
        for rel in [r for r in self._held if r not in present]:  # gone: let its inode go
            self._let_go(rel)
        return changed

    def _open(self, rel: str, path: str, mark: FileMark) -> tuple[int, int] | None:
        """(fd, size to read up to) of the file ``mark`` follows, or None (gone, or replaced since the
        walk's stat: the next look). The fd is kept open when there is room."""
        held = self._held.get(rel)
        if held is not None:
            if held[1:] == (mark.dev, mark.ino):
                return held[0], -1
            self._let_go(rel)  # started anew: the old inode is no longer followed
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (mark.dev, mark.ino):
            os.close(fd)
            return None
        if len(self._held) < MAX_HELD:
            self._held[rel] = (fd, st.st_dev, st.st_ino)
        return fd, st.st_size

    def _let_go(self, rel: str) -> None:
        fd = self._held.pop(rel)[0]
        os.close(fd)

    def close(self) -> None:
        for rel in list(self._held):
            self._let_go(rel)

    def __del__(self) -> None:
        try:
            self.close()
        except (AttributeError, OSError):  # half-built, or at interpreter exit
            pass

    def _read_lines(self, rel: str, path: str, st: os.stat_result, mark: FileMark, sink: LineSink) -> bool:
        """Lines appended after ``mark.offset``; the offset moves to just after the last newline.
        Read up to the size the walk's stat saw (a held file: the same inode) or the fresh fd's;
        what was appended since is read next look (its size then differs from ``mark.size``)."""
        opened = self._open(rel, path, mark)
        if opened is None:
            return False
        fd, size = opened
        if size < 0:
            size = st.st_size
        moved = False
        try:
            carry = b""
            while True:
                pos = mark.offset + len(carry)  # the next byte to read
                if pos >= size:
                    break
                # sized to what is there: a CHUNK-sized buffer for a few new bytes costs more than the read
                chunk = os.pread(fd, min(CHUNK, size - pos), pos)
                if not chunk:  # truncated since the stat: next look
                    break
                data = carry + chunk
                end = data.rfind(b"\n")
                if end < 0:
                    carry = data
                    continue
                at = mark.offset  # where ``data`` starts in the file
                for line in data[:end].split(b"\n"):
                    mark.lines += 1
                    if line.strip():
                        sink(rel, mark.lines, line, at)
                    at += len(line) + 1
                mark.offset += end + 1  # ``data`` starts at the old offset: consumed up to the newline
                carry = data[end + 1 :]
                moved = True
        finally:
            if self._held.get(rel, (-1,))[0] != fd:
                os.close(fd)
        return moved
