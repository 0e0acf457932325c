"""JSON encoding for the capture layer: orjson when present (≈1 µs/event), stdlib otherwise.

Attribute values come from user code, so anything orjson cannot encode falls back to ``str``;
integers stay integers, which is what keeps ``ts_ns``/``dur_ns`` exact.
"""

from __future__ import annotations

import json
from typing import Any

try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - orjson is a core dependency; keep training alive anyway
    _orjson = None  # type: ignore[assignment]


def _default(obj: Any) -> str:
    return str(obj)


if _orjson is not None:
    _LINE_OPTS = _orjson.OPT_APPEND_NEWLINE | _orjson.OPT_NON_STR_KEYS
    _PRETTY_OPTS = _orjson.OPT_INDENT_2 | _orjson.OPT_NON_STR_KEYS | _orjson.OPT_SORT_KEYS

    def dumps_line(obj: Any) -> bytes:
        """One compact JSON document followed by ``\\n``."""
        return _orjson.dumps(obj, default=_default, option=_LINE_OPTS)

    _STR_KEY_OPTS = _orjson.OPT_APPEND_NEWLINE

    def dumps_line_str_keys(obj: Any) -> bytes:
        """:func:`dumps_line` for documents whose keys are all ``str`` (a third cheaper: orjson's
        non-str-key mode takes a slower path); raises ``TypeError`` on any other key."""
        return _orjson.dumps(obj, default=_default, option=_STR_KEY_OPTS)

    def dumps_pretty(obj: Any) -> bytes:
        return _orjson.dumps(obj, default=_default, option=_PRETTY_OPTS)

    def loads(data: bytes) -> Any:
        """One JSON document (the capture writer's own messages and records)."""
        return _orjson.loads(data)

else:  # pragma: no cover

    def dumps_line(obj: Any) -> bytes:
        return (json.dumps(obj, default=_default, separators=(",", ":")) + "\n").encode()

    dumps_line_str_keys = dumps_line

    def dumps_pretty(obj: Any) -> bytes:
        return json.dumps(obj, default=_default, indent=2, sort_keys=True).encode()

    def loads(data: bytes) -> Any:
        return json.loads(data)
