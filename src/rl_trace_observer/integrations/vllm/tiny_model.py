"""A tiny random Llama and a byte-level BPE tokenizer, built offline, that a real vLLM serves on CPU.

Why these shapes: vLLM's CPU attention supports only some head sizes (64 is one), so one head of 64;
hidden 64, 2 layers, intermediate 128, vocabulary ~400: ~0.1 M parameters in bf16, ready in seconds.
One token costs 2 layers x (K + V) x 64 x 2 bytes = 512 B of KV cache, so a KV cache of a few
hundred KiB holds a few hundred tokens: enough concurrent requests make vLLM queue and preempt for
real. The tokenizer carries a chat template (VERL's agent loop calls ``apply_chat_template``).
Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "What is 2 + 3? Let's think step by step. The answer is #### 5",
    "Tom has 4 apples and buys 7 more. How many apples does he have? #### 11",
    "A train travels 60 miles in 2 hours. What is its speed? #### 30",
    "user assistant system You are a helpful assistant. Answer with the final number.",
    "0123456789 + - * / = ( ) . , ? ! abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
]
KV_BYTES_PER_TOKEN = 2 * 2 * 64 * 2  # layers x (K, V) x head_dim x bf16


def build_tokenizer(out: Path) -> int:
    """Train and save the tokenizer in ``out``; returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    return len(fast)


def build_tiny_llama(out: Path, *, dtype: str = "bfloat16", seed: int = 0) -> Path:
    """Tokenizer + random-weight Llama in ``out`` (created); returns ``out``."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    vocab = build_tokenizer(out)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=SPECIAL_TOKENS.index("<|im_end|>"),
        pad_token_id=SPECIAL_TOKENS.index("<|endoftext|>"),
        torch_dtype=dtype,
    )
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(str(out), safe_serialization=True)
    GenerationConfig(eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id).save_pretrained(
        str(out)
    )
    return out
