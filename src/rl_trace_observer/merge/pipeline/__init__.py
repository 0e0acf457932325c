"""The merge as a whole: ONE orchestration (:mod:`.orchestrate`) given an executor — this machine's
process pool (:mod:`.local`: :func:`merge`, :func:`merge_steps`) or a Ray cluster's nodes
(:mod:`rl_trace_observer.cluster.merge`) — the plan cut into jobs (:mod:`.jobs`) and the clock
decided for each (:mod:`.clock`)."""

from ..options import MergeOptions, MergeResult, UsageError
from .local import merge, merge_steps

__all__ = ["MergeOptions", "MergeResult", "UsageError", "merge", "merge_steps"]
