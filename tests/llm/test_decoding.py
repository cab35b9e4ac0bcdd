"""`generation.compile`: the compiled static-cache decoder tied to the eager KV-cache loop it
replaces (same draws, same tokens), compiled once whatever the prompts' widths, and the sampling
step it shares with that loop drawing tokens by their probabilities."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from relay_rl.contracts.config import RelayConfig
from relay_rl.contracts.prompts import pad_left
from relay_rl.policy.causal_lm import (
    CausalLMPolicy,
    eos_ids,
    load_causal_lm,
    load_tokenizer,
    next_token,
    sampling_noise,
    with_lora,
)
from relay_rl.policy.lm_decoding import StaticDecoder
from tests.lm_helpers import tiny_model_folder, write_jsonl

NEW = 10


def _policy(folder: Path, lora: bool = False) -> CausalLMPolicy:
    tok = load_tokenizer(folder)
    model = load_causal_lm(folder)
    if lora:
        from relay_rl.contracts.config import LoraConfig

        model = with_lora(model, LoraConfig(r=4, alpha=8))
        with torch.no_grad():  # adapters start as a no-op (B = 0): make them matter
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.5)
    return CausalLMPolicy(model, tok.pad_token_id, eos_ids(tok, model)).eval()


def _prompts(folder: Path, texts: list[str], buckets: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    tok = load_tokenizer(folder)
    ids, mask = pad_left([tok(t)["input_ids"] for t in texts], buckets, tok.pad_token_id)
    return torch.from_numpy(ids), torch.from_numpy(mask)


def _same(a, b) -> None:
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.mask, b.mask)
    assert torch.equal(a.ended, b.ended)
    assert torch.allclose(a.logp, b.logp, atol=1e-5)


@pytest.mark.parametrize(
    ("arch", "lora"), [("llama", False), ("qwen2", False), ("gpt2", False), ("llama", True)]
)
def test_the_compiled_decoder_samples_the_eager_loops_tokens_and_compiles_once(arch, lora, tmp_path):
    """Through dynamo's aot_eager backend (traced as one graph, guarded and counted, no code
    generated: the recompile check in seconds); every prompt width of every bucket, sampled and
    greedy, and a smaller batch than the first, through the one graph of the first call."""
    folder = tiny_model_folder(tmp_path / "m", arch)
    policy = _policy(folder, lora)
    decoder = StaticDecoder(policy, "aot_eager", max_prompt=16, temperature=0.8, top_k=0)
    texts = ["1+2=", "9", "12+34=", "what is 5*6? ", "7-3=", "a", "1+1+1+1=", "zz"]
    for i, buckets in enumerate(([8, 16], [16], [4, 8, 16])):
        ids, mask = _prompts(folder, texts, buckets)
        ours = decoder(ids, mask, NEW, 0.8, 0, torch.Generator().manual_seed(i))
        plain = policy.generate(ids, mask, NEW, 0.8, 0, torch.Generator().manual_seed(i))
        _same(ours, plain)
        assert bool(ours.mask.sum(-1).gt(1).any()), "completions longer than one token were compared"
    ids, mask = _prompts(folder, texts[:3], [8])
    _same(decoder(ids, mask, NEW, 0.8, 1), policy.generate(ids, mask, NEW, 0.8, 1))
    assert decoder.compiles == 1 and decoder.warm_compiles == 1


def test_the_inductor_decoder_is_the_eager_loop(tmp_path):
    """The code the run executes on a CPU host (inductor's generated C++), tied the same way."""
    folder = tiny_model_folder(tmp_path / "m")
    policy = _policy(folder)
    decoder = StaticDecoder(policy, "inductor", max_prompt=8, temperature=1.0, top_k=5)
    for seed, texts in enumerate((["1+2=", "34+5=", "6"] * 2, ["7+7=", "1"] * 3)):
        ids, mask = _prompts(folder, texts, [4, 8])
        got = decoder(ids, mask, NEW, 1.0, 5, torch.Generator().manual_seed(seed))
        _same(got, policy.generate(ids, mask, NEW, 1.0, 5, torch.Generator().manual_seed(seed)))
    assert decoder.compiles == 1


def test_under_autocast_the_decoder_casts_its_weights_once_per_version(tmp_path):
    """bf16 autocast: the compiled step takes its matrix products' weights from a bf16 copy (a
    graph would cast every float32 weight again on every call) and keeps its KV cache in bf16
    (attention would cast the whole float32 cache every step), and samples, bit for bit, what the
    same graph samples casting both itself (the reference: `cast_once=False`);
    after an optimizer step changes the weights in place the copy is made again and the two still
    agree, through the one graph. Both sample the eager loop's tokens under the same autocast
    (log-probs within bf16's rounding: the eager loop's ops run in another order)."""
    folder = tiny_model_folder(tmp_path / "m")
    policy = _policy(folder)
    decoder = StaticDecoder(policy, "aot_eager", max_prompt=8, temperature=1.0, top_k=0)
    reference = StaticDecoder(policy, "aot_eager", max_prompt=8, temperature=1.0, top_k=0, cast_once=False)
    ids, mask = _prompts(folder, ["1+2=", "34+5=", "6", "7+7="] * 2, [4, 8])

    def sample(seed: int):
        with torch.autocast("cpu", torch.bfloat16):
            ours, ref, plain = (
                d(ids, mask, NEW, 1.0, 0, torch.Generator().manual_seed(seed))
                for d in (decoder, reference, policy.generate)
            )
        assert torch.equal(ours.tokens, ref.tokens) and torch.equal(ours.logp, ref.logp)
        assert torch.equal(ours.tokens, plain.tokens) and torch.allclose(ours.logp, plain.logp, atol=5e-3)
        return ours

    before = sample(0)
    assert decoder._low and all(w.dtype == torch.bfloat16 for w in decoder._low.values())
    assert {layer.keys.dtype for layer in decoder._cache.layers} == {torch.bfloat16}
    assert {layer.keys.dtype for layer in reference._cache.layers} == {torch.float32}
    opt = torch.optim.SGD(policy.parameters(), lr=5.0)
    for p in policy.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    after = sample(0)
    assert not torch.equal(before.logp, after.logp), "the new weights were sampled with"
    assert decoder.compiles == 1


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_one_decoder_decodes_with_and_without_autocast(arch, tmp_path):
    """The cache's dtype follows the call: a bf16 cache under autocast, a float32 one after it
    (a cache of the first call's dtype failed the second); each samples the eager loop's tokens.
    The second precision is a second graph, as any change of dtype is. (gpt2's keys come out of
    autocast in bf16, Llama's and Qwen2's in float32 from the rotary embedding.)"""
    folder = tiny_model_folder(tmp_path / "m", arch)
    policy = _policy(folder)
    decoder = StaticDecoder(policy, "aot_eager", max_prompt=8, temperature=1.0, top_k=0)
    ids, mask = _prompts(folder, ["1+2=", "34+5=", "6", "7+7="], [4, 8])
    for amp, dtype in ((True, torch.bfloat16), (False, torch.float32), (True, torch.bfloat16)):
        with torch.autocast("cpu", torch.bfloat16, enabled=amp):
            got = decoder(ids, mask, NEW, 1.0, 0, torch.Generator().manual_seed(1))
            plain = policy.generate(ids, mask, NEW, 1.0, 0, torch.Generator().manual_seed(1))
        assert {layer.keys.dtype for layer in decoder._cache.layers} == {dtype}
        assert torch.equal(got.tokens, plain.tokens)
        assert torch.allclose(got.logp, plain.logp, atol=5e-3 if amp else 1e-5)
    assert decoder.compiles == 2


def test_a_decoder_refuses_another_temperature(tmp_path):
    folder = tiny_model_folder(tmp_path / "m")
    decoder = StaticDecoder(_policy(folder), "eager", max_prompt=8, temperature=1.0, top_k=0)
    ids, mask = _prompts(folder, ["1+2="], [8])
    with pytest.raises(ValueError, match=r"temperature 1\.0"):
        decoder(ids, mask, NEW, 0.5, 0)


def test_the_exponential_race_draws_tokens_by_their_probabilities():
    """next_token's sampling (argmax of p / E, E ~ Exp(1)) against the tempered softmax, and
    top_k racing only the k likeliest: frequencies over 40k draws within 4 standard errors."""
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    draws = 40_000
    g = torch.Generator().manual_seed(0)
    for temperature, top_k in ((1.0, 0), (0.5, 0), (1.0, 3)):
        rows = logits.expand(draws, -1)
        noise = sampling_noise(g, (draws, 5), torch.device("cpu"))
        done = torch.zeros(draws, dtype=torch.bool)
        tok, logp, live, _ = next_token(rows, noise, temperature, top_k, done, torch.tensor([4]), 0)
        p = torch.softmax(logits[0] / temperature, -1)
        assert torch.allclose(logp, p.log()[tok])  # the log-prob under the full tempered softmax
        if top_k:
            p = torch.where(p >= p.topk(top_k).values[-1], p, torch.zeros_like(p))
            p = p / p.sum()
        freq = np.bincount(tok.numpy(), minlength=5) / draws
        se = np.sqrt(p.numpy() * (1 - p.numpy()) / draws)
        assert np.all(np.abs(freq - p.numpy()) <= 4 * se + 1e-9), (temperature, top_k, freq, p)
        assert bool((live == 1).all())


def test_noise_drawn_on_the_cpu_is_the_same_draws_for_any_device():
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    a = sampling_noise(g1, (3, 7), torch.device("cpu"))
    b = sampling_noise(g2, (3, 7), torch.device("meta"))  # moved to the device after the draw
    assert b.device.type == "meta" and bool((a > 0).all())
    assert torch.equal(sampling_noise(None, (2, 3), torch.device("cpu"), greedy=True), torch.ones(2, 3))


def test_the_noise_is_exponential():
    """Exp(1) draws (drawn as -log U): all finite and above 0 (the race divides by them), and
    P(E > x) = exp(-x) within 4 standard errors over 2M draws, tail included."""
    e = sampling_noise(torch.Generator().manual_seed(0), (2_000, 1_000), torch.device("cpu")).double()
    assert bool(torch.isfinite(e).all()) and bool((e > 0).all())
    for x in (0.01, 0.1, 0.5, 1.0, 2.0, 4.0, 8.0):
        p, n = float(np.exp(-x)), e.numel()
        assert abs(float((e > x).double().mean()) - p) <= 4 * np.sqrt(p * (1 - p) / n), x
    assert abs(float(e.mean()) - 1.0) < 4 / np.sqrt(e.numel())


def test_a_compiled_language_learner_never_recompiles_over_prompts_of_many_lengths(tmp_path, monkeypatch):
    """The learner with generation.compile: rounds of prompts 1 to 15 tokens long (three buckets),
    an evaluation of fewer rows than a round, `compiles` flat at the first round's count."""
    from relay_rl.learner.lm.learner import LanguageLearner

    tiny_model_folder(tmp_path / "m")
    rows = [{"prompt": "1+" * (n // 2) + "1" * (n % 2 or 1)} for n in range(1, 16)]
    write_jsonl(tmp_path / "p.jsonl", rows)
    write_jsonl(tmp_path / "e.jsonl", rows[:3])
    monkeypatch.chdir(tmp_path)
    cfg = RelayConfig.model_validate(
        {
            "model": {"kind": "causal_lm", "path": "m"},
            "prompts": {
                "train": "p.jsonl",
                "eval": "e.jsonl",
                "rewards": ["regex:7"],
                "batch_size": 3,
                "max_prompt_tokens": 16,
                "shuffle": False,
            },
            "generation": {"max_new_tokens": 6, "compile": True, "prompt_buckets": [4, 8, 16]},
            "learner": {"group_size": 2, "device": "cpu", "compile_backend": "aot_eager"},
        }
    )
    learner = LanguageLearner(cfg)
    widths, counts = set(), []
    for _ in range(5):
        widths.add(learner.generate_round()["prompt_width"])
        counts.append(learner.train([1.0, 0.0] * 3)["compiles"])
        learner.evaluate(limit=3, greedy=True)
    assert widths == {4, 8, 16}
    assert counts == [1] * 5


def test_a_generator_actor_decodes_compiled_what_it_decodes_eagerly(tmp_path):
    """generation.placement=workers with generation.compile: the generator (constructed here, out
    of Ray) samples the same completions as an eager one of the same seed, one compile in all."""
    from relay_rl.policy.weight_wires import wire_weights
    from relay_rl.rollout_workers.lm.generator import Generator

    tiny_model_folder(tmp_path / "model")
    base = {
        "model": {"kind": "causal_lm", "path": str(tmp_path / "model")},
        "prompts": {"train": "x", "rewards": ["exact_match"], "max_prompt_tokens": 8},
        "learner": {"compile_backend": "aot_eager"},
    }
    gens = []
    for compiled in (False, True):
        data = {**base, "generation": {"max_new_tokens": 6, "placement": "workers", "compile": compiled}}
        gen = Generator(RelayConfig.model_validate(data).model_dump(mode="json"), 0)
        gen.set_weights(1, [(1, wire_weights(gen.policy.state_dict()))])
        gens.append(gen)
    for width in (3, 8, 5):
        ids = np.tile(np.arange(3, 3 + width), (4, 1))
        mask = np.ones_like(ids)
        eager, compiled = (g.generate(1, ids, mask) for g in gens)
        for key in ("tokens", "mask", "ended"):
            assert np.array_equal(eager[key], compiled[key]), key
    assert isinstance(gens[1].decode, StaticDecoder) and gens[1].decode.compiles == 1


def test_a_compiled_update_trains_the_eager_updates_weights(tmp_path, monkeypatch):
    """learner.compile on a language run: the update's log-probs compiled (aot_eager: dynamo's
    graph, the same kernels) move every weight as the eager update does, with gradient
    checkpointing and a KL term on; graphs compiled for each prompt bucket met, none again for a
    bucket seen before."""
    from relay_rl.learner.lm.learner import LanguageLearner

    tiny_model_folder(tmp_path / "m")
    write_jsonl(tmp_path / "p.jsonl", [{"prompt": p} for p in ("1+2=", "12+34+5=", "3=", "45+6=")])
    monkeypatch.chdir(tmp_path)
    learners = []
    for compiled in (False, True):
        cfg = RelayConfig.model_validate(
            {
                "model": {"kind": "causal_lm", "path": "m"},
                "prompts": {
                    "train": "p.jsonl",
                    "rewards": ["regex:7"],
                    "batch_size": 1,
                    "max_prompt_tokens": 16,
                    "shuffle": False,
                },
                "generation": {"max_new_tokens": 5, "prompt_buckets": [4, 8, 16]},
                "learner": {
                    "group_size": 4,
                    "device": "cpu",
                    "use_amp": False,
                    "lr": 0.01,
                    "kl_coef": 0.1,
                    "grad_checkpointing": True,
                    "compile": compiled,
                    "compile_backend": "aot_eager",
                },
            }
        )
        learners.append(LanguageLearner(cfg))
    counts, seen = [], []
    for _ in range(4):
        for learner in learners:
            width = learner.generate_round()["prompt_width"]
            metrics = learner.train([1.0, 0.0, 0.5, 0.25])
        seen.append(width)
        counts.append(metrics["update_compiles"])
        eager, compiled = (dict(x.policy.named_parameters()) for x in learners)
        for name, p in eager.items():
            assert torch.allclose(p, compiled[name], atol=1e-5), name
    assert len(set(seen)) == 2  # the prompts span two buckets
    # Graphs come with a bucket not met before, never for one met before (transformers'
    # checkpointed blocks break the graph, so a bucket brings several).
    for i in range(1, 4):
        assert (counts[i] > counts[i - 1]) == (seen[i] not in seen[:i]), (seen, counts)
