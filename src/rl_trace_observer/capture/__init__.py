"""In-process capture: tiny, dependency-free (stdlib + orjson), safe under threads, asyncio and fork.

``get_recorder()`` returns this process's recorder, or ``None`` when ``RL_TRACE_OUTPUT_DIR`` is not
set; integrations call it per event so a forked child transparently gets its own files.
"""

from .clock import SYSTEM_CLOCK, Clock, ShiftedClock, SystemClock, snapshot
from .file_names import EVENT_LOG_NAME, PROCESS_RECORD_NAME
from .recorder import (
    PROCESS_RECORD_SCHEMA,
    Recorder,
    configure,
    get_recorder,
    reset,
)
from .sampler import join_sampler  # every new recorder joins its node's metric sampler

__all__ = [
    "EVENT_LOG_NAME",
    "PROCESS_RECORD_NAME",
    "PROCESS_RECORD_SCHEMA",
    "SYSTEM_CLOCK",
    "Clock",
    "Recorder",
    "ShiftedClock",
    "SystemClock",
    "configure",
    "get_recorder",
    "join_sampler",
    "reset",
    "snapshot",
]
