"""Events picked by phase, category and which fields they carry: the scans over a whole file that the
readers (metadata names), the clock alignment (stage regions, kernel scopes) and the causality checks
make, 10^5 to 10^6 events at a time.

Why one function with a compiled twin (``_select_native.pyx``, chosen per call): each scan is a
one-line comprehension, but reading two to four fields by name per event made them together ~5 % of a
``.json.gz`` merge's CPU; the twin reads an ``Event``'s slots. This module is the reference:
``tests/merge/test_native_twins.py`` requires the twin to pick exactly the same events.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from msgspec import UNSET

from ...common import twins

TWIN = "rl_trace_observer.merge.timeline._select_native"
FIELDS = frozenset({"ts", "dur", "args", "id"})  # the fields ``need`` may name


def pick(
    events: Iterable[Any], ph: str, cats: Collection[Any] | None = None, need: tuple[str, ...] = ()
) -> list[Any]:
    """The events of phase ``ph``, of a category in ``cats`` (None: any), with every field in
    ``need`` set (not ``UNSET``), in their order."""
    if not FIELDS.issuperset(need):
        raise ValueError(f"pick: need names fields outside {sorted(FIELDS)}: {need}")
    twin = twins.twin(TWIN)
    if twin is not None:
        return twin.pick(events, ph, cats, need)  # type: ignore[no-any-return]
    return pick_python(events, ph, cats, need)


def pick_python(
    events: Iterable[Any], ph: str, cats: Collection[Any] | None, need: tuple[str, ...]
) -> list[Any]:
    """:func:`pick` in Python (the reference)."""
    unset = UNSET
    out = [e for e in events if e.ph == ph and (cats is None or e.cat in cats)]
    for name in need:
        out = [e for e in out if getattr(e, name) is not unset]
    return out


__all__ = ["FIELDS", "TWIN", "pick", "pick_python"]
