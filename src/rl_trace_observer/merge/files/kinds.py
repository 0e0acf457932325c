"""Only regular files are read: what else an input directory may hold, and why it is left out.

Why: opening a FIFO blocks until a writer comes (a merge hung forever on one), a symlink loop makes
``stat`` raise, and a dangling symlink, a symlink to a directory or a file we may not read used to be
reported as an "empty file". Each such entry is named with what it is, from ``lstat``/``stat`` alone,
before anything is opened; :func:`open_regular` re-checks the opened descriptor (an entry replaced
between the listing and the read is refused, never waited on).
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

_SPECIAL = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
)


class NotRegular(OSError):
    """An input that is not a regular file (see :func:`why_not_regular`)."""


def _what(mode: int) -> str:
    for test, name in _SPECIAL:
        if test(mode):
            return name
    return "not a regular file"


def why_not_regular(path: str) -> str | None:
    """None for a regular file we may read (directly or through symlinks); else, in a few words, what
    the entry is instead. Never opens anything but a regular file."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot be listed ({exc.strerror or exc})"
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        try:
            st = os.stat(path)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return f"a symlink loop (-> {target})"
            if exc.errno == errno.ENOENT:
                return f"a dangling symlink (its target {target} does not exist)"
            return f"a symlink that cannot be followed to {target} ({exc.strerror or exc})"
        if stat.S_ISDIR(st.st_mode):
            return f"a symlink to a directory ({target}; not followed: name that directory to merge it)"
        if not stat.S_ISREG(st.st_mode):
            return f"a symlink to {_what(st.st_mode)} ({target}), not a regular file"
    elif not stat.S_ISREG(st.st_mode):
        return f"{_what(st.st_mode)}, not a regular file"
    return _unreadable(path)


def _unreadable(path: str) -> str | None:
    """Whether this process may open the regular file (an attempt: ``access`` says yes to root even
    where a file system refuses it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    os.close(fd)
    return None


def open_regular(path: str) -> BinaryIO:
    """Open a local file for reading, refusing (never blocking on) anything but a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegular(errno.EINVAL, f"{_what(mode)}, not a regular file", path)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
