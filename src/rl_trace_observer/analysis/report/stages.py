"""The ONE table that turns span names into report categories, and nothing else knows names.

Why patterns and not VERL's vocabulary: VERL 0.9.1 annotates ``train_batch``,
``actor_compute_log_prob``, ``actor_update``, ``vllm_generate`` …, VeRL-Omni adds ``vllm_sleep``,
``vllm_wake_up``, ``update_weights``, other trainers and engines use their own names, and every new
release adds more. A handful of ordered patterns covers the families; anything they miss is
``other`` (still counted as busy time, never dropped). Add a row here to teach the report a name.

Rows are tried in order and the first match wins, so specific families come before broad ones
(``update_weights`` is weight sync, not an update; ``ref_compute_log_prob`` is log-prob, not
generation). Rows of category ``step`` are step markers: they define step windows and are not work;
among them, earlier rows take priority when a trace has several kinds. Those rows are the merge's
(:data:`rl_trace_observer.merge.timeline.steps.STEP_MARKERS`): span shards and ``--step`` views cut
steps by the same rule.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from ...merge.timeline.steps import STEP_MARKERS, marker_number, marker_priority

__all__ = [
    "CATEGORIES",
    "IDLE",
    "OTHER",
    "ROLLOUT_CATEGORIES",
    "STAGE_TABLE",
    "STEP",
    "SYNC_ROOT_NAME",
    "TRAINING_CATEGORIES",
    "WORK_CATEGORIES",
    "StageRule",
    "classify",
    "guessable",
    "is_sync_root",
    "is_weight_load",
    "marker_number",
    "marker_priority",
]

STEP = "step"
OTHER = "other"
IDLE = "idle"


@dataclass(frozen=True)
class StageRule:
    category: str
    pattern: str  # a regular expression searched (not matched) in the span name, case-insensitive
    why: str


STAGE_TABLE: tuple[StageRule, ...] = (
    *(StageRule(STEP, pattern, why) for pattern, why in STEP_MARKERS),  # the merge's step rule, first
    StageRule(
        "weight_sync",
        r"update_weights|sync_weights|weight_sync|weights_update|(load|send|recv|broadcast)_weights"
        r"|wake_up|(^|_)sleep($|_)|resume_memory|release_memory|(^|_)refit($|_)",
        "trainer → rollout weight transfer, and the engine sleep/wake-up around it (colocated mode); "
        "NeMo-RL's refit",
    ),
    StageRule("log_prob", r"log_?prob", "old/ref/actor log-probabilities (forward only)"),
    StageRule(
        "update",
        r"(^|_)update($|_)|update_(actor|critic|policy)|forward_backward|optimi[sz]er|train_step"
        r"|policy_training",
        "policy/critic updates (forward + backward + optimizer); NeMo-RL's policy_training timer",
    ),
    StageRule("generation", r"generat|rollout|(^|_)sampl", "rollout engines: vLLM, SGLang, TokenSpeed, …"),
)

WORK_CATEGORIES: tuple[str, ...] = ("generation", "log_prob", "update", "weight_sync", OTHER)
CATEGORIES: tuple[str, ...] = (*WORK_CATEGORIES, IDLE)
ROLLOUT_CATEGORIES = frozenset({"generation"})
TRAINING_CATEGORIES = frozenset({"log_prob", "update"})

# A name the report may read as an RL stage in a trace WITHOUT RL-Insight spans: one identifier
# (``actor_update``, ``generate_sequences``, ``ProfilerStep#3``), never a phrase or a qualified
# name in which a pattern happens to occur (``## optimizer ##``, ``Optimizer.step#Adam.step``,
# ``execute_…(…)_generation_32``, a Python function ``file.py(12): update``). AReaL's perf tracer
# qualifies its names by component (``train.rollout``, ``ppo_actor.ppo_update``,
# ``train.update_weights``): a dotted chain of identifiers stands for a stage when its LAST part alone
# is one the table knows, as the same category (``optimizer.zero_grad`` does not: ``zero_grad``).
_IDENTIFIER = re.compile(r"^[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)*$")
_QUALIFIED = re.compile(r"^(?:[A-Za-z][A-Za-z0-9_]*\.)+(?P<last>[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)*)$")
_DEVICE_CATEGORIES = ("kernel", "gpu_", "Kernel", "Memcpy", "Memset", "mtia_ccp", "cuda_")
# The rollout section's weight-sync rows: which trainer span is one whole sync (one row each; the
# trainer's other weight-sync spans inside it are its phases), and which replica span loads the weights
# (its ``bytes`` are summed). Both are weight_sync rows of the table above; the report's notes name
# the root span by SYNC_ROOT_NAME so that they say what the code picks.
SYNC_ROOT_NAME = "update_weights"
SYNC_ROOT = re.compile(rf"^{SYNC_ROOT_NAME}$", re.IGNORECASE)
WEIGHT_LOAD = re.compile(r"^load_weights$", re.IGNORECASE)

_COMPILED = tuple((rule, re.compile(rule.pattern, re.IGNORECASE)) for rule in STAGE_TABLE)


@functools.lru_cache(maxsize=65536)
def classify(name: str) -> str:
    """The category of a span name: ``step`` (a marker), a work category, or ``other``."""
    for rule, regex in _COMPILED:
        if regex.search(name):
            return rule.category
    return OTHER


def guessable(name: str, category: str) -> bool:
    """Whether a span of a trace without RL-Insight spans may stand for a stage or a step marker:
    a CPU-side span whose whole name is one identifier the stage table knows (or ``ProfilerStep#N``)."""
    if category.startswith(_DEVICE_CATEGORIES):
        return False
    if marker_number(name) is not None or classify(name) == STEP:  # ProfilerStep#N, rl.grpo.step
        return True
    if _IDENTIFIER.match(name):
        return classify(name) != OTHER
    qualified = _QUALIFIED.match(name)
    return qualified is not None and classify(qualified["last"]) == classify(name) != OTHER


def is_sync_root(name: str) -> bool:
    """A trainer span that is one whole weight sync (``update_weights``, not one of its phases)."""
    return SYNC_ROOT.search(name) is not None


def is_weight_load(name: str) -> bool:
    """A replica span that loads the new weights (it carries the ``bytes`` moved)."""
    return WEIGHT_LOAD.search(name) is not None
