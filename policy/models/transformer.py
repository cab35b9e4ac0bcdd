"""`model.kind: transformer`: a tiny decoder-only transformer trunk for token tasks, the LLM shape
of a policy.

The observation is the context as token ids: the prompt followed by the tokens emitted so far,
filled left to right, with -1 in the slots not yet filled, so its shape never changes. The trunk
embeds the ids, runs causal self-attention over all slots, and returns the features of the last
filled slot: the position an LLM predicts its next token from. Every step re-reads the whole
context (no cache carried between steps), so segments need no recurrent state and stay fixed-shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ...contracts.config import EntrySection, RelayConfig
from ...contracts.spaces import ActionSpec, EnvSpec
from ...policy.trunk import ModelKind, TrunkModule


class CausalBlock(nn.Module):
    """Pre-norm block: causal multi-head self-attention, then a SiLU feed-forward. x [B, S, D]."""

    def __init__(self, d_model: int, heads: int, ff_mult: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_attn = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln_ff = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(
            nn.Linear(d_model, ff_mult * d_model), nn.SiLU(), nn.Linear(ff_mult * d_model, d_model)
        )

    def forward(self, x: Tensor, causal: Tensor) -> Tensor:
        B, S, D = x.shape
        # [B, S, 3, H, D/H] -> three [B, H, S, D/H]
        q, k, v = self.qkv(self.ln_attn(x)).view(B, S, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        # Written out rather than nn.MultiheadAttention so ONNX export and autocast see plain ops.
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D // self.heads))
        attn = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        x = x + self.proj((attn @ v).transpose(1, 2).reshape(B, S, D))
        return x + self.ff(self.ln_ff(x))


class TokenTransformer(TrunkModule):
    """obs [B, S] token ids in [0, vocab_size) or -1 (empty slot) -> features [B, d_model].

    Slots fill left to right; the features are those of the last filled slot (causal attention,
    so it sees exactly the context so far). A row with no filled slot reads slot 0.
    """

    def __init__(
        self,
        seq_len: int,
        vocab_size: int,
        d_model: int = 64,
        heads: int = 4,
        layers: int = 2,
        ff_mult: int = 2,
    ) -> None:
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model={d_model} is not divisible by heads={heads}")
        self.vocab_size = vocab_size
        self.out_dim = d_model
        self.checkpointing = False
        # Id vocab_size embeds the empty slot; causal attention means no filled slot ever reads one.
        self.embed = nn.Embedding(vocab_size + 1, d_model)
        self.pos = nn.Parameter(torch.randn(seq_len, d_model) * 0.02)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.blocks = nn.ModuleList(CausalBlock(d_model, heads, ff_mult) for _ in range(layers))
        self.ln_out = nn.LayerNorm(d_model)
        causal = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
        self.register_buffer("causal", causal, persistent=False)

    def synthetic_input(self, batch: int, obs_shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
        """Random contexts: ids in the vocabulary, a random number of slots filled, -1 after."""
        slots = int(np.prod(obs_shape))
        ids = torch.randint(0, self.vocab_size, (batch, slots), generator=generator)
        filled = torch.randint(1, slots + 1, (batch, 1), generator=generator)
        return torch.where(torch.arange(slots) < filled, ids, -1).float()

    def forward(self, obs: Tensor) -> Tensor:
        ids = obs.long()  # ids arrive as float32 from the buffer; small ints are exact
        filled = ids >= 0
        x = self.embed(torch.where(filled, ids, self.vocab_size)) + self.pos
        for block in self.blocks:
            if self.checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, self.causal, use_reentrant=False)
            else:
                x = block(x, self.causal)
        last = (filled.sum(dim=-1) - 1).clamp(min=0)  # [B]
        x = x.gather(1, last.view(-1, 1, 1).expand(-1, 1, x.shape[-1])).squeeze(1)
        return self.ln_out(x)


class TransformerSettings(EntrySection):
    """`model.transformer`: the token transformer (model.kind=transformer)."""

    vocab_size: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="Token ids the policy reads are 0..vocab_size-1 (-1 marks an empty slot); "
        "None: the number of discrete actions (the policy reads the vocabulary it writes).",
    )
    d_model: int = Field(64, ge=4, le=65_536, description="Embedding width.")
    heads: int = Field(4, ge=1, le=1024, description="Attention heads (must divide d_model).")
    layers: int = Field(2, ge=1, le=1024, description="Transformer blocks.")
    ff_mult: int = Field(2, ge=1, le=64, description="Feed-forward width as a multiple of d_model.")

    @model_validator(mode="after")
    def _heads_divide(self) -> TransformerSettings:
        if self.d_model % self.heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by heads={self.heads}")
        return self


def transformer_settings(cfg: RelayConfig) -> TransformerSettings:
    """A transformer run's `model.transformer`, validated, its defaults filled."""
    return cast(TransformerSettings, TransformerKind().settings_of(cfg))


def token_vocab(cfg: RelayConfig, action: ActionSpec) -> int:
    """The token ids a transformer policy reads: configured, else the discrete actions it writes."""
    vocab = transformer_settings(cfg).vocab_size
    if vocab is not None:
        return vocab
    if action.kind != "discrete":
        raise ValueError("model.transformer.vocab_size must be set for an env with continuous actions")
    return action.size


class TransformerKind(ModelKind):
    settings = TransformerSettings

    def config_problems(self, cfg: RelayConfig) -> list[str]:
        problems = []
        if cfg.model.normalize_obs:
            problems.append("model.kind=transformer reads token ids: set model.normalize_obs=false")
        return problems

    def env_problem(self, cfg: RelayConfig, env: EnvSpec) -> str | None:
        """A token policy needs 1-D integer observations in [-1, vocab) (-1 = empty slot)."""
        try:
            vocab = token_vocab(cfg, env.action)
        except ValueError as err:
            return str(err)
        ok = (
            not env.structured
            and len(env.obs_shape) == 1
            and np.issubdtype(np.dtype(env.obs_dtype), np.integer)
            and env.obs_low >= -1
            and env.obs_high < vocab
        )
        if ok:
            return None
        return (
            f"model.kind=transformer reads token ids (a 1-D integer Box in [-1, {vocab})), "
            f"but {cfg.env.id} observes {env.describe_obs()}"
        )

    def trunk_factory(self, cfg: RelayConfig, env: EnvSpec, in_dim: int) -> Callable[[], TrunkModule]:
        tc, vocab = transformer_settings(cfg), token_vocab(cfg, env.action)
        return lambda: TokenTransformer(env.obs_dim, vocab, tc.d_model, tc.heads, tc.layers, tc.ff_mult)
