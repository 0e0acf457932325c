"""One rule for every subcommand's errors: one stderr line naming the path, never a traceback.

Exit codes (all subcommands): 0 ok; 1 a runtime failure (an output that cannot be written, an input
whose content is unusable); 2 a usage error (an option that cannot be read, an input path that does
not exist — the command line names something that is not there, as click's own path checks say).
Outputs are checked before any work starts, so a long merge does not fail at its last write.
"""

from __future__ import annotations

import errno
import os
import re
import tempfile
from pathlib import Path

import typer

# capture/atomic.py writes ``.<name>.<pid>.tmp`` beside the real path: name the path the user gave
_ATOMIC_TMP = re.compile(r"^\.(?P<name>.+)\.\d+\.tmp$")

INPUT_HINT = "give a merged trace (.json.gz, .json, .pftrace with shards), span shards or a run directory"


def user_path(filename: object) -> str:
    """The path a user recognises in an OSError: the final name instead of an atomic-write temp file."""
    text = os.fsdecode(filename) if isinstance(filename, (str, bytes, os.PathLike)) else str(filename)
    path = Path(text)
    match = _ATOMIC_TMP.match(path.name)
    return str(path.with_name(match["name"])) if match else text


def os_error_line(exc: OSError) -> str:
    """``cannot write /ro/q.csv: Read-only file system`` (or ``use``, when it is not clearly a write)."""
    reason = exc.strerror or str(exc)
    if exc.filename is None:
        return f"error: {reason}"
    path = user_path(exc.filename)
    verb = "write" if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC) else "use"
    return f"error: cannot {verb} {path}: {reason}"


def fail(line: str, code: int = 1) -> typer.Exit:
    """Print ``line`` to stderr; the caller raises the returned exit."""
    from ..common.visible import visible

    line = visible(line)  # a path or a name from a trace: never raw on the terminal
    typer.echo(line if line.startswith("error:") else f"error: {line}", err=True)
    return typer.Exit(code)


def _probe(directory: Path) -> None:
    """Create and remove a hidden file: the only test that holds for root, read-only mounts and /proc."""
    fd, name = tempfile.mkstemp(prefix=".rl-trace-probe-", dir=directory)
    os.close(fd)
    os.unlink(name)


def check_output(path: str | None, option: str, *, directory: bool = False) -> None:
    """Exit 1 with one line when ``path`` (a file, or with ``directory`` a directory) cannot be written.

    Nothing is created: a missing parent is judged by the nearest directory that exists (the writer
    creates the rest); URLs are left to their filesystem.
    """
    if not path or "://" in path:
        return
    target = Path(path)
    if target.is_dir() and not directory:
        raise fail(f"error: cannot write {path} ({option}): it is a directory; give a file name")
    if target.exists() and directory and not target.is_dir():
        raise fail(f"error: cannot write {path} ({option}): it is a file, not a directory")
    where = target if directory else target.parent
    while not where.exists() and where != where.parent:
        where = where.parent
    if not where.is_dir():
        raise fail(f"error: cannot write {path} ({option}): {where} is not a directory")
    try:
        _probe(where)
    except OSError as exc:
        raise fail(
            f"error: cannot write {path} ({option}): no file can be created in {where} "
            f"({exc.strerror or exc})"
        ) from None


def make_parent(path: str | None) -> None:
    """Create an output's missing parent directories, as the merger always did."""
    if path and "://" not in path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)


def require_inputs(*paths: str, hint: str = INPUT_HINT) -> None:
    """Exit 2 with one line when a local input path does not exist (URLs are checked when read)."""
    for path in paths:
        if "://" not in path and not os.path.lexists(path):
            raise fail(f"error: {path}: no such file or directory; {hint}", code=2)
