"""Reward models as rewards (`prompts.rewards: ["model:<folder>"]`): a sequence classifier scores
completions from their text with its own tokenizer, checked as data before anything runs.

The reward models are tiny random-init `LlamaForSequenceClassification` folders written here (no
weights can be downloaded), one with a tokenizer whose ids differ from the policy's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from relay_rl.contracts.pairs import BUCKET
from relay_rl.rollout_workers.lm.reward_models import RewardModel
from relay_rl.rollout_workers.lm.rewards import resolve_reward
from relay_rl.services.cli import main
from tests.lm_helpers import CHARS, sevens_run, tiny_config


def reward_model_folder(folder: Path, reversed_vocab: bool = False, labels: int = 1) -> Path:
    """A tiny sequence classifier with the tiny tokenizer (or one whose character ids run the
    other way: the same text, other ids than the policy's)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaForSequenceClassification, PreTrainedTokenizerFast

    torch.manual_seed(7)
    config = tiny_config("llama")
    config.num_labels = labels
    LlamaForSequenceClassification(config).save_pretrained(str(folder))
    chars = list(CHARS)[::-1] if reversed_vocab else list(CHARS)
    vocab = {tok: i for i, tok in enumerate(["<pad>", "<eos>", "<bos>", *chars])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>"
    )
    fast.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    fast.save_pretrained(str(folder))
    return folder


def _alone(folder: Path, text: str) -> float:
    """The classifier's score of one text, unpadded, straight from transformers."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    ids = AutoTokenizer.from_pretrained(str(folder))(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        return float(model(**ids).logits[0, 0])


def test_a_reward_model_scores_each_completion_as_it_scores_it_alone(tmp_path):
    """Batched and padded to the bucket, each row's score is its score alone; texts are re-read by
    the reward model's own tokenizer, so one whose ids differ from the policy's scores the same
    text the same way; chat prompts go through its chat template."""
    rm = reward_model_folder(tmp_path / "rm", reversed_vocab=True)
    fn = resolve_reward(f"model:{rm}")
    assert isinstance(fn, RewardModel) and fn.__name__ == f"model:{rm}"
    prompts = ["1+2=", "33+44=", "7*7=" * 20]  # the last runs past one bucket
    completions = ["3", "77 is it", "49"]
    got = fn(prompts=prompts, completions=completions)
    want = [_alone(rm, p + c) for p, c in zip(prompts, completions, strict=True)]
    assert got == pytest.approx(want, abs=1e-5)
    assert len(set(got)) == 3  # not one constant
    assert len(fn._tokenizer("7*7=" * 20 + "49")["input_ids"]) > BUCKET
    # the policy's tokenizer would give other ids for the same text: the score is of the text
    from relay_rl.policy.causal_lm import load_tokenizer
    from tests.lm_helpers import tiny_model_folder

    policy_tok = load_tokenizer(tiny_model_folder(tmp_path / "policy"))
    assert policy_tok("1+2=3")["input_ids"] != fn._tokenizer("1+2=3")["input_ids"]
    chat = fn(
        prompts=[[{"role": "user", "content": "1+2="}]], completions=[[{"role": "assistant", "content": "3"}]]
    )
    assert chat == pytest.approx([_alone(rm, "user: 1+2=\nassistant: 3\n")], abs=1e-5)


def test_reward_model_folders_are_data_and_refused_in_one_line(tmp_path, monkeypatch, capsys):
    """Remote code, a causal LM where a classifier belongs, several labels, no folder: `relay
    validate` says why in one line, exit 2, and nothing is loaded."""
    monkeypatch.chdir(sevens_run(tmp_path))
    remote = reward_model_folder(tmp_path / "remote")
    config = json.loads((remote / "config.json").read_text())
    (remote / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModel": "m.M"}}))
    labels = reward_model_folder(tmp_path / "labels", labels=3)
    capsys.readouterr()  # what writing the folders printed
    for folder, why in [
        (remote, "asks for remote code"),
        (tmp_path / "model", "the weights lack score.weight"),  # the policy: a causal LM
        (labels, "a reward model scores with one label"),
        (tmp_path / "nowhere", "not a folder"),
    ]:
        code = main(["validate", "run.yaml", "--set", f"prompts.rewards=['model:{folder}']"])
        err = capsys.readouterr().err
        assert code == 2 and why in err and len(err.strip().splitlines()) == 1, err


def test_a_run_trains_against_a_reward_model_mixed_with_a_function(tmp_path, monkeypatch):
    """A local language run whose reward is a reward model's score plus a regex reward: every
    completion is scored (no faults), and both parts are reported."""
    monkeypatch.chdir(sevens_run(tmp_path))
    reward_model_folder(tmp_path / "rm")
    args = [
        "train",
        "run.yaml",
        "--run-dir",
        "runs/rm",
        "--set",
        "stop.iterations=3",
        "--set",
        "stop.env_steps=null",
    ]
    args += ["--set", "prompts.rewards=['model:rm', 'regex:7']", "--set", "prompts.reward_weights=[1.0, 0.5]"]
    assert main(args) == 0
    lines = [json.loads(x) for x in (tmp_path / "runs" / "rm" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 3 and all(x["reward_faults"] == 0 for x in lines)
    # each part's mean: the model's score and the regex's, and their weighted sum the reward
    for x in lines:
        assert x["reward_mean"] == pytest.approx(x["reward_0_mean"] + 0.5 * x["reward_1_mean"], abs=1e-6)
    assert len({x["reward_0_mean"] for x in lines}) == 3  # a model's scores, not a constant
