"""Reward models trained on preference pairs (#61's first half, the learner and its inputs): the
Bradley–Terry loss tied to its plain form and a hand-computed case; pairs files read as data and
refused in one line; a tiny random-init Llama learns a programmatic preference (sorted digits
over unsorted); its Hugging Face export scores as the learner does, through transformers and
through relay's served reward model (`model:<folder>`)."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relay_rl.contracts.pairs import load_pairs
from relay_rl.contracts.prompts import PromptError
from relay_rl.learner.lm.reward_model import (
    RewardModelLearner,
    RewardModelSetup,
    bradley_terry,
    bradley_terry_plain,
)
from relay_rl.policy.causal_lm import load_tokenizer
from tests.lm_helpers import tiny_model_folder, write_jsonl


def test_bradley_terry_by_hand():
    loss, stats = bradley_terry(torch.tensor([2.0, 0.0]), torch.tensor([0.0, 0.0]))
    assert float(loss) == pytest.approx((math.log1p(math.exp(-2.0)) + math.log(2.0)) / 2)
    assert float(stats["pair_accuracy"]) == 0.5 and float(stats["reward_margin"]) == 1.0
    loss, _ = bradley_terry(torch.tensor([2.0, 0.0]), torch.tensor([0.0, 0.0]), torch.tensor([1.0, 0.0]))
    assert float(loss) == pytest.approx((math.log1p(math.exp(-1.0)) + math.log(2.0)) / 2)


scores = st.floats(min_value=-50, max_value=50, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(scores, scores, scores), min_size=1, max_size=12), st.booleans())
def test_bradley_terry_is_its_plain_form(rows, with_margin):
    c, r, m = (list(x) for x in zip(*rows, strict=True))
    margin = torch.tensor(m, dtype=torch.float64) if with_margin else None
    loss, _ = bradley_terry(
        torch.tensor(c, dtype=torch.float64), torch.tensor(r, dtype=torch.float64), margin
    )
    assert float(loss) == pytest.approx(
        bradley_terry_plain(c, r, m if with_margin else None), rel=1e-5, abs=1e-6
    )


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model_folder(tmp_path_factory.mktemp("rm") / "model")


def test_pairs_files_are_read_as_data_and_refused_in_one_line(model, tmp_path):
    tok = load_tokenizer(model)
    good = tmp_path / "good.jsonl"
    write_jsonl(
        good,
        [
            {"prompt": "1+2=", "chosen": "3", "rejected": "4", "margin": 1},
            {"chosen": "12", "rejected": "21", "margin": 0.5},
        ],
    )
    pairs = load_pairs(good, tok, 16)
    assert len(pairs) == 2 and pairs.margins == [1.0, 0.5]
    assert pairs.chosen_ids[0] == list(tok("1+2=3", add_special_tokens=False)["input_ids"])
    # a chat prompt: the conversation with its reply (text: the assistant's message), rendered
    # whole by the template, as the served reward model renders a completion
    chat = tmp_path / "chat.jsonl"
    prompt = [{"role": "user", "content": "1+2="}]
    write_jsonl(
        chat, [{"prompt": prompt, "chosen": "3", "rejected": [{"role": "assistant", "content": "4"}]}]
    )
    pairs = load_pairs(chat, tok, 64)
    for side, reply in ((pairs.chosen_ids[0], "3"), (pairs.rejected_ids[0], "4")):
        text = tok.apply_chat_template([*prompt, {"role": "assistant", "content": reply}], tokenize=False)
        assert side == list(tok(text, add_special_tokens=False)["input_ids"])
    for rows, match in [
        ([{"prompt": "1+2=", "chosen": "3"}], r"row 1 has no 'rejected' column"),
        ([{"chosen": "3", "rejected": ""}], r"row 1 has no 'rejected' column"),
        ([{"prompt": 5, "chosen": "3", "rejected": "4"}], r"row 1: 'prompt' is neither text nor chat"),
        (
            [{"chosen": "1", "rejected": "2", "margin": 1}, {"chosen": "1", "rejected": "2"}],
            r"row 2: 'margin' must be in every row",
        ),
        (
            [{"chosen": "1", "rejected": "2"}, {"chosen": "1", "rejected": "2", "margin": 1}],
            r"row 2: 'margin' must be in every row",
        ),
        ([{"chosen": "1", "rejected": "2", "margin": "big"}], r"row 1: 'margin' is not a finite number"),
        ([{"chosen": "1", "rejected": "2", "margin": True}], r"row 1: 'margin' is not a finite number"),
        (
            [{"prompt": "1+", "chosen": [{"role": "assistant", "content": "1"}], "rejected": "2"}],
            r"row 1: a text prompt with a chat 'chosen'",
        ),
        ([{"chosen": "1" * 17, "rejected": "2"}], r"row 1: 'chosen' is 17 tokens, over the 16"),
        ([], r"no rows"),
    ]:
        bad = tmp_path / "bad.jsonl"
        write_jsonl(bad, rows)
        with pytest.raises(PromptError, match=match) as err:
            load_pairs(bad, tok, 16)
        assert "\n" not in str(err.value)
    (tmp_path / "pairs.csv").write_text("chosen,rejected\n1,2\n")
    with pytest.raises(PromptError, match=r"not a \.jsonl or \.parquet file"):
        load_pairs(tmp_path / "pairs.csv", tok, 16)


def _sorted_pairs(n: int, seed: int) -> list[dict]:
    """Pairs of the same four digits: sorted (chosen) and shuffled out of order (rejected)."""
    rng = random.Random(seed)
    rows = []
    while len(rows) < n:
        digits = [rng.choice("0123456789") for _ in range(4)]
        up, mixed = "".join(sorted(digits)), digits[:]
        rng.shuffle(mixed)
        if "".join(mixed) != up:
            rows.append({"prompt": "sort ", "chosen": up, "rejected": "".join(mixed)})
    return rows


def test_a_reward_model_learns_a_preference_and_its_export_scores_as_it_does(model, tmp_path):
    write_jsonl(tmp_path / "train.jsonl", _sorted_pairs(256, 0))
    write_jsonl(tmp_path / "held.jsonl", _sorted_pairs(64, 1))
    setup = RewardModelSetup(
        str(model), str(tmp_path / "train.jsonl"), batch_size=16, max_tokens=16, lr=3e-3, seed=0
    )
    learner = RewardModelLearner(setup)
    held = load_pairs(tmp_path / "held.jsonl", learner.tokenizer, 16)
    before = learner.evaluate(held)
    lines = [learner.train() for _ in range(60)]
    after = learner.evaluate(held)
    assert set(lines[-1]) >= {
        "loss",
        "pair_accuracy",
        "reward_margin",
        "score_mean",
        "score_std",
        "grad_norm",
    }
    assert after["pair_accuracy"] >= 0.9 > before["pair_accuracy"] + 0.2, (before, after)
    assert after["loss"] < before["loss"]

    # a checkpoint's state is tensors and numbers, and a fresh learner takes up where it was
    state = learner.state_dict()
    again = RewardModelLearner(setup)
    again.load_state_dict(state)
    assert again.train()["loss"] == pytest.approx(learner.train()["loss"], rel=1e-5)

    out = tmp_path / "rm"
    learner.export_hf(out)
    with pytest.raises(FileExistsError):
        learner.export_hf(out)  # never replaced
    from transformers import AutoModelForSequenceClassification

    from relay_rl.rollout_workers.lm.reward_models import RewardModel

    back = AutoModelForSequenceClassification.from_pretrained(str(out)).eval()
    rows = held.chosen_ids[:4] + held.rejected_ids[:4]
    ours = learner.scores(rows)
    served = RewardModel(str(out))  # relay's own `model:<folder>` reward reads it as data
    texts = [learner.tokenizer.decode(r) for r in rows]
    got = served(["" for _ in texts], texts)
    assert got == pytest.approx(ours.tolist(), abs=1e-4)
    from relay_rl.learner.lm.reward_model import padded

    ids, mask = padded(rows, int(learner.tokenizer.pad_token_id), torch.device("cpu"))
    with torch.no_grad():
        assert torch.allclose(back(input_ids=ids, attention_mask=mask).logits[:, 0], ours, atol=1e-4)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(1, 50), min_size=1, max_size=300), min_size=1, max_size=6))
def test_rows_are_padded_on_the_right_to_few_buckets(rows):
    """Short rows take a power of two from 8 to 64, long ones a multiple of 64: the served and the
    trained reward model pad alike (`contracts/pairs.py`), each row's tokens first."""
    from relay_rl.contracts.pairs import bucket_width, pad_right

    width, longest = bucket_width(rows), max(len(r) for r in rows)
    assert width >= longest and (width in (8, 16, 32, 64) or (width % 64 == 0 and width - longest < 64))
    assert width < 2 * max(longest, 4) or width == 8
    ids, mask = pad_right(rows, 0)
    assert ids.shape == mask.shape == (len(rows), width)
    for k, r in enumerate(rows):
        assert ids[k, : len(r)].tolist() == r and mask[k].sum() == len(r) and not ids[k, len(r) :].any()
