"""Tiny random-init Hugging Face models with a tokenizer written here (nothing is downloaded): a
character-level tokenizer over digits, letters and a few signs, saved as a real model folder; and
a prompt file of one-digit sums; and preference pairs over those sums (`--pairs`). The tests, the
LLM benchmarks and the README's first language run use them (`python benchmarks/tiny_lm.py` writes
models/tiny-llama and data/sums.jsonl).

A Qwen2.5-0.5B-shaped config (`qwen_05b_config`) gives the benchmarks the real shape with random
weights, from its config alone.
"""

from __future__ import annotations

import json
import string
import sys
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


def qwen_05b_config() -> object:
    """Qwen2.5-0.5B's architecture (its published config.json's numbers), random weights."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=151_936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32_768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )


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


def hf_sample(model: object, ids: object, mask: object, new: int) -> None:
    """transformers' `generate` as TRL calls it, sampling at temperature 1 from the whole
    vocabulary for exactly `new` tokens a row (the benchmarks' baseline)."""
    import torch

    with torch.no_grad():
        model.generate(  # type: ignore[attr-defined]
            ids,
            attention_mask=mask,
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=True,
            top_k=0,
            top_p=1.0,
            temperature=1.0,
            pad_token_id=0,
        )


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def sums_rows() -> list[dict]:
    """Prompts 'a+b=' for one-digit a, b with their `answer` column."""
    return [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(10)]


def sum_pairs(seed: int, per_prompt: int = 4) -> list[dict]:
    """Preference pairs over the sums prompts, a known judge behind them: the right answer is
    preferred to `per_prompt` others each: a wrong sum, the right one with stray characters after
    it, or one to three characters of anything (what a policy samples before it learns; a reward
    model that never saw such replies scores them at random, and a policy finds the ones it
    scores high)."""
    import random

    rng = random.Random(seed)
    rows = []
    for a in range(10):
        for b in range(10):
            right = str(a + b)
            for _ in range(per_prompt):
                draw = rng.random()
                if draw < 0.5:
                    wrong = str(rng.choice([n for n in range(19) if n != a + b]))
                elif draw < 0.65:
                    wrong = right + rng.choice(["+", "=", "0", " 1"])
                elif draw < 0.8:  # three digits: longer than any one-digit sum
                    wrong = "".join(rng.choice(string.digits) for _ in range(3))
                else:
                    wrong = "".join(rng.choice(CHARS[:-1]) for _ in range(rng.randint(1, 3)))
                    wrong = wrong if wrong != right else right + "?"
                rows.append({"prompt": f"{a}+{b}=", "chosen": right, "rejected": wrong})
    rng.shuffle(rows)
    return rows


def write_pairs(path: Path) -> int:
    """The pairs file `path` and its held-out twin (`<stem>-eval.jsonl`, other wrong answers),
    neither of which may exist."""
    held = path.with_name(f"{path.stem}-eval{path.suffix}")
    for p in (path, held):
        if p.exists():
            print(f"tiny_lm: {p} exists; nothing written", file=sys.stderr)
            return 2
    path.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(path, sum_pairs(0))
    write_jsonl(held, sum_pairs(1, per_prompt=1))
    print(f"wrote {path} and {held}")
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="write a tiny random causal LM folder and a prompt file")
    p.add_argument("--model", default="models/tiny-llama", help="the model folder to write (must not exist)")
    p.add_argument("--arch", default="llama", choices=["llama", "qwen2", "gpt2"])
    p.add_argument("--prompts", default="data/sums.jsonl", help="the prompt file to write (must not exist)")
    p.add_argument(
        "--pairs",
        help="write only preference pairs over the sums (the right answer preferred) to this file, "
        "and held-out ones beside it (<stem>-eval.jsonl); neither may exist",
    )
    args = p.parse_args(argv)
    if args.pairs:
        return write_pairs(Path(args.pairs))
    model, prompts = Path(args.model), Path(args.prompts)
    for path in (model, prompts):
        if path.exists():
            print(f"tiny_lm: {path} exists; nothing written", file=sys.stderr)
            return 2
    tiny_model_folder(model, args.arch)
    prompts.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(prompts, sums_rows())
    print(f"wrote {model} and {prompts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
