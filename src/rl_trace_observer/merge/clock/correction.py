"""What the clock decides for one artifact: ONE ``ts_ns -> ts_ns`` correction, applied by the
``correct_time`` pass (:mod:`..transform.passes`) or, when it is a constant, inside the fused loop.

A constant offset stays a plain integer so the pass is one addition per event; anything else (a host's
drift, a partner alignment's line) travels to the worker as the correction object itself (picklable),
never as a closure. A per-artifact alignment on a partner is stacked on its host's correction
(:func:`stack`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .pairs import PairCorrection, chain


@dataclass(frozen=True)
class TimeCorrection:
    """``ts_ns -> ts_ns`` for one artifact: an offset, or any monotonic function (drift)."""

    offset_ns: int = 0
    fn: Callable[[int], int] | None = None
    method: str = "none"

    @property
    def is_identity(self) -> bool:
        return self.fn is None and self.offset_ns == 0

    def __call__(self, ts_ns: int) -> int:
        return self.fn(ts_ns) if self.fn is not None else ts_ns + self.offset_ns


IDENTITY = TimeCorrection()


def stack(host: TimeCorrection, pair: PairCorrection | None) -> TimeCorrection:
    """The artifact's correction: its pair correction first, then its host's.

    Two constants stay one integer (the fused fast path keeps working); a drift line makes it a
    function (``fn``), which the ``correct_time`` pass applies per event: a caller on the fast path
    must then leave it (the worker converts the events to ns and runs the listed passes).
    """
    if pair is None:
        return host
    method = f"{host.method}+pairs"
    if host.fn is None and pair.constant_ns is not None:
        return TimeCorrection(offset_ns=host.offset_ns - pair.constant_ns, method=method)
    return TimeCorrection(fn=chain(pair, host), method=method)
