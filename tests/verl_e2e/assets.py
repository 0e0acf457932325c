"""Build, offline, everything VERL's ``main_ppo`` needs to train on CPU: model, tokenizer, data.

- A byte-level BPE tokenizer trained (``tokenizers``) on a few strings, wrapped as a
  ``PreTrainedTokenizerFast`` with a tiny chat template, because VERL's agent loop calls
  ``apply_chat_template``.
- A Qwen2-architecture causal LM with random weights, small enough that an FSDP step on two gloo
  ranks takes well under a second, saved with ``save_pretrained`` so VERL loads it like any
  checkpoint.
- Train/validation parquet files in VERL's RL format (``data_source``, chat ``prompt``,
  ``reward_model.ground_truth``) using ``openai/gsm8k`` as data source so VERL's built-in
  rule-based scorer runs.

Nothing is downloaded. Run as ``python -m tests.verl_e2e.assets OUT_DIR`` to build by hand.
"""

from __future__ import annotations

import sys
from pathlib import Path

# the tokenizer is the one the real-vLLM tiny Llama uses (one builder, in the package)
from rl_trace_observer.integrations.vllm.tiny_model import (
    CHAT_TEMPLATE,
    CORPUS,
    SPECIAL_TOKENS,
    build_tokenizer,
)

__all__ = ["CHAT_TEMPLATE", "CORPUS", "SPECIAL_TOKENS", "build_all", "build_model", "build_tokenizer"]


def build_model(out: Path, vocab_size: int) -> None:
    """A 2-layer Qwen2 with random weights (fixed seed), saved next to the tokenizer."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=SPECIAL_TOKENS.index("<|im_end|>"),
        pad_token_id=SPECIAL_TOKENS.index("<|endoftext|>"),
        torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(str(out), safe_serialization=True)
    GenerationConfig(eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id).save_pretrained(
        str(out)
    )


def build_dataset(out: Path, rows: int) -> None:
    """``rows`` arithmetic prompts in VERL's RL parquet schema."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = []
    for i in range(rows):
        a, b = i % 7 + 1, i % 5 + 2
        records.append(
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "user", "content": f"What is {a} + {b}? Answer with ####."}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"split": out.stem, "index": i},
            }
        )
    pq.write_table(pa.Table.from_pylist(records), str(out))


def build_all(root: Path, train_rows: int = 16, val_rows: int = 4, model: str = "qwen2") -> dict[str, Path]:
    """Build model, tokenizer and data under ``root``; returns their paths. ``model="llama"``: the tiny
    Llama a real vLLM serves on CPU (one head of 64: what its CPU attention supports), bf16."""
    if model == "llama":
        from rl_trace_observer.integrations.vllm.tiny_model import build_tiny_llama

        model_dir = build_tiny_llama(root / "tiny-llama")
    else:
        model_dir = root / "tiny-qwen2"
        model_dir.mkdir(parents=True, exist_ok=True)
        vocab = build_tokenizer(model_dir)
        build_model(model_dir, vocab)
    train, val = root / "train.parquet", root / "val.parquet"
    build_dataset(train, train_rows)
    build_dataset(val, val_rows)
    return {"model": model_dir, "train": train, "val": val}


if __name__ == "__main__":
    print(build_all(Path(sys.argv[1])))
