"""Kernels and launches as columns of ints, filled one event at a time while a trace streams.

A 10M-event run holds ~1M kernels and as many launches; a Python object per kernel would cost
~10x the columns kept here (``array``: 8 bytes a value). Only the ids the analysis needs leave
``args`` (``stream``, ``correlation``, decoded by a msgspec struct that skips every other key);
names, pids and tids are interned once. Times are the loaders' integer ns, relative to the trace's
base like every report time.
"""

from __future__ import annotations

from array import array
from typing import Any

import msgspec

from .kinds import kind_of

__all__ = ["KernelStore"]


class _Ids(msgspec.Struct):
    stream: Any = None
    correlation: Any = None


_IDS = msgspec.json.Decoder(_Ids)
_IDS_LIST = msgspec.json.Decoder(list[_Ids])
_EMPTY = b"{}"


def decode_ids(raws: list[Any]) -> list[_Ids | None]:
    """The ids of many ``args`` at once (one decode of a joined array, in C); an item that is not an
    object (or a batch that fails) falls back to one decode each, None where it fails."""
    try:
        return list(_IDS_LIST.decode(b"[" + b",".join(raws) + b"]"))
    except (msgspec.DecodeError, msgspec.ValidationError, TypeError):
        out: list[_Ids | None] = []
        for raw in raws:
            try:
                out.append(_IDS.decode(raw))
            except (msgspec.DecodeError, msgspec.ValidationError, TypeError):
                out.append(None)
        return out


def _ints_at_least(values: list[Any], low: int) -> bool:
    """Every value an int ≥ ``low`` (checked in C: map, set, min)."""
    return not values or (set(map(type, values)) <= {int} and min(values) >= low)


def _clamped(values: list[int]) -> list[int]:
    return values if not values or min(values) >= 0 else [v if v > 0 else 0 for v in values]


class KernelStore:
    """Columns of GPU events (``k_*``) and of the CPU calls that launched them (``l_*``).

    pids and tids are stored as they are when they are ints (every merged trace's are); any other
    value gets a negative id, its value in :attr:`others` (use :meth:`value`)."""

    def __init__(self) -> None:
        self.k_pid, self.k_tid = array("q"), array("q")
        self.k_ts, self.k_dur = array("q"), array("q")
        self.k_name, self.k_corr, self.k_stream = array("q"), array("q"), array("q")
        self.l_pid, self.l_tid = array("q"), array("q")
        self.l_ts, self.l_dur, self.l_corr = array("q"), array("q"), array("q")
        self.names: list[str] = []
        self.kinds: list[str] = []
        self.others: list[Any] = []
        self._name_ids: dict[str, int] = {}
        self._other_ids: dict[tuple[str, Any], int] = {}
        self.untracked = 0  # GPU-category events without an integer stream (Proton lanes, …)

    def __len__(self) -> int:
        return len(self.k_ts)

    def _other(self, value: Any) -> int:
        key = (type(value).__name__, value)
        got = self._other_ids.get(key)
        if got is None:
            got = self._other_ids[key] = -1 - len(self.others)
            self.others.append(value)
        return got

    def value(self, stored: int) -> Any:
        """The pid or tid a stored id stands for."""
        return stored if stored >= 0 else self.others[-1 - stored]

    def _ids_of(self, values: list[Any]) -> list[int]:
        if set(map(type, values)) <= {int}:  # C-level checks: the common case costs no Python loop
            return values
        return [v if type(v) is int else self._other(v) for v in values]

    def extend_kernels(
        self,
        pids: list[Any],
        tids: list[Any],
        ts_ns: list[int],
        dur_ns: list[int],
        names: list[str],
        categories: list[str],
        raws: list[Any],
    ) -> None:
        """Many GPU events at once (a chunk of a stream): column-wise, so the per-event cost is a
        few list comprehensions, not a Python call each. ``raws``: their ``args`` JSON."""
        ids = decode_ids(raws)
        streams = [x.stream if x is not None else None for x in ids]
        corrs = [x.correlation if x is not None else None for x in ids]
        self.extend_kernel_ids(pids, tids, ts_ns, dur_ns, names, categories, streams, corrs)

    def extend_kernel_ids(
        self,
        pids: list[Any],
        tids: list[Any],
        ts_ns: list[int],
        dur_ns: list[int],
        names: list[str],
        categories: list[str],
        streams: list[Any],
        corrs: list[Any],
    ) -> None:
        """As :meth:`extend_kernels`, with ``args.stream`` / ``args.correlation`` already read (the
        shards' loader reads them with Arrow); an event without an integer stream ≥ 0 is untracked."""
        if not _ints_at_least(streams, 0):
            keep = [i for i, x in enumerate(streams) if type(x) is int and x >= 0]
            self.untracked += len(streams) - len(keep)
            cols: list[list[Any]] = [
                [col[i] for i in keep]
                for col in (pids, tids, ts_ns, dur_ns, names, categories, streams, corrs)
            ]
            pids, tids, ts_ns, dur_ns, names, categories, streams, corrs = cols
        name_ids = self._name_ids
        new = set(names).difference(name_ids)
        if new:
            first_category = dict(zip(reversed(names), reversed(categories)))  # noqa: B905
            for name in sorted(new):
                name_ids[name] = len(self.names)
                self.names.append(name)
                self.kinds.append(kind_of(name, first_category[name]))
        self.k_pid.extend(self._ids_of(pids))
        self.k_tid.extend(self._ids_of(tids))
        self.k_ts.extend(ts_ns)
        self.k_dur.extend(_clamped(dur_ns))
        self.k_name.extend(list(map(name_ids.__getitem__, names)))
        self.k_corr.extend(
            corrs if _ints_at_least(corrs, 0) else [c if type(c) is int and c >= 0 else -1 for c in corrs]
        )
        self.k_stream.extend(streams)

    def extend_launches(
        self, pids: list[Any], tids: list[Any], ts_ns: list[int], dur_ns: list[int], raws: list[Any]
    ) -> None:
        corrs = [x.correlation if x is not None else None for x in decode_ids(raws)]
        self.extend_launch_ids(pids, tids, ts_ns, dur_ns, corrs)

    def extend_launch_ids(
        self, pids: list[Any], tids: list[Any], ts_ns: list[int], dur_ns: list[int], corrs: list[Any]
    ) -> None:
        keep = [i for i, c in enumerate(corrs) if type(c) is int and c >= 0]
        if len(keep) < len(corrs):
            pids, tids, ts_ns, dur_ns, corrs = (
                [col[i] for i in keep] for col in (pids, tids, ts_ns, dur_ns, corrs)
            )
        self.l_pid.extend(self._ids_of(pids))
        self.l_tid.extend(self._ids_of(tids))
        self.l_ts.extend(ts_ns)
        self.l_dur.extend(_clamped(dur_ns))
        self.l_corr.extend(corrs)

    def intern(self, names: list[str], categories: list[str]) -> array[int]:
        """Name ids for ``names`` (distinct), new ones numbered in sorted order with the kind their
        ``categories`` entry gives — as :meth:`extend_kernel_ids` numbers a chunk's new names."""
        new = {n: c for n, c in zip(names, categories, strict=True) if n not in self._name_ids}
        for name in sorted(new):
            self._name_ids[name] = len(self.names)
            self.names.append(name)
            self.kinds.append(kind_of(name, new[name]))
        return array("q", [self._name_ids[n] for n in names])

    def extend_kernel_arrays(
        self,
        pids: array[int],
        tids: array[int],
        ts_ns: array[int],
        dur_ns: array[int],
        name_ids: array[int],
        streams: array[int],
        corrs: array[int],
    ) -> None:
        """Tracked GPU events already as columns (the shards' fast path): integer pids and tids,
        streams >= 0, correlation -1 where absent."""
        self.k_pid.extend(pids)
        self.k_tid.extend(tids)
        self.k_ts.extend(ts_ns)
        self.k_dur.extend(dur_ns if not dur_ns or min(dur_ns) >= 0 else array("q", _clamped(list(dur_ns))))
        self.k_name.extend(name_ids)
        self.k_corr.extend(corrs)
        self.k_stream.extend(streams)

    def extend_launch_arrays(
        self, pids: array[int], tids: array[int], ts_ns: array[int], dur_ns: array[int], corrs: array[int]
    ) -> None:
        """Launches with a correlation >= 0, as columns (the shards' fast path)."""
        self.l_pid.extend(pids)
        self.l_tid.extend(tids)
        self.l_ts.extend(ts_ns)
        self.l_dur.extend(dur_ns if not dur_ns or min(dur_ns) >= 0 else array("q", _clamped(list(dur_ns))))
        self.l_corr.extend(corrs)
