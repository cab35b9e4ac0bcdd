"""A Hugging Face causal language model as a relay policy (`model.kind: causal_lm`).

The folder is data: `config.json` is read as JSON first, and a folder whose config or tokenizer
config asks for remote code (`auto_map`) is refused before transformers sees it; weights load only
from safetensors (a pickled `.bin` is never unpickled); nothing is downloaded.

Shapes are fixed by the caller: prompts left-padded to a bucket length P, completions padded to
`max_new_tokens` C with a mask, so a compiled or graph-captured step never meets a new shape.
Log-probabilities of completions are computed `chunk` positions at a time, each chunk recomputed
in backward, so the `[B, C, vocab]` logits never exist at once (TRL #3678: a 0.6B model's logits
run out of memory long before its parameters do).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from ..contracts.prompts import pad_left
from .weight_files import WeightFilesError, check_weights, weight_files

MAX_JSON_BYTES = 64 << 20  # a config or tokenizer config larger than this is not one
MAX_TEMPLATE_BYTES = 1 << 20  # a chat template file larger than this is not one
# Files transformers reads whole into memory (configs, vocabularies, merges, tokenizer models):
# the largest real ones are tens of MiB (Gemma's tokenizer.json, 33 MB).
READ_WHOLE = (".json", ".txt", ".model", ".jinja")
MAX_READ_WHOLE_BYTES = 256 << 20
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")


class ModelFolderError(ValueError):
    """A model folder that cannot be loaded as data (one line, exit 2)."""


def _read_json(path: Path) -> dict[str, Any]:
    if path.stat().st_size > MAX_JSON_BYTES:
        raise ModelFolderError(f"{path}: larger than {MAX_JSON_BYTES >> 20} MiB, not a config")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelFolderError(f"{path}: not readable JSON ({type(err).__name__})") from None
    if not isinstance(data, dict):
        raise ModelFolderError(f"{path}: not a JSON object")
    return data


def _only_files(root: Path) -> None:
    """Every entry of the folder a load may read is a regular file, or a link to one (the Hugging
    Face cache links snapshots/<revision>/<name> to blobs/<hash>): never a FIFO or a device, which
    a read would hang on or never finish (a `model.safetensors -> /dev/zero`); and none that
    transformers reads whole (configs, tokenizer files, templates) is larger than its kind can be."""
    for entry in root.iterdir():
        if entry.is_dir():
            continue
        if not entry.is_file():
            target = f" (a link to {os.path.realpath(entry)})" if entry.is_symlink() else ""
            raise ModelFolderError(f"{entry}: not a regular file{target}; a model folder holds files")
        if entry.name.startswith("chat_template"):
            cap, kind = MAX_TEMPLATE_BYTES, "a chat template"
        elif entry.suffix in READ_WHOLE:
            cap, kind = MAX_READ_WHOLE_BYTES, "a config or tokenizer file"
        else:
            continue
        if entry.stat().st_size > cap:
            raise ModelFolderError(f"{entry}: larger than {cap >> 20} MiB, not {kind}")


def check_model_folder(
    path: str | os.PathLike[str], weights: bool = True, head: str = "causal_lm"
) -> dict[str, Any]:
    """The folder's config.json as a dict, once everything a load reads is known to be data:
    ModelFolderError naming the file and the reason otherwise. `weights`: also every tensor the
    config implies (for `head`: a causal LM's, or a sequence classifier's), by name and shape, in
    valid safetensors headers (policy/weight_files.py)."""
    from transformers import CONFIG_MAPPING

    root = Path(path)
    if not root.is_dir():
        raise ModelFolderError(f"model.path={path}: not a folder")
    cfg_path = root / "config.json"
    if not cfg_path.is_file():
        raise ModelFolderError(f"model.path={path}: no config.json (a Hugging Face model folder has one)")
    _only_files(root)
    config = _read_json(cfg_path)
    for name in ("config.json", "tokenizer_config.json", "generation_config.json"):
        file = root / name
        if file.is_file() and "auto_map" in (config if name == "config.json" else _read_json(file)):
            raise ModelFolderError(
                f"{file}: asks for remote code (auto_map); relay never runs a model folder's code"
            )
    kind = config.get("model_type")
    if not isinstance(kind, str) or kind not in CONFIG_MAPPING:
        raise ModelFolderError(f"{cfg_path}: model_type {kind!r} is not an architecture transformers knows")
    if not any((root / f).is_file() for f in TOKENIZER_FILES):
        raise ModelFolderError(
            f"model.path={path}: no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, ...)"
        )
    try:
        weight_files(root)
        if weights:
            check_weights(root, _architecture(root, cfg_path), head)
    except WeightFilesError as err:
        raise ModelFolderError(str(err)) from None
    return config


def _architecture(root: Path, cfg_path: Path) -> Any:
    """The folder's transformers config (config.json is data: checked above, no remote code)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(root), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError) as err:
        why = " ".join(str(err).split())[:300]
        raise ModelFolderError(f"{cfg_path}: {type(err).__name__}: {why}") from None


def load_tokenizer(path: str | os.PathLike[str]) -> Any:
    """The folder's tokenizer (left padding: generation appends on the right); a pad token where the
    tokenizer has none (its EOS, as TRL does)."""
    from transformers import AutoTokenizer

    check_model_folder(path, weights=False)
    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        if tok.eos_token_id is None:
            raise ModelFolderError(f"model.path={path}: the tokenizer has neither a pad nor an EOS token")
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(path: str | os.PathLike[str]) -> nn.Module:
    """The folder's `AutoModelForCausalLM` in float32 (master weights; autocast runs it in bf16)."""
    from transformers import AutoModelForCausalLM

    check_model_folder(path)
    try:
        return AutoModelForCausalLM.from_pretrained(
            str(path),
            local_files_only=True,
            trust_remote_code=False,
            use_safetensors=True,
            dtype=torch.float32,
        )
    except (OSError, ValueError, KeyError) as err:
        raise ModelFolderError(
            f"model.path={path}: {type(err).__name__}: {' '.join(str(err).split())[:300]}"
        ) from None


def eos_ids(tokenizer: Any, model: torch.nn.Module) -> list[int]:
    """Every token that ends a completion: the tokenizer's EOS and the generation config's."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    gen = getattr(model, "generation_config", None)
    extra = getattr(gen, "eos_token_id", None)
    ids += extra if isinstance(extra, list) else [extra] if extra is not None else []
    return sorted({int(i) for i in ids})


def folder_weights(path: str) -> dict[str, Tensor]:
    """model.path's weights as a policy's state (keys `model.<name>`), on the CPU: what rank 0
    of a sharded learner loads and hands out (`learner/lm/sharding.py` load_from_rank0)."""
    return {f"model.{k}": v for k, v in load_causal_lm(path).state_dict().items()}


def with_lora(model: nn.Module, lora: Any, task: str = "CAUSAL_LM") -> nn.Module:
    """`model` with peft LoRA adapters (`lora`: contracts.config.LoraConfig); only they train (and,
    for a sequence classifier, task="SEQ_CLS", its score head, which peft keeps whole)."""
    from peft import LoraConfig, get_peft_model

    spec = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type=task,
    )
    return get_peft_model(model, spec)


def checkpoint_blocks(model: Any, lora: bool) -> None:
    """Gradient checkpointing of a transformers model's blocks (`lora`: its embeddings are frozen,
    so the checkpointed blocks' inputs are made to ask for gradients)."""
    # transformers 5 renamed gradient checkpointing "activation checkpointing" (the old names warn).
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if lora:
        model.enable_input_require_grads()


def build_language_policy(cfg: Any, meta: bool = False, empty: bool = False) -> tuple[CausalLMPolicy, Any]:
    """(the policy of a language run's config, its tokenizer): model.path's model, with LoRA
    adapters where model.lora is set. `meta`: the architecture only, on the meta device (for
    shape checks: no weights read, no memory). `empty`: the parameters on the meta device and
    the buffers computed (rotary frequencies and the like, which no weights file holds): for a
    learner rank that is sharded first and given its shards of the weights after
    (`learner/lm/sharding.py` load_from_rank0)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    tok = load_tokenizer(cfg.model.path)
    if meta or empty:
        config = AutoConfig.from_pretrained(
            str(cfg.model.path), local_files_only=True, trust_remote_code=False
        )
        # accelerate (a dependency of peft) is what transformers itself builds empty models with.
        from accelerate import init_empty_weights

        with torch.device("meta") if meta else init_empty_weights(include_buffers=False):
            model = AutoModelForCausalLM.from_config(config)
        # accelerate registers each parameter anew on the meta device, the tied head's too: tie
        # it to its embeddings again, out of its hold.
        model.tie_weights()
    else:
        model = load_causal_lm(cfg.model.path)
    if cfg.model.lora is not None:
        model = with_lora(model, cfg.model.lora)
    return CausalLMPolicy(model, tok.pad_token_id, eos_ids(tok, model)), tok


@dataclass
class Completions:
    """Sampled completions: tokens [B, C] (pad after the end), mask [B, C] (1 through the EOS
    token), the sampler's log-prob of each token [B, C] (0 where masked), and whether each row
    ended by EOS [B] (else it ran out of `max_new_tokens`)."""

    tokens: Tensor
    mask: Tensor
    logp: Tensor
    ended: Tensor


def completion_ids(tokens: Tensor, mask: Tensor) -> list[list[int]]:
    """Each row's completion token ids through its end token: tokens [B, C] cut by mask [B, C]."""
    lengths = mask.sum(-1).long().tolist()
    return [row[:n] for row, n in zip(tokens.tolist(), lengths, strict=True)]


Decode = Callable[[Tensor, Tensor], Completions]


def complete(
    decode: Decode,
    token_ids: list[list[int]],
    buckets: list[int],
    pad_id: int,
    per: int,
    device: torch.device | str = "cpu",
) -> list[list[int]]:
    """The completions' token ids (through each end token) of prompts `token_ids`, sampled `per`
    rows at a time: each batch left-padded into `buckets` and handed to `decode(ids [b, P],
    mask [b, P])` on `device` (a policy's `generate` or its compiled decoder, with the caller's
    settings, noise and precision bound in)."""
    out: list[list[int]] = []
    for start in range(0, len(token_ids), per):
        ids, mask = pad_left(token_ids[start : start + per], buckets, pad_id)
        got = decode(torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device))
        out += completion_ids(got.tokens.cpu(), got.mask.cpu())
    return out


def positions(mask: Tensor) -> Tensor:
    """Position ids [B, L] of a left-padded batch: 0 at each row's first real token."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def capped(logits: Tensor, softcap: float | None) -> Tensor:
    """Logits [..., V] in float32 with the model's final soft-capping (Gemma 2's) applied."""
    logits = logits.float()
    return torch.tanh(logits / softcap) * softcap if softcap is not None else logits


@dataclass(frozen=True)
class NoiseRows:
    """Rows [lo, lo + b) of the noise a whole batch of `rows` draws each step: a learner rank
    decoding its share of a round draws the whole round's [rows, V] and keeps its own, so its
    completions are those one device sampling the whole round would make."""

    generator: torch.Generator
    rows: int
    lo: int

    @property
    def device(self) -> torch.device:
        return self.generator.device


Noise = torch.Generator | NoiseRows  # what a decoder draws its sampling noise from


def sampling_noise(
    generator: Noise | None, shape: tuple[int, int], device: torch.device, greedy: bool = False
) -> Tensor:
    """One decoding step's noise [B, V]: Exp(1) draws from `generator` on its own device, moved to
    `device` (a CPU generator: the same draws on any accelerator, the ML-Agents port's bit-exact
    option); all ones when greedy (the race then picks the likeliest token).

    Drawn as -log U, U uniform: on a CPU torch's `exponential_` takes 6x as long as `rand` and a
    log (8.6 against 1.4 ms for 16 x 32,000), which was a third of a 52M model's compiled decode
    step. U's 0 (one draw in 2^24) is lifted to 2^-25, so every E is finite and above 0 (the
    race divides by it)."""
    if greedy:
        return torch.ones(shape, device=device)
    where = generator.device if generator is not None else device
    if isinstance(generator, NoiseRows):
        whole = torch.rand((generator.rows, shape[1]), device=where, generator=generator.generator)
        u = whole[generator.lo : generator.lo + shape[0]]
    else:
        u = torch.rand(shape, device=where, generator=generator)
    draws = u.clamp_min_(2.0**-25).log_().neg_()
    return draws.to(device, non_blocking=True)


def next_token(
    logits: Tensor,
    noise: Tensor,
    temperature: float,
    top_k: int,
    done: Tensor,
    eos_ids: Tensor,
    pad_id: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One decoding step's sample from float32 logits [B, V] and noise [B, V] (`sampling_noise`).

    The exponential race: argmax of p / E with E ~ Exp(1) draws each token with probability p
    (the Gumbel-max trick without its two logs), so the step is one fixed-shape graph with its
    randomness as an input, not a data-dependent `multinomial`. top_k > 0 races only the k
    likeliest. Returns (token [B] (pad where the row had ended), its log-prob under the full
    tempered distribution [B] (0 there), live [B] float, done [B] after this token)."""
    logp_all = F.log_softmax(logits / temperature, dim=-1)
    weights = logp_all.exp()
    if top_k and top_k < weights.shape[-1]:
        kth = weights.topk(top_k, dim=-1).values[:, -1:]
        weights = torch.where(weights >= kth, weights, torch.zeros_like(weights))
    tok = (weights / noise).argmax(dim=-1)
    tok = torch.where(done, torch.full_like(tok, pad_id), tok)
    live = (~done).float()
    logp = logp_all.gather(-1, tok.unsqueeze(-1)).squeeze(-1) * live
    done = done | (tok.unsqueeze(-1) == eos_ids).any(-1)
    return tok, logp, live, done


def _chunk_logp(
    head: nn.Module, softcap: float | None, h: Tensor, tokens: Tensor, temperature: float
) -> Tensor:
    """[B, c] log-probs and [B, c] entropies of `tokens` under the head's logits of hidden states
    h [B, c, H], in float32 (a bf16 log-softmax over a large vocab loses the small log-probs)."""
    logp_all = F.log_softmax(capped(head(h), softcap) / temperature, dim=-1)
    logp = logp_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return torch.stack([logp, entropy])


class CausalLMPolicy(nn.Module):
    """A `LanguagePolicy` around a transformers causal LM. `eos_ids`: the tokens that end a
    completion; `pad_id`: what fills a completion after its end and a prompt before its start."""

    def __init__(self, model: nn.Module, pad_id: int, eos_ids: list[int]) -> None:
        super().__init__()
        self.model: Any = model  # a transformers PreTrainedModel (typed loosely: its API is dynamic)
        self.pad_id = int(pad_id)
        self.eos_ids: Tensor
        self.register_buffer(
            "eos_ids", torch.tensor(sorted(set(eos_ids)), dtype=torch.long), persistent=False
        )
        cap = getattr(model.config, "final_logit_softcapping", None)
        self.softcap: float | None = float(cap) if cap else None
        # transformers 5 renamed the KV cache argument and output `past_key_values` -> `cache`.
        inner: Any = getattr(model, "get_base_model", lambda: model)()
        params = inspect.signature(inner.forward).parameters
        self._cache = "cache" if "cache" in params else "past_key_values"

    def train(self, mode: bool = True) -> CausalLMPolicy:
        """Training or evaluation mode of every module. Set directly: transformers' own `train`
        also re-registers hub kernel mappings (its `kernels` integration, which relay never uses:
        kernels from the hub are remote code), about a millisecond a call, twice a round."""
        for module in self.modules():
            module.training = mode
        return self

    @property
    def lm(self) -> Any:
        """The transformers causal LM (inside its peft wrapper where it has LoRA adapters)."""
        return self.model.get_base_model() if self.lora else self.model

    @property
    def lora(self) -> bool:
        return hasattr(self.model, "disable_adapter")

    @property
    def vocab_size(self) -> int:
        return int(self.lm.get_output_embeddings().weight.shape[0])

    def acting_weights(self) -> dict[str, Tensor]:
        """What changes as it trains: every weight, or only the LoRA adapters' (the base is frozen
        and every generator loaded it from model.path)."""
        return {k: v.detach() for k, v in self.acting_part(self.state_dict()).items()}

    def acting_part(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """Of a whole state dict, what changes as it trains (`acting_weights`)."""
        return {k: v for k, v in state.items() if "lora_" in k} if self.lora else state

    def reference_mode(self) -> contextlib.AbstractContextManager[Any]:
        """With LoRA, the frozen base model (adapters off): the KL reference for free."""
        return self.model.disable_adapter() if self.lora else contextlib.nullcontext()

    def set_checkpointing(self, enabled: bool) -> None:
        """Gradient checkpointing of the transformer blocks (the tutorial's memory lever)."""
        lm = self.lm
        if enabled:
            checkpoint_blocks(lm, self.lora)
        else:
            (getattr(lm, "activation_checkpointing_disable", None) or lm.gradient_checkpointing_disable)()

    @torch.no_grad()  # not inference_mode: the completions are the update's inputs, saved for backward
    def generate(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int = 0,
        generator: Noise | None = None,
    ) -> Completions:
        """Sample a completion for each left-padded prompt [B, P] (mask [B, P]) with a KV cache.

        Every row decodes `max_new_tokens` steps' worth of shape: a row that ended keeps emitting
        pad under mask 0, and the loop stops early only when every row has ended. The noise of
        each step comes from `generator` (drawn on its device: a CPU generator gives the same
        draws on every device). This is the plain reference of `policy/lm_decoding.py`'s compiled
        static-cache decoder, which samples the same tokens from the same draws."""
        batch, device = prompt_ids.shape[0], prompt_ids.device
        attn = prompt_mask.long()
        pos = positions(attn)
        out = self.model(
            input_ids=prompt_ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1
        )
        past = getattr(out, self._cache)
        logits = out.logits[:, -1]
        vocab = logits.shape[-1]
        tokens = torch.full((batch, max_new_tokens), self.pad_id, dtype=torch.long, device=device)
        mask = torch.zeros((batch, max_new_tokens), dtype=torch.float32, device=device)
        logps = torch.zeros((batch, max_new_tokens), dtype=torch.float32, device=device)
        done = torch.zeros(batch, dtype=torch.bool, device=device)
        last = pos[:, -1:]
        for t in range(max_new_tokens):
            noise = sampling_noise(generator, (batch, vocab), device, greedy=top_k == 1)
            tok, logp, live, done = next_token(
                capped(logits, self.softcap), noise, temperature, top_k, done, self.eos_ids, self.pad_id
            )
            tokens[:, t], mask[:, t], logps[:, t] = tok, live, logp
            if bool(done.all()) or t == max_new_tokens - 1:
                break
            attn = torch.cat([attn, torch.ones((batch, 1), dtype=attn.dtype, device=device)], dim=1)
            last = last + 1
            out = self.model(
                input_ids=tok.unsqueeze(-1),
                attention_mask=attn,
                position_ids=last,
                use_cache=True,
                **{self._cache: past},
            )
            past, logits = getattr(out, self._cache), out.logits[:, -1]
        return Completions(tokens, mask, logps, done)

    def completion_logp(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        completion: Tensor,
        completion_mask: Tensor,
        temperature: float = 1.0,
        chunk: int = 128,
        with_entropy: bool = True,
    ) -> tuple[Tensor, Tensor | None]:
        """(log-probs [B, C], entropies [B, C] or None) of `completion` [B, C] after the prompts
        [B, P], under the model's current weights (gradients flow where enabled). One forward pass
        of the transformer; the head's logits `chunk` positions at a time, recomputed in backward."""
        ids = torch.cat([prompt_ids, completion], dim=1)
        attn = torch.cat([prompt_mask.long(), completion_mask.long()], dim=1)
        base = self.lm.base_model
        hidden = base(input_ids=ids, attention_mask=attn, position_ids=positions(attn), use_cache=False)
        h = hidden.last_hidden_state[:, prompt_ids.shape[1] - 1 : -1]  # position t predicts token t+1
        head = self.lm.get_output_embeddings()
        parts = []
        for start in range(0, completion.shape[1], chunk):
            hc, tc = h[:, start : start + chunk], completion[:, start : start + chunk]
            if torch.is_grad_enabled():
                parts.append(
                    checkpoint(_chunk_logp, head, self.softcap, hc, tc, temperature, use_reentrant=False)
                )
            else:
                parts.append(_chunk_logp(head, self.softcap, hc, tc, temperature))
        # Two concatenations, not one and two views of it: a sharded policy's FSDP root hooks
        # its outputs for backward, which a view of an output would bypass.
        logp = torch.cat([p[0] for p in parts], dim=1)  # [B, C]
        return logp, (torch.cat([p[1] for p in parts], dim=1) if with_entropy else None)

    def save_pretrained(self, folder: str | os.PathLike[str]) -> None:
        """The model as a Hugging Face folder (safetensors), loadable by `from_pretrained`; LoRA
        adapters are merged into a copy of the weights first (a plain model folder)."""
        model = copy.deepcopy(self.model).merge_and_unload() if self.lora else self.model
        model.save_pretrained(str(folder), safe_serialization=True)
