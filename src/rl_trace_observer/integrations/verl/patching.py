"""Reversible attribute patches: remember the exact original object, put it back on uninstall.

Originals are read from ``owner.__dict__`` (not ``getattr``) so a restored class holds the very same
function object as before, which tests verify by identity.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("rl_trace_observer")

_MISSING = object()


@dataclass
class Patch:
    owner: Any
    name: str
    original: Any
    replacement: Any

    def revert(self) -> bool:
        """Put the original back unless someone else replaced our wrapper meanwhile."""
        current = vars(self.owner).get(self.name, _MISSING)
        if current is not self.replacement:
            log.warning(
                "[rl-trace-observer] %s.%s was re-patched by someone else; leaving it alone",
                getattr(self.owner, "__name__", self.owner),
                self.name,
            )
            return False
        if self.original is _MISSING:
            delattr(self.owner, self.name)
        else:
            setattr(self.owner, self.name, self.original)
        return True


class PatchSet:
    """The patches one feature applied, so it can be uninstalled as a unit."""

    def __init__(self) -> None:
        self._patches: list[Patch] = []
        self._lock = threading.Lock()

    def apply(self, owner: Any, name: str, replacement: Any) -> Any:
        """Install ``replacement`` as ``owner.name``; returns the original raw attribute."""
        original = vars(owner).get(name, _MISSING)
        setattr(owner, name, replacement)
        with self._lock:
            self._patches.append(Patch(owner, name, original, replacement))
        return original

    def patched(self, owner: Any, name: str) -> bool:
        with self._lock:
            return any(p.owner is owner and p.name == name for p in self._patches)

    def revert_all(self) -> None:
        with self._lock:
            patches, self._patches = self._patches, []
        for patch in reversed(patches):
            patch.revert()

    def __len__(self) -> int:
        return len(self._patches)
