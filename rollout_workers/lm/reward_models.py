"""Reward models: `prompts.rewards: ["model:<folder>"]` scores each completion with a Hugging Face
sequence-classification model (any `AutoModelForSequenceClassification` architecture with one
label): the score is its logit.

A reward function like the others (TRL's signature, `rollout_workers/lm/rewards.py`), so it mixes
with them by `prompts.reward_weights` and its faults (a raise, a NaN) are counted as theirs are.
The folder is data, held to the policy folder's rules (`policy/causal_lm.py` check_model_folder:
config, tokenizer and safetensors headers read as data, no remote code, every tensor of the
classifier present with its shape); that is checked where the entry is resolved (the driver's
preflight, before anything starts), and the model is loaded by the reward actor that first calls
it. The reward model has its own tokenizer and chat template: completions are scored from their
text (the policy's tokens are never reused, so the two tokenizers may differ), read as a pairs
file's sides are read (`contracts/pairs.py` scored_texts): a chat prompt with the assistant's
reply rendered by the reward model's template in a budgeted child process, as every template is.

Rows are scored in batches of BATCH, padded on the right to their bucket (`contracts/pairs.py`
bucket_width: a few shapes, not one per batch; the shapes a trained reward model scored its pairs
in), on the actor's CPUs in float32.
"""

from __future__ import annotations

from typing import Any

import torch

from ...contracts.pairs import pad_right, scored_texts
from ...policy.causal_lm import ModelFolderError, check_model_folder, load_tokenizer

BATCH = 16  # completions per forward pass


class RewardModel:
    """A reward function scoring completions with the sequence classifier in `folder`."""

    def __init__(self, folder: str) -> None:
        try:
            config = check_model_folder(folder, head="sequence_classification")
        except ModelFolderError as err:
            raise ValueError(f"prompts.rewards: model:{folder}: {err}") from None
        if int(config.get("num_labels", len(config.get("id2label") or {0: 0}))) != 1:
            raise ValueError(
                f"prompts.rewards: model:{folder}: a reward model scores with one label "
                f"(its config.json has {len(config.get('id2label') or {})})"
            )
        self.folder = folder
        self.__name__ = f"model:{folder}"  # how faults and each reward's part name it
        self._model: Any = None
        self._tokenizer: Any = None
        self.max_tokens = int(config.get("max_position_embeddings") or config.get("n_positions") or 2048)

    def _load(self) -> None:
        from transformers import AutoModelForSequenceClassification

        self._tokenizer = load_tokenizer(self.folder)
        # Padded on the right: every row's positions start at 0, as when it is scored alone.
        self._tokenizer.padding_side = "right"
        self._model = AutoModelForSequenceClassification.from_pretrained(
            self.folder,
            local_files_only=True,
            trust_remote_code=False,
            use_safetensors=True,
            dtype=torch.float32,
        ).eval()
        if self._model.config.pad_token_id is None:  # the classifier finds each row's last token by it
            self._model.config.pad_token_id = self._tokenizer.pad_token_id
        self._pad_id = int(self._model.config.pad_token_id)

    def __call__(self, prompts: list[Any], completions: list[Any], **_: Any) -> list[float]:
        if self._model is None:
            self._load()
        texts = scored_texts(self._tokenizer, prompts, completions)
        scores: list[float] = []
        with torch.no_grad():
            for start in range(0, len(texts), BATCH):
                rows = self._tokenizer(
                    texts[start : start + BATCH],
                    truncation=True,
                    max_length=self.max_tokens,
                    add_special_tokens=False,
                )["input_ids"]
                ids, mask = pad_right([list(r) or [self._pad_id] for r in rows], self._pad_id)
                logits = self._model(
                    input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)
                ).logits
                scores += logits[:, 0].float().tolist()
        return scores


def reward_model(folder: str) -> RewardModel:
    """The `model:<folder>` entry of prompts.rewards."""
    return RewardModel(folder)
