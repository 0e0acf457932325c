"""Finding input files (local paths, directories, fsspec URLs) and reading them exactly once.

Every byte of an input is read once, and those same bytes feed both SHA-256 and the gzip
decompressor, so the manifest's checksum costs no second read. Gzip is recognised by its magic
bytes, never by the file name; a stream that ends early is reported as incomplete and what was
decompressed before the cut is still returned (the reader may salvage whole events from it).
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import fsspec

from .budget import file_limit, too_large
from .inflate import OUT_BLOCK, RAW_BLOCK, Oversized, RunGuard, TooLarge, decompressobj, read_all
from .kinds import open_regular, why_not_regular

HEAD_BYTES = 64 * 1024
GZIP_MAGIC = b"\x1f\x8b"


class InputError(ValueError):
    """An input that does not exist or cannot be listed: a usage error (exit code 2)."""


@dataclass(frozen=True)
class Source:
    """One input file. ``rel`` is its path below the input it was found under (POSIX separators)."""

    url: str  # what the user can open: a local path or a protocol URL
    path: str  # the path inside its filesystem
    protocol: str
    rel: str
    size: int
    # why this entry is not read at all (a FIFO, a symlink loop, ...: .kinds); None for a file to read
    unreadable: str | None = None

    @property
    def name(self) -> str:
        return posixpath.basename(self.path)

    @property
    def local(self) -> bool:
        return self.protocol in ("file", "local")

    def open(self) -> Any:
        if self.local:  # never blocks on a FIFO put in the file's place since it was listed
            return open_regular(self.path)
        fs = fsspec.filesystem(self.protocol)
        return fs.open(self.path, "rb")


@dataclass(frozen=True)
class Head:
    """The first bytes of a file (decompressed when gzip) for readers to sniff.

    ``tail`` holds the last bytes too once :func:`with_tail` has read them: formats that write their
    identifying keys or anchor after the events (VizTracer's ``viztracer_metadata``, Kineto re-saved
    with ``schemaVersion`` and ``baseTimeNanoseconds`` last) are only recognisable there.
    """

    source: Source
    data: bytes
    gzip: bool
    tail: bytes = b""
    whole: bool = False  # ``data`` is the entire (decompressed) file
    error: str | None = None  # why ``data`` is empty although the file may not be

    @property
    def ends(self) -> bytes:
        """Head and tail together, for searches that do not care where a key sits."""
        return self.data + b"\n" + self.tail if self.tail else self.data

    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


@dataclass
class Content:
    """A whole file read once: decompressed bytes, SHA-256 of the stored bytes, completeness."""

    data: bytes
    sha256: str
    complete: bool
    error: str | None = None
    unreadable: bool = False  # not opened or not read at all (``error`` says why)
    oversized: bool = False  # a decompression bomb, left unread after its first long run (.inflate)


def _size(fs: Any, path: str) -> int:
    try:
        return int(fs.size(path) or 0)
    except Exception:  # a dangling link, a loop: its reason is found when it is listed
        return 0


def _protocol_of(fs: Any) -> str:
    proto = fs.protocol
    return str(proto[0] if isinstance(proto, (tuple, list)) else proto)


def _url(protocol: str, path: str) -> str:
    return path if protocol in ("file", "local") else f"{protocol}://{path.lstrip('/')}"


def _skip(name: str) -> bool:
    """Hidden files are atomic-write temporaries (``.x.json.123.tmp``) or editor litter."""
    return name.startswith(".")


def discover(inputs: Sequence[str]) -> list[Source]:
    """Expand files, directories (recursively) and fsspec URLs into sources, sorted, de-duplicated."""
    found: dict[tuple[str, str], Source] = {}
    for raw in inputs:
        fs, path = fsspec.core.url_to_fs(str(raw))
        proto = _protocol_of(fs)
        try:
            is_dir = fs.isdir(path)
            is_file = not is_dir and fs.isfile(path)
        except Exception as exc:  # permission errors, unreachable stores
            raise InputError(f"{raw}: cannot be listed ({exc})") from exc
        local = proto in ("file", "local")
        if not is_dir and not is_file and not (local and os.path.lexists(path)):
            raise InputError(f"{raw}: no such file or directory")
        if not is_dir:  # a file named on the command line (a FIFO, a dangling link: named, skipped)
            entries: Iterable[tuple[str, int]] = [(path, _size(fs, path))]
            root = posixpath.dirname(path.rstrip("/"))
        else:
            listing = fs.find(path, detail=True)
            entries = ((p, int(info.get("size") or 0)) for p, info in sorted(listing.items()))
            root = path.rstrip("/")
        for p, size in entries:
            if _skip(posixpath.basename(p)):
                continue
            rel = posixpath.relpath(p, root) if root else p.lstrip("/")
            key = (proto, p)
            if key not in found:
                why = why_not_regular(p) if local else None
                found[key] = Source(
                    url=_url(proto, p),
                    path=p,
                    protocol=proto,
                    rel=rel,
                    size=0 if why else size,
                    unreadable=why,
                )
    return sorted(found.values(), key=lambda s: (s.protocol, s.path))


def read_head(source: Source, limit: int = HEAD_BYTES) -> Head:
    """Up to ``limit`` decompressed bytes from the start of the file (empty, with ``error`` saying
    why, when the file cannot be opened or its gzip stream does not inflate)."""
    try:
        with source.open() as f:
            raw = f.read(limit)
    except Exception as exc:
        return Head(source, b"", False, error=f"cannot be read ({_os_error(exc)})")
    if not raw.startswith(GZIP_MAGIC):
        return Head(source, raw, False, whole=len(raw) < limit)
    dec = decompressobj()
    try:
        data = dec.decompress(raw, limit)
    except Exception as exc:
        return Head(source, b"", True, error=f"starts like gzip but does not inflate ({exc})")
    return Head(source, data, True, whole=dec.eof and len(data) < limit)


def with_tail(head: Head, limit: int = HEAD_BYTES) -> Head:
    """``head`` with the last ``limit`` decompressed bytes of its file (unchanged for a small file).

    A plain file costs one seek. A gzip stream has no index, so it is inflated to the end keeping
    only the last block in memory: planning pays that only for files whose head did not decide.
    """
    if head.whole or not head.data:
        return head
    try:
        with head.source.open() as f:
            if not head.gzip:
                f.seek(max(0, head.source.size - limit))
                return replace(head, tail=f.read(limit))
            tail = _inflated_tail(f, limit)
    except Exception:
        return head
    return replace(head, tail=tail)


def _inflated_tail(f: Any, limit: int) -> bytes:
    """The last ``limit`` inflated bytes, inflating ``OUT_BLOCK`` at a time (a bomb never inflates
    at once) and stopping at a bomb's first long run (its read names it)."""
    dec, last, guard = decompressobj(), b"", RunGuard()
    while True:
        block = f.read(RAW_BLOCK)
        if not block:
            return last
        while block:
            if dec.eof:  # a member ended: another one follows, or trailing garbage
                if not block.startswith(GZIP_MAGIC):
                    return last
                dec = decompressobj()
            try:
                out: bytes = dec.decompress(block, OUT_BLOCK)
                guard.feed(out)
            except Exception:  # corrupt, cut or a bomb: what inflated before is the tail we have
                return last
            last = (last + out)[-limit:]
            block = dec.unconsumed_tail or (dec.unused_data if dec.eof else b"")


def decompressed_size(src: Source) -> int:
    """About the bytes a reader will get: a gzip file's trailer holds it (mod 4 GiB); else the stored
    size (orders and batches the merge's jobs)."""
    try:
        with src.open() as f:
            if f.read(2) != GZIP_MAGIC or src.size < 18:
                return src.size
            f.seek(src.size - 4)
            isize = int(struct.unpack("<I", f.read(4))[0])
            return max(isize, src.size)
    except Exception:
        return src.size * 8


def fingerprint(source: Source, block: int = HEAD_BYTES) -> str:
    """Size + first and last 64 KiB of the stored bytes: cheap duplicate detection before reading."""
    h = hashlib.sha256(str(source.size).encode())
    try:
        with source.open() as f:
            h.update(f.read(block))
            if source.size > 2 * block:
                f.seek(source.size - block)
            h.update(f.read(block))
    except Exception:
        h.update(source.url.encode())
    return h.hexdigest()


def read_content(source: Source) -> Content:
    """Read the whole file once: SHA-256 of the stored bytes plus the (inflated) data, in bounded
    blocks (:mod:`.inflate`: a file costs about its inflated size once; a decompression bomb is
    stopped at its first long run of filler and comes back ``oversized``)."""
    digest = hashlib.sha256()
    if source.unreadable:
        return Content(b"", digest.hexdigest(), False, source.unreadable, unreadable=True)
    limit = file_limit()
    try:
        with source.open() as f:
            first = f.read(RAW_BLOCK)
            if limit is not None and not first.startswith(GZIP_MAGIC) and source.size > limit[0]:
                digest.update(first)  # a plain file's size is known: never held, only hashed
                for block in iter(lambda: f.read(RAW_BLOCK), b""):
                    digest.update(block)
                return Content(b"", digest.hexdigest(), False, too_large(0, limit), oversized=True)
            try:
                data, error, complete = read_all(f, digest, first, limit[0] if limit else None)
            except TooLarge as exc:
                assert limit is not None
                return Content(b"", digest.hexdigest(), False, too_large(exc.args[0], limit), oversized=True)
            except Oversized as exc:
                return Content(b"", digest.hexdigest(), False, str(exc), oversized=True)
    except Exception as exc:  # an unreadable file still yields a manifest entry
        return Content(b"", digest.hexdigest(), False, f"cannot be read ({_os_error(exc)})", unreadable=True)
    return Content(data, digest.hexdigest(), complete, error)


def _os_error(exc: Exception) -> str:
    return (getattr(exc, "strerror", None) or str(exc)) if isinstance(exc, OSError) else str(exc)
