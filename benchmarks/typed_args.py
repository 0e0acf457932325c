"""Args as typed DebugAnnotations, for ``load_bench.py --anatomy``: what Perfetto's importer would pay
if the writer did not embed each slice's args as ``legacy_json_value`` text.

:class:`TypedArgs` re-encodes one ``args`` JSON object as ONE DebugAnnotation ``args`` whose members
are typed, nested ``dict_entries`` (keys interned as ``debug_annotation_names``; ints within int64 as
``int_value``, other numbers as ``double_value``, strings as ``string_value`` or, with
``intern_strings``, ``string_value_iid``; arrays as ``array_values``; nulls, NaN and empty containers
omitted). Perfetto then makes the same ``debug.args.<key>`` rows as from the JSON text (checked in the
engine: keys, value types, values), except where the JSON path is wrong: integers above int64 (the
JSON path turns 2**63 and 2**64 - 1 into negative reals) and subnormal doubles (it makes them 0).

What typed entries cannot say the same way stays JSON, in a second ``args`` annotation holding only
those members: keys that are empty or hold ``.``, ``[`` or ``]`` (Perfetto rewrites those characters
in annotation names, not in JSON keys; Kineto's ``est. achieved occupancy %``), arrays holding empty
containers (JSON gives them an index, the typed parser does not), numbers msgspec cannot read.

Field numbers: ``protos/perfetto/trace/track_event/debug_annotation.proto`` (DebugAnnotation:
name_iid 1, bool_value 2, int_value 4, double_value 5, string_value 6, legacy_json_value 9,
dict_entries 11, array_values 12, string_value_iid 17), ``interned_data.proto``
(debug_annotation_names 3, debug_annotation_string_values 29) and ``profile_common.proto``
(InternedString: iid 1, str 2).
"""

from __future__ import annotations

from typing import Any

import msgspec
import orjson

from rl_trace_observer.merge.output._pbwire import INT64_MAX, INT64_MIN, ld, pack_double, text, uint, varint

_BOOL = (b"\x10\x00", b"\x10\x01")  # bool_value (2, VARINT)
_INT = b"\x20"  # int_value (4, VARINT)
_DOUBLE = b"\x29"  # double_value (5, I64)
_STRING = b"\x32"  # string_value (6, LEN)
_LEGACY_JSON = b"\x4a"  # legacy_json_value (9, LEN)
_DICT_ENTRY = b"\x5a"  # dict_entries (11, LEN)
_ARRAY_VALUE = b"\x62"  # array_values (12, LEN)
_ANNOTATION = b"\x22"  # TrackEvent.debug_annotations (4, LEN)
_INF = float("inf")
_MEMBERS = msgspec.json.Decoder(dict[str, msgspec.Raw])


def _ld(tag: bytes, body: bytes) -> bytes:
    return tag + varint(len(body)) + body


def bad_key(key: str) -> bool:
    """A key typed entries cannot carry unchanged (Perfetto sanitizes annotation names)."""
    return not key or "." in key or "[" in key or "]" in key


class TypedArgs:
    """Typed ``args`` annotations for one packet sequence: call :meth:`reset` where the sequence's
    incremental state is cleared; :attr:`new` collects InternedData entries for the next packet.
    ``args`` itself is assumed interned by the writer as iid 1."""

    def __init__(self, intern_strings: bool = False) -> None:
        self.intern_strings = intern_strings
        self.names: dict[str, bytes] = {}
        self.strings: dict[str, bytes] = {}
        self.new: list[bytes] = []
        self.reset()

    def reset(self) -> None:
        self.names = {"args": uint(1, 1)}
        self.strings = {}
        self.new = []

    def _intern(self, table: dict[str, bytes], value: str, interned_field: int, ref_field: int) -> bytes:
        """``value``'s reference field, its InternedData entry queued in ``new`` the first time."""
        ref = table.get(value)
        if ref is None:
            iid = len(table) + 1
            self.new.append(ld(interned_field, uint(1, iid) + text(2, value)))
            ref = table[value] = uint(ref_field, iid)
        return ref

    def _key(self, key: str) -> bytes:
        return self._intern(self.names, key, 3, 1)  # debug_annotation_names -> name_iid

    def _string(self, value: str) -> bytes:
        if not self.intern_strings:
            return _ld(_STRING, value.encode("utf-8", "replace"))
        return self._intern(self.strings, value, 29, 17)  # debug_annotation_string_values -> string_value_iid

    def value(self, value: Any) -> bytes | None:
        """The value fields of one DebugAnnotation: b"" makes no row; None: not typeable."""
        cls = value.__class__
        if cls is str:
            return self._string(value)
        if cls is bool:
            return _BOOL[value]
        if cls is int:
            if INT64_MIN <= value <= INT64_MAX:
                return _INT + varint(value)
            try:
                return _DOUBLE + pack_double(float(value))  # what a JSON reader makes of the literal
            except OverflowError:
                return None
        if cls is float:
            if value != value or value in (_INF, -_INF):
                return b""
            return _DOUBLE + pack_double(value)
        if value is None:
            return b""
        if cls is dict:
            out = []
            for k, v in value.items():
                entry = self.entry(k, v)
                if entry is None:
                    return None
                out.append(entry)
            return b"".join(out)
        if cls is list:
            out = []
            for item in value:
                enc = self.value(item)
                if enc is None or (not enc and item.__class__ in (dict, list)):
                    return None  # JSON gives an empty container an index, the typed parser does not
                if enc:
                    out.append(_ld(_ARRAY_VALUE, enc))
            return b"".join(out)
        return None

    def entry(self, key: str, value: Any) -> bytes | None:
        """One member as a dict entry (b"": no row; None: not typeable)."""
        if bad_key(key):
            return None
        enc = self.value(value)
        return _ld(_DICT_ENTRY, self._key(key) + enc) if enc else enc

    def encode(self, raw: bytes) -> bytes:
        """The ``debug_annotations`` fields for one args JSON object (b"" if nothing makes a row)."""
        try:
            members = _MEMBERS.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return _ld(_ANNOTATION, self.names["args"] + _ld(_LEGACY_JSON, raw))
        typed, rest = [], []
        for k, v in members.items():
            text_ = bytes(v)
            try:
                enc = self.entry(k, msgspec.json.decode(text_))
            except msgspec.DecodeError:
                enc = None
            if enc is None:
                rest.append(orjson.dumps(k) + b":" + text_)
            elif enc:
                typed.append(enc)
        out = _ld(_ANNOTATION, self.names["args"] + b"".join(typed)) if typed else b""
        if rest:
            legacy = b"{" + b",".join(rest) + b"}"
            out += _ld(_ANNOTATION, self.names["args"] + _ld(_LEGACY_JSON, legacy))
        return out
