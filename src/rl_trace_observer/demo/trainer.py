"""DEMO WORKLOAD: a trainer rank — a tiny torch policy, PPO updates, gloo all-reduce, torch.profiler.

Spans use VERL's vocabulary on the lane ``rank_<r>``: ``actor_compute_log_prob``, ``actor_update``
and ``update_weights`` (rank 0 publishes the weights). In a profiled step the torch profiler runs
from the step's first call to its last and its Chrome trace (with the top-level
``baseTimeNanoseconds`` anchor) is exported as ``.json.gz`` and registered in the process record.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from . import observe
from .model import HIDDEN, PROMPT_LEN, VOCAB, DemoConfig, Sample, Weights


class TinyPolicy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.e1 = nn.Embedding(VOCAB, HIDDEN)
        self.e2 = nn.Embedding(VOCAB, HIDDEN)
        self.out = nn.Linear(HIDDEN, VOCAB)

    def forward(self, prev2: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.out(torch.tanh(self.e1(prev) + self.e2(prev2))), dim=-1)


def _positions(samples: list[Sample]) -> dict[str, torch.Tensor]:
    """One row per generated token: its two-token context, the token, and its sample's advantage."""
    prev2, prev, target, adv, rollout_lp = [], [], [], [], []
    for s in samples:
        for i in range(PROMPT_LEN, len(s.tokens)):
            prev2.append(s.tokens[i - 2])
            prev.append(s.tokens[i - 1])
            target.append(s.tokens[i])
            adv.append(s.advantage)
            rollout_lp.append(s.rollout_log_probs[i - PROMPT_LEN])
    return {
        "prev2": torch.tensor(prev2, dtype=torch.long),
        "prev": torch.tensor(prev, dtype=torch.long),
        "target": torch.tensor(target, dtype=torch.long),
        "adv": torch.tensor(adv, dtype=torch.float32),
        "rollout_lp": torch.tensor(rollout_lp, dtype=torch.float32),
    }


class TrainerWorker:
    """Body of a trainer actor (wrapped with ``ray.remote`` by the driver)."""

    def __init__(self, rank: int, config: DemoConfig, master_port: int) -> None:
        torch.set_num_threads(1)
        torch.manual_seed(config.seed)  # every rank starts from the same weights
        self.rank, self.config, self.lane = rank, config, f"rank_{rank}"
        self.master_port = master_port
        self.policy = TinyPolicy()
        self.optim = torch.optim.Adam(self.policy.parameters(), lr=config.lr)
        self._batch: dict[str, torch.Tensor] | None = None
        self._prof: Any = None
        self._profiled_step: int | None = None

    def setup(self) -> int:
        """Join the gloo group (every rank must call this at the same time), then start capture."""
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{self.master_port}",
            rank=self.rank,
            world_size=self.config.trainers,
            timeout=datetime.timedelta(seconds=120),
        )
        observe.start("trainer", rank=self.rank, world_size=self.config.trainers)
        return os.getpid()

    def start_profile(self, step: int) -> None:
        self._prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        self._prof.start()
        self._profiled_step = step

    def stop_profile(self) -> str | None:
        prof, step = self._prof, self._profiled_step
        self._prof = self._profiled_step = None
        if prof is None:
            return None
        prof.stop()
        name = f"demo_trainer_step{step}_rank{self.rank}-of-{self.config.trainers}_pid{os.getpid()}.json.gz"
        path = observe.artifact_dir("torch") / name
        prof.export_chrome_trace(str(path))
        observe.register(path, "torch", step=step, role="trainer", rank=self.rank)
        return str(path)

    def get_weights(self, version: int) -> Weights | None:
        """Rank 0 publishes its weights for the rollout replicas (all ranks hold the same ones)."""
        with observe.stage("update_weights", self.lane, step=version):
            if self.rank != 0:
                return None
            with torch.no_grad(), torch.profiler.record_function("gather_weights"):
                sd = self.policy.state_dict()
                return {
                    "e1": sd["e1.weight"].tolist(),
                    "e2": sd["e2.weight"].tolist(),
                    "out_w": sd["out.weight"].tolist(),
                    "out_b": sd["out.bias"].tolist(),
                }

    def compute_log_prob(self, step: int, samples: list[Sample]) -> int:
        with observe.stage("actor_compute_log_prob", self.lane, step=step):
            batch = _positions(samples)
            with torch.no_grad(), torch.profiler.record_function("old_log_prob"):
                logp = self.policy(batch["prev2"], batch["prev"])
                batch["old_lp"] = logp.gather(1, batch["target"][:, None])[:, 0]
            self._batch = batch
        return int(batch["target"].numel())

    def update(self, step: int) -> dict[str, float]:
        cfg, batch = self.config, self._batch
        assert batch is not None, "update() before compute_log_prob()"
        stats: dict[str, list[float]] = {"pg_loss": [], "clipfrac": [], "approx_kl": [], "grad_norm": []}
        with observe.stage("actor_update", self.lane, step=step):
            n = int(batch["target"].numel())
            for _epoch in range(cfg.ppo_epochs):
                for idx in torch.arange(n).chunk(cfg.minibatches):
                    self._minibatch({k: v[idx] for k, v in batch.items()}, stats)
        self._batch = None
        means = {k: sum(v) / max(len(v), 1) for k, v in stats.items()}
        for key, value in means.items():
            observe.gauge(f"actor/{key}", value, rank=str(self.rank), step=str(step))
        return means

    def _minibatch(self, mb: dict[str, torch.Tensor], stats: dict[str, list[float]]) -> None:
        with torch.profiler.record_function("forward"):
            logp = self.policy(mb["prev2"], mb["prev"]).gather(1, mb["target"][:, None])[:, 0]
            ratio = torch.exp(logp - mb["old_lp"])
            clipped = torch.clamp(ratio, 1 - self.config.clip, 1 + self.config.clip)
            loss = -torch.min(ratio * mb["adv"], clipped * mb["adv"]).mean()
        self.optim.zero_grad()
        with torch.profiler.record_function("backward"):
            loss.backward()  # type: ignore[no-untyped-call]
        with torch.profiler.record_function("allreduce_grads"):
            for p in self.policy.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= self.config.trainers
        with torch.profiler.record_function("optimizer_step"):
            norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), 1.0)
            self.optim.step()
        with torch.no_grad():
            stats["pg_loss"].append(float(loss))
            stats["clipfrac"].append(float(((ratio - 1).abs() > self.config.clip).float().mean()))
            stats["approx_kl"].append(float((mb["old_lp"] - logp).mean()))
            stats["grad_norm"].append(float(norm))

    def shutdown(self) -> None:
        self.stop_profile()
        observe.finish()
        if dist.is_initialized():
            dist.destroy_process_group()
