"""`generation.backend: vllm` (policy/vllm_decoding.py): completions sampled by a colocated vLLM
engine come back as relay's `Completions`, and the learner's weights reach the engine once per
version.

vLLM itself cannot exist on these hosts: its wheels need a CUDA GPU (vllm-ascend an NPU), and
`vllm_problem` refuses the backend here (tests/llm/test_language_training.py checks that line).
So the adapter runs against a stand-in `vllm` package written by this test: the calls the adapter
makes (`LLM(...)`, `SamplingParams(...)`, `LLM.generate`, the engine's model `load_weights`,
`reset_prefix_cache`), each doing what vLLM's does (a real transformers model from the same
folder samples, records the sampled token's log-prob, stops on `stop_token_ids`, and loads
weights by checkpoint name)."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from relay_rl.contracts.config import RelayConfig
from relay_rl.policy.causal_lm import CausalLMPolicy, eos_ids, load_causal_lm, load_tokenizer
from relay_rl.policy.vllm_decoding import VllmDecoder, completions_of, device_problem, vllm_problem
from tests.lm_helpers import tiny_model_folder, write_jsonl

STANDIN = '''
"""A stand-in for vLLM's offline API, as relay's adapter calls it (vLLM needs a GPU or an NPU)."""
import dataclasses
from types import SimpleNamespace

import torch
from transformers import AutoModelForCausalLM

CALLS = {"llm": [], "params": [], "prompts": [], "resets": 0}


@dataclasses.dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    logprobs: int | None = None
    stop_token_ids: list | None = None


@dataclasses.dataclass
class Logprob:
    logprob: float
    rank: int | None = None


@dataclasses.dataclass
class CompletionOutput:
    index: int
    token_ids: list
    logprobs: list | None
    finish_reason: str


@dataclasses.dataclass
class RequestOutput:
    prompt_token_ids: list
    outputs: list


class _EngineModel:
    """vLLM's model class: load_weights takes (checkpoint name, tensor) pairs."""

    def __init__(self, hf):
        self.hf = hf

    def load_weights(self, weights):
        params = dict(self.hf.named_parameters())
        loaded = set()
        for name, tensor in weights:
            if name in params:
                params[name].data.copy_(tensor)
                loaded.add(name)
        return loaded


class LLM:
    def __init__(self, model, **kwargs):
        CALLS["llm"].append(kwargs)
        self.hf = AutoModelForCausalLM.from_pretrained(model).eval()
        runner = SimpleNamespace(model=_EngineModel(self.hf))
        worker = SimpleNamespace(model_runner=runner)
        self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(driver_worker=worker))
        self.gen = torch.Generator().manual_seed(kwargs.get("seed") or 0)

    def reset_prefix_cache(self):
        CALLS["resets"] += 1

    @torch.no_grad()
    def generate(self, prompts, sampling_params, use_tqdm=True):
        CALLS["params"].append(sampling_params)
        CALLS["prompts"].append([p["prompt_token_ids"] for p in prompts])
        outputs = []
        for p in prompts:
            ids, toks, steps, reason = list(p["prompt_token_ids"]), [], [], "length"
            for _ in range(sampling_params.max_tokens):
                logits = self.hf(torch.tensor([ids + toks])).logits[0, -1].float()
                logp = torch.log_softmax(logits / sampling_params.temperature, -1)
                tok = int(torch.multinomial(logp.exp(), 1, generator=self.gen))
                toks.append(tok)
                steps.append({tok: Logprob(float(logp[tok]), 1)})
                if tok in (sampling_params.stop_token_ids or []):
                    reason = "stop"
                    break
            outputs.append(RequestOutput(ids, [CompletionOutput(0, toks, steps, reason)]))
        return outputs
'''

NEW = 6


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """The stand-in importable as `vllm`; the rendezvous variables the adapter sets are undone."""
    pkg = tmp_path / "standin" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(STANDIN))
    monkeypatch.syspath_prepend(str(tmp_path / "standin"))
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    monkeypatch.setattr(
        os, "environ", {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    )
    assert vllm_problem() is None  # found
    yield
    sys.modules.pop("vllm", None)


def _policy(folder: Path) -> CausalLMPolicy:
    tok = load_tokenizer(folder)
    model = load_causal_lm(folder)
    return CausalLMPolicy(model, tok.pad_token_id, eos_ids(tok, model)).eval()


def test_completions_come_back_as_relays_and_weights_move_once_per_version(standin, tmp_path):
    import vllm

    folder = tiny_model_folder(tmp_path / "m")
    policy = _policy(folder)
    decoder = VllmDecoder(policy, str(folder), 0.3, seed=3)
    made = vllm.CALLS["llm"][0]
    assert made["distributed_executor_backend"] == "external_launcher"  # in this process
    assert made["gpu_memory_utilization"] == 0.3 and made["logprobs_mode"] == "processed_logprobs"
    assert os.environ["RANK"] == "0" and os.environ["WORLD_SIZE"] == "1"

    # Left-padded prompts of two widths: vLLM gets each row's tokens without its padding.
    ids = torch.tensor([[0, 0, 5, 6, 7], [4, 5, 6, 7, 8], [0, 0, 0, 9, 4]])
    mask = (torch.arange(5) >= torch.tensor([[2], [0], [3]])).long()
    out = decoder(ids, mask, NEW, temperature=0.7, top_k=0)
    assert vllm.CALLS["prompts"][0] == [[5, 6, 7], [4, 5, 6, 7, 8], [9, 4]]
    params = vllm.CALLS["params"][0]
    assert (params.temperature, params.top_k, params.max_tokens, params.logprobs) == (0.7, 0, NEW, 0)
    assert params.stop_token_ids == list(policy.eos_ids)
    assert out.tokens.shape == out.mask.shape == out.logp.shape == (3, NEW)

    # Through decode of a hand-made output: the mask runs through the end token, pad after it.
    step = vllm.Logprob
    ended = vllm.CompletionOutput(0, [7, 1], [{7: step(-0.5)}, {1: step(-0.25)}], "stop")
    ran_out = vllm.CompletionOutput(
        0, [3, 4, 5], [{3: step(-1.0)}, {4: step(-2.0)}, {5: step(-3.0)}], "length"
    )
    got = completions_of([ended, ran_out], 4, pad_id=0, device=torch.device("cpu"))
    assert got.tokens.tolist() == [[7, 1, 0, 0], [3, 4, 5, 0]]
    assert got.mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 0]]
    assert got.logp.tolist() == [[-0.5, -0.25, 0, 0], [-1.0, -2.0, -3.0, 0]]
    assert got.ended.tolist() == [True, False]

    # The learner's weights, by version: loaded by name into the engine's model, once.
    engine = decoder.llm.hf
    with torch.no_grad():
        policy.lm.model.layers[0].mlp.down_proj.weight.add_(1.0)
    decoder.load(1, policy.lm.state_dict)
    decoder.load(1, policy.lm.state_dict)  # the same version again: nothing moves
    assert decoder.loads == 1 and vllm.CALLS["resets"] == 1
    theirs = dict(engine.named_parameters())
    for name, p in policy.lm.named_parameters():
        assert torch.equal(theirs[name], p), name


def test_the_language_learner_generates_through_vllm_with_its_newest_weights(standin, tmp_path, monkeypatch):
    """The learner's wiring: the engine gets version 0 before the first round and each new version
    before the next, and the round's completions are the engine's."""
    import vllm

    from relay_rl.learner.lm import learner as lm_learner
    from relay_rl.policy.decoders import vllm as vllm_entry

    tiny_model_folder(tmp_path / "m")
    write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"{i}+{i}="} for i in range(8)])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        vllm_entry, "device_problem", lambda device: None
    )  # a CPU is no GPU: see the docstring
    cfg = RelayConfig.model_validate(
        {
            "model": {"kind": "causal_lm", "path": "m"},
            "prompts": {"train": "p.jsonl", "rewards": ["regex:7"], "batch_size": 2, "max_prompt_tokens": 8},
            "generation": {"max_new_tokens": 5, "backend": "vllm"},
            "learner": {"group_size": 4, "lr": 0.01, "device": "cpu", "kl_coef": 0.0},
        }
    )
    learner = lm_learner.LanguageLearner(cfg)
    assert isinstance(learner.decoder, VllmDecoder)
    for version in range(2):
        learner.generate_round()
        assert learner.decoder.version == version
        learner.train([1.0, 0.0, 0.5, 0.0, 0.0, 1.0, 1.0, 0.25])
    learner.generate_round()
    assert learner.decoder.loads == 3 and len(vllm.CALLS["prompts"]) == 3
    theirs = dict(learner.decoder.llm.hf.named_parameters())
    for name, p in learner.policy.lm.named_parameters():
        assert torch.equal(theirs[name], p.detach()), name


def test_vllm_needs_a_gpu_or_an_npu():
    assert "GPU or an NPU" in (device_problem(torch.device("cpu")) or "")
    assert device_problem(torch.device("cuda", 0)) is None
    assert device_problem(SimpleNamespace(type="npu")) is None  # torch knows "npu" only with torch_npu
