"""AReaL (``areal`` 1.0.4): its perf traces and session files (:mod:`.layout` says where they are).

The registry takes both with one line (``*AREAL_FORMATS``): they are one stack's pair of files.
"""

from ..base import Format
from .perf import AReaLPerf
from .sessions import AReaLSessions

FORMATS: tuple[Format, ...] = (AReaLPerf(), AReaLSessions())

__all__ = ["FORMATS", "AReaLPerf", "AReaLSessions"]
