"""Names from traces shown on a terminal with their control characters escaped, visibly.

A trace's names (spans, processes, roles, files) come from user code and from files nobody here
wrote. Printed raw, an ESC starts a terminal escape sequence (colours, cursor moves, a new window
title), NUL/BEL/CR hide or overwrite text and a bidi override (U+202E) shows text in another order
than it is. Every terminal output path passes such strings through :func:`visible` (or
:func:`visible_tree` for a whole summary), which writes them the way Python writes them in a
string literal: ``\\x1b``, ``\\x00``, ``\\r``, ``\\u202e``. Newline and tab stay: a table lays them
out and they cannot hide or reorder text. The HTML report escapes the same strings its own way.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["visible", "visible_json", "visible_tree"]

# C0 (less tab and newline), DEL, C1; then the invisible marks that reorder or break text:
# ARABIC LETTER MARK, LRM/RLM, the line/paragraph separators, the bidi embeddings/overrides and isolates.
_FORMAT_MARKS = (0x061C, 0x200E, 0x200F, 0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
_CONTROLS = (*(c for c in range(0x20) if c not in (0x09, 0x0A)), 0x7F, *range(0x80, 0xA0))

_ESCAPES: dict[int, str] = {c: f"\\x{c:02x}" for c in _CONTROLS}
_ESCAPES[0x0D] = "\\r"
_ESCAPES.update({c: f"\\u{c:04x}" for c in _FORMAT_MARKS})
_NEEDS_ESCAPE = re.compile("[" + "".join(re.escape(chr(c)) for c in _ESCAPES) + "]")

# In JSON these are legal raw inside strings (orjson writes them so) but as harmful on a terminal;
# the \\uXXXX form is the same JSON value.
_JSON_RAW = (0x7F, *range(0x80, 0xA0), *_FORMAT_MARKS)
_JSON_ESCAPES = {c: f"\\u{c:04x}" for c in _JSON_RAW}
_JSON_NEEDS = re.compile("[" + "".join(re.escape(chr(c)) for c in _JSON_RAW) + "]")


def visible(text: str) -> str:
    """``text`` with every terminal control character written as an escape (``\\x1b``, ``\\u202e``)."""
    return text.translate(_ESCAPES) if _NEEDS_ESCAPE.search(text) else text


def visible_tree(value: Any) -> Any:
    """A copy of a JSON-like value (dicts, lists, tuples, strings) with :func:`visible` applied to
    every string, keys included; other values are returned as they are."""
    if isinstance(value, str):
        return visible(value)
    if isinstance(value, dict):
        return {visible_tree(k): visible_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [visible_tree(v) for v in value]
    if isinstance(value, tuple):
        return tuple(visible_tree(v) for v in value)
    return value


def visible_json(data: bytes) -> bytes:
    """UTF-8 JSON with the characters JSON may carry raw but a terminal must not (DEL, C1, bidi
    marks) written as ``\\uXXXX`` escapes: the same JSON value. (JSON already escapes C0.)"""
    text = data.decode("utf-8")
    return text.translate(_JSON_ESCAPES).encode("utf-8") if _JSON_NEEDS.search(text) else data
