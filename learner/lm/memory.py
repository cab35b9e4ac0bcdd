"""Will it fit? The memory one learner device holds in a language run, estimated before anything
loads from the model folder's config (its architecture built on the meta device: counts, no
weights) and the run's settings: learner.num_learners and learner.parallel, LoRA, precision,
micro-batches, log-prob chunks, generation's budget.

The terms (bytes per device, N ranks sharding with FSDP2, N = 1 holding everything):
- weights: float32 master parameters, P * 4 / N (`learner_param_bytes` measures it);
- gradients and optimizer: the trainable T's float32 gradients and Adam's two moments, T * 12 / N;
- reference: a KL reference model's float32 copy, P * 4 / N (none with LoRA, or kl_coef 0);
- gathered: what FSDP unshards at once in the update, the root unit and two blocks (the one
  computing and the one prefetched), in the gathered dtype (bf16 under autocast, else float32);
- reduced: the whole gradients of the units not yet reduce-scattered in the backward pass, the
  root unit's (from the head's backward, first, to the embeddings', last) and a block's, float32;
- activations: a micro-batch's learner.lm.micro_batch_tokens through the blocks (with gradient
  checkpointing only each block's input is kept, plus one block's inside), float32;
- logits: one chunk of learner.lm.logprob_chunk positions' [rows, chunk, vocab] logits, three
  copies live (the logits, their softmax, the gradient);
- generation: the whole model gathered (N > 1), the KV cache of this rank's rows over prompt and
  completion, and a step's [rows, vocab] logits and noise.
The peak is the larger phase: the update (weights, gradients, optimizer, reference, gathered,
reduced, activations, logits) or generation (weights, optimizer, reference, generation: the
learner frees its gradients after each update). It is an estimate:
allocator slack, the framework's own buffers and fragmentation come on top.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GIB = 1024**3


@dataclass(frozen=True)
class Architecture:
    """What the estimate reads of a causal LM: parameter counts and the shapes that size
    activations, logits and the KV cache."""

    parameters: int
    trainable: int
    layers: int
    hidden: int
    intermediate: int
    vocab: int
    kv_heads: int
    head_dim: int
    tied: bool

    @staticmethod
    def of(policy: Any, config: Any) -> Architecture:
        """From a policy (on the meta device is enough) and its transformers config."""
        heads = int(config.num_attention_heads)
        hidden = int(config.hidden_size)
        return Architecture(
            parameters=sum(p.numel() for p in policy.parameters()),
            trainable=sum(p.numel() for p in policy.parameters() if p.requires_grad),
            layers=int(config.num_hidden_layers),
            hidden=hidden,
            intermediate=int(getattr(config, "intermediate_size", None) or 4 * hidden),
            vocab=int(config.vocab_size),
            kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(config, "head_dim", None) or hidden // heads),
            tied=bool(getattr(config, "tie_word_embeddings", False)),
        )


@dataclass(frozen=True)
class Settings:
    """The run's settings the estimate reads (from the config: `settings_of`)."""

    ranks: int
    half: bool  # bf16 autocast: gathered parameters and the KV cache in 2 bytes
    reference: bool
    checkpointing: bool
    micro_batch_tokens: int
    logprob_chunk: int
    rows: int  # a round's completions: prompts.batch_size x learner.group_size
    prompt_tokens: int
    new_tokens: int


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per learner device, by term (see the module docstring)."""

    weights: int
    gradients: int
    optimizer: int
    reference: int
    gathered: int
    reduced: int
    activations: int
    logits: int
    generation: int

    @property
    def update(self) -> int:
        return (
            self.weights
            + self.gradients
            + self.optimizer
            + self.reference
            + self.gathered
            + self.reduced
            + self.activations
            + self.logits
        )

    @property
    def peak(self) -> int:
        return max(self.update, self.weights + self.optimizer + self.reference + self.generation)

    def describe(self) -> str:
        def gib(n: int) -> str:
            return f"{n / GIB:.3g} GiB" if n >= GIB / 100 else f"{n / 1024**2:.3g} MiB"

        terms = ", ".join(f"{name} {gib(getattr(self, name))}" for name in TERMS if getattr(self, name))
        return f"peak {gib(self.peak)} ({terms})"


TERMS = (
    "weights",
    "gradients",
    "optimizer",
    "reference",
    "gathered",
    "reduced",
    "activations",
    "logits",
    "generation",
)


def estimate(arch: Architecture, s: Settings) -> MemoryEstimate:
    """The estimate of one learner device's memory (the module docstring's terms)."""
    n, half_bytes = s.ranks, 2 if s.half else 4
    root = arch.vocab * arch.hidden * (1 if arch.tied else 2)
    block = max(arch.parameters - root, 0) // max(arch.layers, 1)
    per_token_block = (10 * arch.hidden + 3 * arch.intermediate) * 4  # inside one block, float32
    width = s.prompt_tokens + s.new_tokens
    rows = s.rows // n
    tokens = min(s.micro_batch_tokens, rows * width)  # a micro-batch holds at most the rank's rows
    if s.checkpointing:
        activations = tokens * arch.hidden * arch.layers * 4 + tokens * per_token_block
    else:
        activations = tokens * per_token_block * arch.layers
    micro_rows = max(1, min(tokens // max(width, 1), rows))
    kv = rows * width * arch.layers * 2 * arch.kv_heads * arch.head_dim * half_bytes
    return MemoryEstimate(
        weights=arch.parameters * 4 // n,
        gradients=arch.trainable * 4 // n,
        optimizer=arch.trainable * 8 // n,
        reference=arch.parameters * 4 // n if s.reference else 0,
        gathered=(root + 2 * block) * half_bytes if n > 1 else 0,
        reduced=(root + block) * 4 if n > 1 and arch.trainable == arch.parameters else 0,
        activations=activations,
        logits=micro_rows * min(s.logprob_chunk, s.new_tokens) * arch.vocab * 4 * 3,
        generation=(arch.parameters * half_bytes if n > 1 else 0) + kv + rows * arch.vocab * 4 * 2,
    )
