"""The exact ``python -m verl.trainer.main_ppo`` command line and environment for the CPU proof.

Kept apart from the test so it can be run by hand (``python -m tests.verl_e2e.run_ppo OUT``) when
something breaks: VERL's own output is then visible as it happens.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEST_PLUGIN = "tests.verl_e2e.plugin"


def ppo_overrides(
    assets: dict[str, Path],
    out_dir: Path,
    *,
    mode: str = "sync",
    steps: int = 3,
    profile_steps: tuple[int, ...] = (2,),
    discrete: bool = False,
    rollout: str = "mock",
    response_length: int = 8,
) -> list[str]:
    """Hydra overrides: 2 FSDP ranks on gloo, GRPO (no critic, no reference), mock rollout."""
    profile = out_dir / "trace" / "torch"  # inside RL_TRACE_OUTPUT_DIR: one directory to merge
    steps_list = ",".join(str(s) for s in profile_steps)
    separate = mode == "separate_async"
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={assets['train']}",
        f"data.val_files={assets['val']}",
        "data.train_batch_size=4",
        "data.max_prompt_length=64",
        f"data.max_response_length={response_length}",
        "data.dataloader_num_workers=0",
        "data.filter_overlong_prompts=False",
        f"actor_rollout_ref.model.path={assets['model']}",
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "+actor_rollout_ref.model.override_config.attn_implementation=eager",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.use_torch_compile=False",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
        "actor_rollout_ref.actor.fsdp_config.dtype=float32",
        "actor_rollout_ref.actor.strategy=fsdp2",  # FSDP1 refuses CPU modules with sync_module_states
        "actor_rollout_ref.actor.fsdp_config.strategy=fsdp2",
        "actor_rollout_ref.actor.profiler.enable=True",
        "actor_rollout_ref.actor.profiler.all_ranks=True",
        f"actor_rollout_ref.actor.profiler.tool_config.torch.discrete={discrete}",
        f"actor_rollout_ref.rollout.name={rollout}",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "actor_rollout_ref.rollout.disable_log_stats=False",
        "actor_rollout_ref.rollout.load_format=auto",
        "reward.num_workers=1",
        "trainer.device=cpu",
        "trainer.nnodes=1",
        f"trainer.n_gpus_per_node={1 if separate else 2}",
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=['console','rl_insight']",
        f"trainer.v1.trainer_mode={mode}",
        f"trainer.default_local_dir={out_dir / 'ckpt'}",
        "global_profiler.tool=torch",
        f"global_profiler.steps=[{steps_list}]",
        f"global_profiler.save_path={profile}",
        "global_profiler.relocate_results=True",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "transfer_queue.metrics.enabled=True",  # TransferQueue's own /metrics, registered by VERL
        "+ray_kwargs.ray_init.address=local",
        f"ray_kwargs.ray_init.num_cpus={12 if separate else 8}",  # + the standalone replica's bundle
        "+ray_kwargs.ray_init.num_gpus=2",
        "+ray_kwargs.ray_init.include_dashboard=False",
        *(SEPARATE_ASYNC if separate else []),
    ]


# separate_async: one training rank with its hybrid replica (it serves the warm-up batch, then sleeps:
# hybrid switching is off by default) and one standalone replica on its own (fake) GPU, which gets the
# weights after every step through the CPU checkpoint engine of :mod:`.cpu_checkpoint_engine` (loaded
# through VERL's custom_backend_module). Not ``hybrid_engine=False``: VERL 0.9.1 crashes there
# (``logger.info(..., flush=True)`` in ``PPOTrainerSeparateAsync._setup``: a TypeError).
SEPARATE_ASYNC = [
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=cpu_store",
    "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=tests.verl_e2e.cpu_checkpoint_engine",
    "trainer.v1.separate_async.parameter_sync_step=1",
]


def ppo_env(out_dir: Path, base: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    """Environment that every Ray worker inherits from the locally started cluster."""
    env = dict(os.environ if base is None else base)
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            "VERL_USE_EXTERNAL_MODULES": TEST_PLUGIN,
            "VERL_PLATFORM": "cpu",
            "VERL_ENGINE_DEVICE": "cuda",  # VERL's own override: pick the (device-agnostic) FSDP engine
            "RL_TRACE_OUTPUT_DIR": str(out_dir / "trace"),
            "MOCK_ROLLOUT_LOG_DIR": str(out_dir / "mock_log"),  # what the mock servers served
            "RL_INSIGHT_SERVER_URL": "local://rl-trace-observer",
            "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_DEDUP_LOGS": "0",
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1",
            "TQ_METRICS_COLLECT_INTERVAL": "1",  # TransferQueue refreshes its gauges every second
            "RL_TRACE_METRICS": "1",  # the node's metric sampler (engines, TransferQueue, host)
            "RL_TRACE_METRICS_INTERVAL_S": "0.5",
            "TRANSFORMERS_OFFLINE": "1",
        }
    )
    env.pop("CUDA_VISIBLE_DEVICES", None)  # Ray refuses fake GPUs when this hides every device
    env.update(extra)
    return env


def run_ppo(
    assets: dict[str, Path], out_dir: Path, env: dict[str, str], timeout: float, **kw: object
) -> subprocess.CompletedProcess[str]:
    """Run main_ppo to completion in ``out_dir``; the caller asserts on the return code and output."""
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *ppo_overrides(assets, out_dir, **kw)]  # type: ignore[arg-type]
    return subprocess.run(cmd, env=env, cwd=out_dir, capture_output=True, text=True, timeout=timeout)


if __name__ == "__main__":
    from .assets import build_all

    out = Path(sys.argv[1]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    mode = sys.argv[2] if len(sys.argv) > 2 else "sync"
    flags = set(sys.argv[3:])
    real = "--vllm" in flags
    built = build_all(out / "assets", model="llama" if real else "qwen2")
    extra = {"RL_TRACE_VIZTRACER": "1"} if "--viztracer" in flags else {}
    kw = {"rollout": "vllm_cpu", "response_length": 128} if real else {}
    overrides = ppo_overrides(built, out, mode=mode, discrete="--discrete" in flags, **kw)  # type: ignore[arg-type]
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides]
    sys.exit(subprocess.call(cmd, env=ppo_env(out, **extra), cwd=out))
