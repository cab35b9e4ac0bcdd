"""`generation.compile`: a causal LM's decoding as one compiled fixed-shape step over a static KV
cache, compiled once and never again, whatever the prompts' lengths.

Why it is fast: the eager loop (`CausalLMPolicy.generate`, the plain reference this is tied to by a
test) spends most of a small model's step in Python (transformers' forward, a growing cache and
mask); compiled, a step is one graph. Why it compiles once: every input of the step has one shape
for the whole run.
- The KV cache (transformers' `StaticCache`) is sized once, to the widest prompt bucket plus
  `max_new_tokens`; a prompt of a narrower bucket fills the first slots, the causal mask hides the
  slots past the step, so every bucket decodes through the same graph (the prefill runs eagerly:
  once per call, its shape is the bucket's).
- The attention mask is that width from the start (the prompt's padding 0, every later slot 1);
  the step's position ids and the cache's write position are tensors, not Python ints.
- Batches smaller than the first one (an evaluation's last chunk) are padded up to it with copies
  of their first row and cut after.
- Sampling is in the graph with its noise as an input (`causal_lm.next_token`'s exponential race);
  greedy decoding is the same graph with noise of ones.
- Under autocast the matrix products' weights are cast once per weights version, not once per
  step: autocast's own cache of casts lives inside one eager autocast region, and a compiled graph
  casts every float32 weight again on every call (for a model whose step is its matrix products,
  that cast cost more than the products). The decoder keeps each `nn.Linear` weight in the
  autocast dtype (the bytes autocast would make: the same tokens) and makes them again when the
  weights change in place (an optimizer step, a load); it costs a low-precision copy of those
  weights. For the same reason the KV cache keeps its keys and values in the autocast dtype
  (`_storing`): attention would otherwise cast the whole cache every step.
`compiles` counts graphs handed to the backend; after the first call it must not move, and the
decoder says so on stderr once if it does. No Ray and no device layer here: the caller hands in the
torch.compile backend (the learner's `DeviceContext.compile_backend`: torchair's graph mode on
npu, inductor elsewhere).
"""

from __future__ import annotations

import copy
import functools
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch._dynamo
from torch import Tensor

from .causal_lm import CausalLMPolicy, Completions, Noise, capped, next_token, positions, sampling_noise
from .compiling import counting_compile, torch_backend


class DecoderError(RuntimeError):
    """What compiled decoding needs and this model or install lacks, in one line."""


def decoding_problem(model_config: Any) -> str | None:
    """Why this transformers install or this architecture (a transformers config) cannot decode
    through one compiled graph, in one line; None when it can. Nothing is instantiated."""
    from transformers import AutoModelForCausalLM, StaticCache

    if "max_batch_size" in StaticCache.__init__.__code__.co_varnames:
        return (
            "generation.compile needs transformers >= 5 (its StaticCache that sizes itself); "
            "upgrade transformers or set generation.compile=false"
        )
    try:
        found = AutoModelForCausalLM._model_mapping[type(model_config)]
    except KeyError:
        return None  # not an architecture transformers maps: loading the model says so
    cls: Any = next((c for c in (found if isinstance(found, tuple) else (found,)) if c is not None), None)
    if not getattr(cls, "_can_compile_fullgraph", False):
        return (
            f"generation.compile: transformers cannot compile {cls.__name__}'s forward as one graph; "
            "set generation.compile=false"
        )
    return None


def _static_cache(policy: CausalLMPolicy, width: int, store: torch.dtype | None) -> Any:
    """transformers' StaticCache `width` slots wide; `store`: the dtype its layers keep keys and
    values in (None: whatever the first keys come in)."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    problem = decoding_problem(policy.lm.config)
    if problem:
        raise DecoderError(problem)
    cache = StaticCache(config=policy.lm.config, max_cache_len=width)
    layers: list[Any] = cache.layers
    for layer in layers:
        if store is not None and isinstance(layer, StaticLayer):  # full and sliding-window layers
            layer.__class__ = _storing(type(layer), store)
    return cache


@functools.cache
def _storing(layer_class: type[Any], store: torch.dtype) -> type[Any]:
    """`layer_class` (a static cache layer) that casts keys and values to `store` before keeping
    them.

    Why: under autocast a Llama's keys leave the rotary embedding in float32 (its cos and sin
    follow the float32 residual stream), so the cache is float32, and attention (autocast's bf16
    list) casts the whole cache to bf16 on every decode step: for the 52M benchmark model 138 MB
    read and 69 MB written a step, more than its weights. Stored as bf16 they are the bytes that
    cast makes (the same attention, the same tokens), cast once, one position a step."""

    def update(self: Any, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> Any:
        return layer_class.update(self, key_states.to(store), value_states.to(store), *args, **kwargs)

    return type(f"Storing{layer_class.__name__}", (layer_class,), {"update": update})


class StaticDecoder:
    """`policy.generate`'s compiled form: called as `decoder(prompt_ids, prompt_mask,
    max_new_tokens, temperature, top_k, generator)` with left-padded prompts [B, P], it returns the
    same `Completions` ([B, C] tokens, mask, log-probs; [B] ended).

    `backend`: a torch.compile backend or the name of one torch has; `max_prompt`: the widest
    prompt bucket; `temperature` and `top_k`: the run's (a graph constant;
    top_k=1, greedy, is the same graph with noise of ones and may always be asked);
    `cast_once`: under autocast, the matrix products' weights cast once per weights version and
    the KV cache kept in the autocast dtype (False: both cast by the graph on every call, the
    plain form it is tied to)."""

    def __init__(
        self,
        policy: CausalLMPolicy,
        backend: Any,
        max_prompt: int,
        temperature: float,
        top_k: int,
        cast_once: bool = True,
    ) -> None:
        # Dynamo caches compiled frames on the step's code object, shared by every decoder of the
        # process: a decoder starts from an empty cache so its count is its own.
        torch._dynamo.reset()
        if isinstance(backend, str):  # a backend torch names (auto: inductor, aot_eager, eager)
            backend = torch_backend(backend)
        self.policy, self.max_prompt = policy, int(max_prompt)
        self.temperature, self.top_k = float(temperature), int(top_k)
        self.compiles = 0
        self.warm_compiles: int | None = None
        self._warned = False
        self._rows = 0
        self._width = 0
        self._cache: Any = None
        self._store: torch.dtype | None = None  # the dtype the cache keeps (None: the keys')
        self._key = policy._cache  # the forward's KV-cache keyword (cache / past_key_values)
        self.cast_once = cast_once
        self._low: dict[str, Tensor] = {}  # nn.Linear weights in the autocast dtype
        self._low_made: tuple[Any, ...] | None = None  # what they were made from
        self._version: int | None = None  # the weights version `load` was last told
        self._shell: torch.nn.Module | None = None  # `unhook`: the model's structure, no tensors
        self._step = counting_compile(self._decode_step, backend, self._count, fullgraph=True)

    def counts(self) -> dict[str, int]:
        """The metrics line's `compiles`."""
        return {"compiles": self.compiles}

    def load(self, version: int, weights: Callable[[], Mapping[str, Tensor]]) -> None:
        """Nothing to load: it samples from the policy's own tensors (its low-precision copies are
        remade for a new version, or when those tensors change, `_low_weights`)."""
        self._version = version

    def unhook(self) -> None:
        """Called before the policy's model is sharded over a learner group (FSDP2): a sharded
        model gathers its units' parameters in hooks the compiler refuses to trace (they are
        `torch._dynamo.disable`d), so from now on the decoder runs a copy of the model's
        structure made here, before any hook, that holds no tensors (each one on the meta
        device), handed the gathered model's own by `functional_call` on every call."""
        model = self.policy.model
        memo: dict[int, Any] = {}
        for t in model.parameters():
            memo[id(t)] = torch.nn.Parameter(torch.empty_like(t, device="meta"), requires_grad=False)
        for t in model.buffers():
            memo[id(t)] = torch.empty_like(t, device="meta")
        self._shell = copy.deepcopy(model, memo)

    def _low_dtype(self, device: torch.device) -> torch.dtype | None:
        """The dtype the weights' copy and the cache are kept in: autocast's for `device` where
        it is on and `cast_once` (else None: the model's own)."""
        on = self.cast_once and torch.is_autocast_enabled(device.type)
        return torch.get_autocast_dtype(device.type) if on else None

    def _low_weights(self, device: torch.device) -> dict[str, Tensor] | None:
        """The matrix products' weights in the autocast dtype where autocast is on for `device`
        (else None: the model's own), made again when any of them changed since (an in-place
        update moves a tensor's version counter; a replaced tensor has another address)."""
        dtype = self._low_dtype(device)
        if dtype is None:
            return None
        linear = {
            f"{name}.weight" if name else "weight": m.weight
            for name, m in self.policy.model.named_modules()
            if isinstance(m, torch.nn.Linear) and m.weight.dtype == torch.float32
        }
        # the version too: a sharded model's gathered tensors are refilled in place by the
        # gather, which need not move their version counters or their addresses
        made = (dtype, self._version, *((w._version, w.data_ptr()) for w in linear.values()))
        if made != self._low_made:
            self._low = {name: w.detach().to(dtype) for name, w in linear.items()}
            self._low_made = made
        return self._low

    def _weights(self, device: torch.device) -> dict[str, Tensor] | None:
        """What the forward takes in place of the model's own tensors (`_forward`): the
        low-precision weights (`_low_weights`); unhooked, every tensor of the (gathered) model
        under each of its names, the low-precision ones in place of theirs."""
        low = self._low_weights(device)
        if self._shell is None:
            return low
        model = self.policy.model
        return {
            **dict(model.named_parameters(remove_duplicate=False)),
            **dict(model.named_buffers(remove_duplicate=False)),
            **(low or {}),
        }

    def _forward(self, low: dict[str, Tensor] | None, **kwargs: Any) -> Any:
        """The model's forward, with the low-precision weights in place of theirs where given
        (tied weights stay apart: an embedding tied to the output layer keeps its float32 rows,
        as under autocast); unhooked, the shell's, with every tensor given."""
        if self._shell is not None:
            assert low is not None
            return torch.func.functional_call(
                self._shell, low, args=(), kwargs=kwargs, tie_weights=False, strict=False
            )
        if low is None:
            return self.policy.model(**kwargs)
        return torch.func.functional_call(
            self.policy.model, low, args=(), kwargs=kwargs, tie_weights=False, strict=False
        )

    def _decode_step(
        self,
        tok: Tensor,
        attn: Tensor,
        pos: Tensor,
        noise: Tensor,
        done: Tensor,
        low: dict[str, Tensor] | None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """One token for every row: tok [R] at positions pos [R, 1] under mask attn [R, W]."""
        out = self._forward(
            low,
            input_ids=tok.unsqueeze(-1),
            attention_mask=attn,
            position_ids=pos,
            use_cache=True,
            **{self._key: self._cache},
        )
        logits = capped(out.logits[:, -1], self.policy.softcap)
        return next_token(
            logits, noise, self.temperature, self.top_k, done, self.policy.eos_ids, self.policy.pad_id
        )

    def _fit(self, rows: int, width: int, device: torch.device) -> None:
        """A cache for at least `rows` x `width`, kept in the autocast dtype where autocast is on
        for `device` (a bigger cache than the last, or another dtype, is a recompile)."""
        store = self._low_dtype(device)
        if self._cache is None or rows > self._rows or width > self._width or store != self._store:
            self._rows, self._width = max(rows, self._rows), max(width, self._width)
            self._cache, self._store = _static_cache(self.policy, self._width, store), store
        elif self._cache.is_initialized:
            self._cache.reset()

    @torch.no_grad()
    def __call__(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        max_new_tokens: int,
        temperature: float,
        top_k: int,
        generator: Noise | None = None,
    ) -> Completions:
        greedy = top_k == 1
        if not greedy and (float(temperature), int(top_k)) != (self.temperature, self.top_k):
            raise ValueError(
                f"this decoder samples at temperature {self.temperature}, top_k {self.top_k} "
                f"(asked {temperature}, {top_k})"
            )
        batch, width = prompt_ids.shape
        device = prompt_ids.device
        self._fit(batch, max(width, self.max_prompt) + max_new_tokens, device)
        rows, pad = self._rows, self.policy.pad_id
        if batch < rows:  # an evaluation's last chunk: copies of its first row, cut after
            fill = rows - batch
            prompt_ids = torch.cat([prompt_ids, prompt_ids[:1].expand(fill, -1)])
            prompt_mask = torch.cat([prompt_mask, prompt_mask[:1].expand(fill, -1)])
        prompt_mask = prompt_mask.long()
        attn = torch.ones((rows, self._width), dtype=torch.long, device=device)
        attn[:, :width] = prompt_mask
        pos = positions(prompt_mask)
        low = self._weights(device)
        out = self._forward(
            low,
            input_ids=prompt_ids,
            attention_mask=attn,
            position_ids=pos,
            use_cache=True,
            logits_to_keep=1,
            **{self._key: self._cache},
        )
        logits = capped(out.logits[:, -1], self.policy.softcap)
        vocab = logits.shape[-1]
        tokens = torch.full((rows, max_new_tokens), pad, dtype=torch.long, device=device)
        mask = torch.zeros((rows, max_new_tokens), dtype=torch.float32, device=device)
        logps = torch.zeros((rows, max_new_tokens), dtype=torch.float32, device=device)
        # A step's outputs are copied into these before the next step and nothing else of them is
        # kept: under CUDA graphs (inductor's cudagraph trees) each call may reuse the memory of
        # the last call's outputs, and reading one after the next call raises.
        tok_in = torch.empty(rows, dtype=torch.long, device=device)
        done_in = torch.zeros(rows, dtype=torch.bool, device=device)
        last = pos[:, -1:]
        noise = sampling_noise(generator, (rows, vocab), device, greedy)
        tok, logp, live, done = next_token(
            logits, noise, self.temperature, self.top_k, done_in, self.policy.eos_ids, pad
        )
        for t in range(max_new_tokens):
            tokens[:, t], mask[:, t], logps[:, t] = tok, live, logp
            tok_in.copy_(tok)
            done_in.copy_(done)
            if t == max_new_tokens - 1 or bool(done_in[:batch].all()):
                break
            last = last + 1
            noise = sampling_noise(generator, (rows, vocab), device, greedy)
            tok, logp, live, done = self._step(tok_in, attn, last, noise, done_in, low)
        self._count_warm()
        return Completions(tokens[:batch], mask[:batch], logps[:batch], done_in[:batch])

    def _count(self) -> None:
        self.compiles += 1

    def _count_warm(self) -> None:
        if self.warm_compiles is None:
            self.warm_compiles = self.compiles
        elif self.compiles > self.warm_compiles and not self._warned:
            self._warned = True
            print(
                f"relay generation: the compiled decoding step recompiled ({self.compiles} graphs, "
                f"{self.warm_compiles} after warm-up)",
                file=sys.stderr,
                flush=True,
            )
