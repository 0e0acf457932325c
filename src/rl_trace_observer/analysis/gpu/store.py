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


def _ids(raw: Any) -> _Ids | None:
    if raw is None:
        return None
    try:
        return _IDS.decode(raw)
    except (msgspec.DecodeError, TypeError):
        return None


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


class KernelStore:
    """Columns of GPU events (``k_*``) and of the CPU calls that launched them (``l_*``)."""

    def __init__(self) -> None:
        self.k_pid, self.k_tid = array("q"), array("q")  # interned ids (:attr:`values`)
        self.k_ts, self.k_dur = array("q"), array("q")
        self.k_name, self.k_corr, self.k_stream = array("q"), array("q"), array("q")
        self.l_pid, self.l_tid = array("q"), array("q")
        self.l_ts, self.l_dur, self.l_corr = array("q"), array("q"), array("q")
        self.names: list[str] = []
        self.kinds: list[str] = []
        self.values: list[Any] = []  # interned pid / tid values
        self._name_ids: dict[tuple[str, str], int] = {}
        self._value_ids: dict[Any, int] = {}
        self.untracked = 0  # GPU-category events without an integer stream (Proton lanes, …)

    def __len__(self) -> int:
        return len(self.k_ts)

    def _value(self, value: Any) -> int:
        key = (type(value).__name__, value)
        got = self._value_ids.get(key)
        if got is None:
            got = self._value_ids[key] = len(self.values)
            self.values.append(value)
        return got

    def _name(self, name: str, category: str) -> int:
        key = (name, category)
        got = self._name_ids.get(key)
        if got is None:
            got = self._name_ids[key] = len(self.names)
            self.names.append(name)
            self.kinds.append(kind_of(name, category))
        return got

    def add_kernel(
        self, pid: Any, tid: Any, ts_ns: int, dur_ns: int, name: str, category: str, raw_args: Any
    ) -> None:
        ids = _ids(raw_args)
        stream = _int(ids.stream) if ids is not None else None
        if stream is None or stream < 0:
            self.untracked += 1
            return
        corr = _int(ids.correlation) if ids is not None else None
        self.k_pid.append(self._value(pid))
        self.k_tid.append(self._value(tid))
        self.k_ts.append(ts_ns)
        self.k_dur.append(max(dur_ns, 0))
        self.k_name.append(self._name(name, category))
        self.k_corr.append(-1 if corr is None else corr)
        self.k_stream.append(stream)

    def add_launch(self, pid: Any, tid: Any, ts_ns: int, dur_ns: int, raw_args: Any) -> None:
        ids = _ids(raw_args)
        corr = _int(ids.correlation) if ids is not None else None
        if corr is None or corr < 0:
            return
        self.l_pid.append(self._value(pid))
        self.l_tid.append(self._value(tid))
        self.l_ts.append(ts_ns)
        self.l_dur.append(max(dur_ns, 0))
        self.l_corr.append(corr)
