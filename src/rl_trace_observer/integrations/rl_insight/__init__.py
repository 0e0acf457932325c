"""RL-Insight integration: the ``rl_trace_observer`` monitor backend (rl-insight imported lazily)."""

from .backend import BACKEND_NAME, LOCAL_URL, TraceObserverClient, record_event
from .install import SUPPORTED, check_compatibility, install, uninstall

__all__ = [
    "BACKEND_NAME",
    "LOCAL_URL",
    "SUPPORTED",
    "TraceObserverClient",
    "check_compatibility",
    "install",
    "record_event",
    "uninstall",
]
