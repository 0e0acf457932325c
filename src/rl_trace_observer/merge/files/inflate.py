"""Reading a file's bytes in bounded blocks, inflating gzip as it goes, and refusing decompression bombs.

Why: a 2.3 MB ``.gz`` of whitespace inflates to 2.3 GB, and the old read (the whole stored file, one
inflate call, the pieces joined) held it two and a half times: 4.4 GB of RSS for a file with no event.
Here the stored bytes are read 1 MiB at a time, each inflate call returns at most ``OUT_BLOCK`` bytes
(``max_length``), and the output goes into one growing buffer that becomes the file's bytes without a
copy (``BytesIO.getvalue``), so a file costs about its inflated size once.

A trace holds events, which are short; no real trace holds a run of whitespace, or of one repeated
byte, anywhere near ``MAX_RUN`` (64 MiB: 100,000× the longest whitespace between two events that
pretty-printed traces have). Such a run is what a decompression bomb is made of (deflate can only
shrink a file ~1,000× by repeating), so the read stops there: :class:`Oversized`, the file is named
and left out, having cost at most ``MAX_RUN`` plus what came before it.
"""

from __future__ import annotations

import io
import zlib
from typing import Any

_fast: Any
try:  # optional speed-up: ISA-L inflates ~2x faster than zlib
    from isal import isal_zlib as _fast
except ImportError:  # pragma: no cover - exercised where isal is absent
    _fast = None


def decompressobj() -> Any:
    """A gzip (one member) decompressor; ISA-L when installed."""
    if _fast is not None:
        return _fast.decompressobj(31)
    return zlib.decompressobj(31)


RAW_BLOCK = 1 << 20  # stored bytes read at a time
OUT_BLOCK = 4 << 20  # at most this much inflated output per inflate call
MAX_RUN = 64 << 20  # a run of whitespace or of one byte longer than this: a bomb, not a trace
GZIP_MAGIC = b"\x1f\x8b"
_WS = b" \t\r\n"
_TAIL = 1 << 16  # how much of a block's end is looked at before the whole block


class Oversized(ValueError):
    """A file holding a run of whitespace or of one byte longer than ``MAX_RUN``."""


class TooLarge(Oversized):
    """Content past what the process can merge (:mod:`.budget`); ``args[0]``: the bytes read so far."""


class RunGuard:
    """Follows the longest run of filler (JSON whitespace, or one repeated byte) across blocks."""

    def __init__(self, limit: int = MAX_RUN) -> None:
        self.limit = limit
        self.chars = b""  # the run's bytes: _WS, or one byte
        self.run = 0  # its length so far
        self.offset = 0  # bytes seen

    def feed(self, block: bytes) -> None:
        if not block:
            return
        if self.run and not block.lstrip(self.chars):  # the run goes on through the whole block
            self.run += len(block)
        else:
            if self.run:  # it ends in this block
                self.run += len(block) - len(block.lstrip(self.chars))
                self._check()
            last = block[-1:]
            self.chars = _WS if last in _WS else last
            self.run = _tail_run(block, self.chars)
        self.offset += len(block)
        self._check()

    def _check(self) -> None:
        if self.run > self.limit:
            what = "whitespace" if self.chars == _WS else f"the byte {self.chars!r}"
            raise Oversized(
                f"a run of over {self.limit >> 20} MiB of {what} (at inflated byte "
                f"{self.offset - self.run:,}): a decompression bomb or a damaged file, not a trace"
            )


def _tail_run(block: bytes, chars: bytes) -> int:
    tail = block[-_TAIL:]
    n = len(tail) - len(tail.rstrip(chars))
    if n < len(tail):
        return n
    return len(block) - len(block.rstrip(chars))


def read_all(
    f: Any, digest: Any, first: bytes = b"", max_bytes: int | None = None
) -> tuple[bytes, str | None, bool]:
    """The whole (inflated) content of ``f``, read after ``first`` (its first stored bytes, already
    read); ``digest`` gets every stored byte. Returns (data, error, eof): ``error`` says why the data
    stops early (a cut or corrupt gzip stream: what inflated before is kept); :class:`Oversized` is
    raised for a bomb, or for content past ``max_bytes``, after the rest of the stored bytes went
    into ``digest``."""
    out = io.BytesIO()
    guard = RunGuard()
    gz = first.startswith(GZIP_MAGIC)
    dec = decompressobj() if gz else None
    error: str | None = None
    block = first
    try:
        while block:
            digest.update(block)
            if dec is None:
                guard.feed(block)
                out.write(block)
            elif error is None:
                dec, error = _inflate(dec, block, out, guard)
            if max_bytes is not None and out.tell() > max_bytes:
                raise TooLarge(out.tell())
            block = f.read(RAW_BLOCK)
    except Oversized:
        for rest in iter(lambda: f.read(RAW_BLOCK), b""):
            digest.update(rest)
        raise
    if dec is not None and error is None and not dec.eof:
        error = "gzip stream is truncated (no end-of-stream marker)"
    return out.getvalue(), error, error is None


def _inflate(dec: Any, block: bytes, out: io.BytesIO, guard: RunGuard) -> tuple[Any, str | None]:
    """One stored block through the decompressor, ``OUT_BLOCK`` at a time, following concatenated
    gzip members (trailing garbage after the last one is ignored, as gzip does)."""
    try:
        while block:
            if dec.eof:  # a member ended with the last block: another one, or trailing garbage
                if not block.startswith(GZIP_MAGIC):
                    return dec, None
                dec = decompressobj()
            piece = dec.decompress(block, OUT_BLOCK)
            guard.feed(piece)
            out.write(piece)
            block = dec.unconsumed_tail or (dec.unused_data if dec.eof else b"")
    except Oversized:
        raise
    except (zlib.error, OSError, EOFError, ValueError) as exc:  # isal raises its own IsalError
        return dec, f"corrupt gzip data ({exc})"
    except Exception as exc:
        return dec, f"corrupt gzip data ({exc})"
    return dec, None
