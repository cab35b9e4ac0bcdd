"""The decoders of a language policy as a registry (`policy/decoders`): `generation.backend`
names one (relay: eager, or static with generation.compile), the learner and the generator
actors build theirs with the one chooser, an unknown name is one line, and a new decoder is one
entry and one registry line (here a monkeypatched line) that the learner then samples through."""

from __future__ import annotations

import numpy as np
import pytest

from relay_rl.contracts.config import RelayConfig
from relay_rl.policy.decoders import DECODERS, DecoderEntry, decoder_name, eager
from relay_rl.policy.decoders.eager import EagerDecoder
from relay_rl.policy.lm_decoding import StaticDecoder
from relay_rl.services.cli import main
from tests.lm_helpers import tiny_model_folder, write_jsonl


def _cfg(generation: dict, **learner) -> RelayConfig:
    return RelayConfig.model_validate(
        {
            "model": {"kind": "causal_lm", "path": "m"},
            "prompts": {"train": "p.jsonl", "rewards": ["regex:7"], "batch_size": 2, "max_prompt_tokens": 8},
            "generation": {"max_new_tokens": 4, **generation},
            "learner": {"group_size": 2, "device": "cpu", "compile_backend": "aot_eager", **learner},
        }
    )


def test_the_chooser_maps_every_way_of_naming_a_decoder():
    assert list(DECODERS) == ["eager", "static", "vllm"]
    assert decoder_name(_cfg({})) == "eager"
    assert decoder_name(_cfg({"compile": True})) == "static"  # configs written before the registry
    assert decoder_name(_cfg({"backend": "vllm"})) == "vllm"
    assert decoder_name(_cfg({"backend": "static"})) == "static"
    assert DECODERS["vllm"].placements == ("learner",)


@pytest.fixture
def folder(tmp_path, monkeypatch):
    tiny_model_folder(tmp_path / "m")
    write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"{i}+{i}="} for i in range(6)])
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_learner_and_a_generator_build_the_named_decoder(folder):
    from relay_rl.learner.lm.learner import LanguageLearner
    from relay_rl.policy.weight_wires import wire_weights
    from relay_rl.rollout_workers.lm.generator import Generator

    assert isinstance(LanguageLearner(_cfg({})).decoder, EagerDecoder)
    assert isinstance(LanguageLearner(_cfg({"backend": "static"})).decoder, StaticDecoder)
    cfg = _cfg({"placement": "workers", "backend": "static"}).model_dump(mode="json")
    cfg["rollout"] = {"num_workers": 1}
    gen = Generator(cfg, 0)
    gen.set_weights(1, [(1, wire_weights(gen.policy.state_dict()))])
    out = gen.generate(1, np.tile(np.arange(3, 7), (2, 1)), np.ones((2, 4), dtype=np.int64))
    assert isinstance(gen.decode, StaticDecoder) and out["tokens"].shape == (2, 4)


def test_an_unknown_decoder_is_one_line_and_exit_2(folder, capsys):
    (folder / "run.yaml").write_text(
        "model: {kind: causal_lm, path: m}\nprompts: {train: p.jsonl, rewards: ['regex:7']}\n"
        "generation: {backend: sglang}\n"
    )
    assert main(["validate", "run.yaml"]) == 2
    err = capsys.readouterr().err.strip()
    assert "generation.backend='sglang' is not a decoder: choose relay, eager, static, vllm" in err
    assert len(err.splitlines()) == 1


def test_a_new_decoder_is_one_entry_and_one_line(folder, monkeypatch):
    """A decoder of this test: the eager loop, counting its calls (what an SGLang entry would
    replace with its engine): registered with one line, named by generation.backend, sampled
    through by the learner, its counts on the update's line."""
    from relay_rl.learner.lm.learner import LanguageLearner

    class Counting(EagerDecoder):
        calls = 0

        def __call__(self, *args, **kwargs):
            Counting.calls += 1
            return super().__call__(*args, **kwargs)

        def counts(self):
            return {"compiles": Counting.calls}  # a key the catalog has: the decoder's figure

    monkeypatch.setitem(DECODERS, "counting", DecoderEntry(lambda setup: Counting(setup.policy)))
    learner = LanguageLearner(_cfg({"backend": "counting"}))
    learner.generate_round()
    line = learner.train([1.0, 0.0, 0.0, 1.0])
    assert Counting.calls == 1 and line["compiles"] == 1
    assert eager.ENTRY.problem(_cfg({})) is None
