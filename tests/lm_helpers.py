"""Tiny random-init Hugging Face models with a tokenizer written here (nothing is downloaded):
a character-level tokenizer over digits, letters and a few signs, saved as a real model folder."""

from __future__ import annotations

import json
import string
from pathlib import Path

CHARS = string.digits + string.ascii_lowercase + " +-=*#:?.,<>/\n"
SPECIAL = ["<pad>", "<eos>", "<bos>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def write_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + list(CHARS))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(folder))


def tiny_config(arch: str = "llama", vocab: int | None = None) -> object:
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    vocab = vocab or len(SPECIAL) + len(CHARS)
    common = {"vocab_size": vocab, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}
    if arch == "gpt2":
        return GPT2Config(n_embd=32, n_layer=2, n_head=2, n_positions=512, **common)
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch]
    return cls(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        **common,
    )


def tiny_model_folder(folder: Path, arch: str = "llama", seed: int = 0) -> Path:
    """A random-init causal LM folder (config.json, model.safetensors, tokenizer files)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    model = AutoModelForCausalLM.from_config(tiny_config(arch))
    model.save_pretrained(str(folder), safe_serialization=True)
    write_tokenizer(folder)
    return folder


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
