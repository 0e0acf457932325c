"""Finding input files (local paths, directories, fsspec URLs) and reading them exactly once.

Every byte of an input is read once, and those same bytes feed both SHA-256 and the gzip
decompressor, so the manifest's checksum costs no second read. Gzip is recognised by its magic
bytes, never by the file name; a stream that ends early is reported as incomplete and what was
decompressed before the cut is still returned (the reader may salvage whole events from it).
"""

from __future__ import annotations

import hashlib
import posixpath
import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import fsspec

from .compress import decompressobj

HEAD_BYTES = 64 * 1024
GZIP_MAGIC = b"\x1f\x8b"
_SALVAGE_BLOCK = 1 << 20


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

    @property
    def name(self) -> str:
        return posixpath.basename(self.path)

    def open(self) -> Any:
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
        if not is_dir and not is_file:
            raise InputError(f"{raw}: no such file or directory")
        if is_file:
            entries: Iterable[tuple[str, int]] = [(path, int(fs.size(path) or 0))]
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
                found[key] = Source(url=_url(proto, p), path=p, protocol=proto, rel=rel, size=size)
    return sorted(found.values(), key=lambda s: (s.protocol, s.path))


def read_head(source: Source, limit: int = HEAD_BYTES) -> Head:
    """Up to ``limit`` decompressed bytes from the start of the file (empty on read errors)."""
    try:
        with source.open() as f:
            raw = f.read(limit)
    except Exception:
        return Head(source, b"", False)
    if not raw.startswith(GZIP_MAGIC):
        return Head(source, raw, False, whole=len(raw) < limit)
    dec = decompressobj()
    try:
        data = dec.decompress(raw, limit)
    except Exception:
        return Head(source, b"", True)
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
    dec, last = decompressobj(), b""
    while True:
        block = f.read(_SALVAGE_BLOCK)
        if not block:
            return last
        while block:
            try:
                out: bytes = dec.decompress(block)
            except Exception:  # corrupt or cut: what inflated before is the tail we have
                return last
            last = (last + out)[-limit:]
            block = dec.unused_data if dec.eof else b""
            if block:
                if not block.startswith(GZIP_MAGIC):
                    return last
                dec = decompressobj()


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
    """Read the whole file once: SHA-256 of the stored bytes plus the decompressed data.

    One ``read()`` and one inflate call: the size is known, and reading in blocks only to join them
    afterwards copies every byte once more (and holds it twice).
    """
    digest = hashlib.sha256()
    try:
        with source.open() as f:
            raw = f.read()
    except Exception as exc:  # an unreadable file still yields a manifest entry
        return Content(b"", digest.hexdigest(), False, f"unreadable: {exc}")
    digest.update(raw)
    if not raw.startswith(GZIP_MAGIC):
        return Content(raw, digest.hexdigest(), True)
    chunks: list[bytes] = []
    dec, error = _inflate(decompressobj(), raw, chunks)
    if error is not None:  # corrupt somewhere: salvage what inflates before the bad block
        chunks.clear()
        dec = decompressobj()
        for at in range(0, len(raw), _SALVAGE_BLOCK):
            dec, error = _inflate(dec, raw[at : at + _SALVAGE_BLOCK], chunks)
            if error is not None:
                break
    del raw
    if error is None and not dec.eof:
        error = "gzip stream is truncated (no end-of-stream marker)"
    data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    return Content(data, digest.hexdigest(), error is None, error)


def _inflate(dec: Any, block: bytes, out: list[bytes]) -> tuple[Any, str | None]:
    """Feed one stored block through the decompressor, following concatenated gzip members."""
    try:
        out.append(dec.decompress(block))
        while dec.eof and dec.unused_data:
            rest = dec.unused_data
            if not rest.startswith(GZIP_MAGIC):
                return dec, None  # trailing garbage after the last member: ignored, as gzip does
            dec = decompressobj()
            out.append(dec.decompress(rest))
    except (zlib.error, OSError, EOFError, ValueError) as exc:  # isal raises its own IsalError
        return dec, f"corrupt gzip data ({exc})"
    except Exception as exc:
        return dec, f"corrupt gzip data ({exc})"
    return dec, None
