"""DEMO WORKLOAD: the tiny policy shared by the trainers (torch) and the rollout "engine" (pure Python).

The policy predicts the next token from the two previous ones: ``logits = W · tanh(E1[prev] +
E2[prev2]) + b``. The trainers hold it as a torch module; the rollout actors receive its weights as
plain lists in the weight-sync phase and run it token by token in pure Python — a naive, unbatched
inference engine whose Python call stacks VizTracer records. The reward favours even tokens, so the
mean reward visibly rises over a few PPO steps.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from operator import mul
from typing import Any

VOCAB = 48
HIDDEN = 16
EOS = 1  # odd, so "always stop at once" is never the best policy
PROMPT_LEN = 2
WEIGHT_NAMES = ("e1", "e2", "out_w", "out_b")

Weights = dict[str, Any]  # e1, e2, out_w: VOCAB x HIDDEN nested lists; out_b: VOCAB floats


@dataclass(frozen=True)
class DemoConfig:
    """Sizes of the demo workload, chosen to finish in well under a minute on 2 busy cores."""

    steps: int = 3
    trainers: int = 2
    rollouts: int = 2
    samples_per_replica: int = 48
    max_new_tokens: int = 32
    ppo_epochs: int = 2
    minibatches: int = 2
    lr: float = 0.05
    clip: float = 0.2
    profile_steps: tuple[int, ...] = (2,)
    viztracer_min_duration_us: float = 20.0
    max_running: int = 12  # sequences a replica decodes at once; the others queue (request spans)
    mode: str = "sync"  # "sync", or "async": rollout of step n+1 overlaps training of step n
    seed: int = 1234
    engine: str = (
        "demo"  # "demo" (pure Python, light) or "vllm": a real vLLM per replica (demo/vllm_engine.py)
    )
    model_dir: str | None = None  # --engine vllm: the tiny Llama the replicas serve (built by the driver)


@dataclass
class Sample:
    """One generated sequence, as the driver hands it from rollout to training."""

    tokens: list[int]
    rollout_log_probs: list[float]
    reward: float = 0.0
    advantage: float = 0.0
    replica: int = 0
    weight_version: int = -1
    meta: dict[str, Any] = field(default_factory=dict)


IterationStats = Callable[[int, int, int, int, int], None]


def reward_of(tokens: list[int]) -> float:
    """Fraction of generated tokens that are even: learnable in a handful of steps."""
    gen = tokens[PROMPT_LEN:]
    if not gen:
        return 0.0
    return sum(1 for t in gen if t % 2 == 0) / len(gen)


def prompts_for(step: int, replica: int, count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed * 1_000_003 + step * 101 + replica)
    return [[rng.randrange(2, VOCAB) for _ in range(PROMPT_LEN)] for _ in range(count)]


class PolicyEngine:
    """Pure-Python inference for the policy: the demo's stand-in for a rollout engine."""

    def __init__(self) -> None:
        self.weights: Weights | None = None
        self.version = -1

    def load(self, weights: Weights, version: int) -> None:
        missing = [k for k in WEIGHT_NAMES if k not in weights]
        if missing:
            raise ValueError(f"weights lack {missing}")
        self.weights = {k: weights[k] for k in WEIGHT_NAMES}
        self.version = version

    def logits(self, prev2: int, prev: int) -> list[float]:
        w = self.weights
        assert w is not None, "generate() before the first weight sync"
        hidden = [math.tanh(a + b) for a, b in zip(w["e1"][prev], w["e2"][prev2], strict=True)]
        return [bias + sum(map(mul, row, hidden)) for row, bias in zip(w["out_w"], w["out_b"], strict=True)]

    def sample_next(self, prev2: int, prev: int, rng: random.Random) -> tuple[int, float]:
        logits = self.logits(prev2, prev)
        top = max(logits)
        exps = [math.exp(v - top) for v in logits]
        total = sum(exps)
        u, acc = rng.random() * total, 0.0
        token = len(exps) - 1
        for i, e in enumerate(exps):
            acc += e
            if acc >= u:
                token = i
                break
        return token, math.log(exps[token] / total)

    def decode_step(self, seqs: list[Sample], rng: random.Random) -> int:
        """One engine iteration: one new token for every unfinished sequence; returns how many."""
        done = 0
        for s in seqs:
            if s.tokens[-1] == EOS and len(s.tokens) > PROMPT_LEN:
                continue
            token, logp = self.sample_next(s.tokens[-2], s.tokens[-1], rng)
            s.tokens.append(token)
            s.rollout_log_probs.append(logp)
            done += 1
        return done

    def generate_stream(
        self,
        prompts: list[list[int]],
        max_new: int,
        rng: random.Random,
        max_running: int,
        on_iteration: IterationStats | None = None,
    ) -> Iterator[tuple[int, Sample, dict[str, int]]]:
        """Continuous batching: at most ``max_running`` sequences decode together, the rest wait;
        each sequence is yielded (index, sample, engine times in wall ns) the moment it finishes, as
        a serving engine returns a request: ``queued``, ``scheduled``, ``first_token``,
        ``last_token``. ``on_iteration(running, waiting, prompt_tokens, new_tokens, kv_tokens)``
        is told every engine iteration (what a serving engine's scheduler stats carry)."""
        arrival = time.time_ns()
        seqs = [Sample(tokens=list(p), rollout_log_probs=[], weight_version=self.version) for p in prompts]
        times = [{"queued": arrival} for _ in prompts]
        waiting = list(range(len(prompts)))[::-1]
        running: list[int] = []
        while waiting or running:
            prefilled = 0
            while waiting and len(running) < max_running:
                i = waiting.pop()
                times[i]["scheduled"] = time.time_ns()
                running.append(i)
                prefilled += len(prompts[i])
            new = self.decode_step([seqs[i] for i in running], rng)  # one engine iteration for the batch
            if on_iteration is not None:
                kv = sum(len(seqs[i].tokens) for i in running)
                on_iteration(len(running), len(waiting), prefilled, new, kv)
            now = time.time_ns()
            still = []
            for i in running:
                s = seqs[i]
                times[i].setdefault("first_token", now)
                gen = len(s.tokens) - PROMPT_LEN
                if (s.tokens[-1] == EOS and gen > 0) or gen >= max_new:
                    times[i]["last_token"] = now
                    s.reward = reward_of(s.tokens)
                    yield i, s, times[i]
                else:
                    still.append(i)
            running = still

    def generate(self, prompts: list[list[int]], max_new: int, rng: random.Random) -> list[Sample]:
        seqs = [Sample(tokens=list(p), rollout_log_probs=[], weight_version=self.version) for p in prompts]
        for _ in range(max_new):
            if self.decode_step(seqs, rng) == 0:
                break
        for s in seqs:
            s.reward = reward_of(s.tokens)
        return seqs
