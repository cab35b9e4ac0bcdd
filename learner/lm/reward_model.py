"""A reward model trained on preference pairs (`learner.algo: reward_model`): a Hugging Face
model folder read as a scalar scorer (`AutoModelForSequenceClassification` with one label: a
causal LM's folder gains a fresh score head, a classifier's keeps its own), trained by the
Bradley–Terry loss on the pairs of `contracts/pairs.py`, exported as a folder that relay's own
served reward model (`prompts.rewards: ["model:<folder>"]`) and transformers load and score
exactly as it was trained.

Scoring is the served model's (`rollout_workers/lm/reward_models.py`): rows padded on the right
to a multiple of BUCKET tokens (a few shapes; every row's positions start at 0, as when it is
scored alone), the score the logit at each row's last token. The update takes a batch of pairs,
both sides in one pass, in micro-batches under a token budget, with float32 master weights under
autocast where asked. No Ray here: the driver runs it (`services/driver`).
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ...contracts.pairs import PairSet, load_pairs
from ...contracts.prompts import PromptOrder
from ...learner.device import resolve_device
from ...policy.causal_lm import check_model_folder, load_tokenizer

BUCKET = 64  # the served reward model's padding multiple: the same shapes, the same scores


def bradley_terry(
    chosen: Tensor, rejected: Tensor, margin: Tensor | None = None
) -> tuple[Tensor, dict[str, Tensor]]:
    """The Bradley–Terry loss of pairs scored chosen [B] and rejected [B] (a margin [B]: chosen
    must win by it): mean(-log sigmoid(chosen - rejected - margin)), and its statistics: the
    fraction of pairs ranked right (chosen > rejected), the mean margin chosen - rejected."""
    diff = chosen.float() - rejected.float()
    target = diff if margin is None else diff - margin.float()
    loss = -F.logsigmoid(target).mean()
    return loss, {"pair_accuracy": (diff > 0).float().mean(), "reward_margin": diff.mean()}


def bradley_terry_plain(
    chosen: list[float], rejected: list[float], margin: list[float] | None = None
) -> float:
    """`bradley_terry`'s loss written out, pair by pair: its plain reference."""
    total = 0.0
    for k, (c, r) in enumerate(zip(chosen, rejected, strict=True)):
        d = c - r - (margin[k] if margin is not None else 0.0)
        total += math.log1p(math.exp(-d)) if d > -30 else -d
    return total / len(chosen)


@dataclass(frozen=True)
class RewardModelSetup:
    """What a reward model's training reads: the model folder, the pairs file, pairs per update,
    the longest side in tokens, the optimizer's step size and clip, the seed, the device and
    precision, the token budget of a micro-batch and whether blocks are checkpointed."""

    path: str
    pairs: str
    batch_size: int
    max_tokens: int
    lr: float = 1e-5
    max_grad_norm: float = 1.0
    seed: int = 0
    device: str = "cpu"
    amp: bool = False
    amp_dtype: str = "bfloat16"
    micro_batch_tokens: int = 8192
    grad_checkpointing: bool = False
    shuffle: bool = True


def build_scorer(path: str, pad_id: int) -> Any:
    """The folder as a sequence classifier with one label, in float32 (a causal LM's folder: its
    body, and a score head drawn from the global seed)."""
    from transformers import AutoModelForSequenceClassification

    check_model_folder(path)  # the folder is data before transformers reads it
    model = AutoModelForSequenceClassification.from_pretrained(
        path,
        num_labels=1,
        local_files_only=True,
        trust_remote_code=False,
        use_safetensors=True,
        dtype=torch.float32,
    )
    model.config.pad_token_id = pad_id  # the classifier finds each row's last token by it
    return model


def bucket_width(rows: list[list[int]]) -> int:
    """The longest row's tokens, rounded up to a multiple of BUCKET."""
    return -(-max(len(r) for r in rows) // BUCKET) * BUCKET


def padded(rows: list[list[int]], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Rows padded on the right to a multiple of BUCKET: ids and mask [R, W]."""
    width = bucket_width(rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for k, r in enumerate(rows):
        ids[k, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[k, : len(r)] = 1
    return ids.to(device), mask.to(device)


class RewardModelLearner:
    """Bradley–Terry updates of a scalar scorer on a pairs file, its checkpointable state and
    its Hugging Face export."""

    def __init__(self, setup: RewardModelSetup) -> None:
        self.setup = setup
        self.dev = resolve_device(setup.device)
        torch.manual_seed(setup.seed)  # the score head of a causal LM's folder is drawn here
        self.tokenizer = load_tokenizer(setup.path)
        self.tokenizer.padding_side = "right"
        self.model = build_scorer(setup.path, int(self.tokenizer.pad_token_id)).to(self.dev.device)
        if setup.grad_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.optimizer = self.dev.adam(
            [p for p in self.model.parameters() if p.requires_grad], setup.lr, 1e-8
        )
        self.pairs = load_pairs(setup.pairs, self.tokenizer, setup.max_tokens)
        self.order = PromptOrder(len(self.pairs), setup.batch_size, setup.seed, setup.shuffle)
        self.updates = 0

    def scores(self, rows: list[list[int]], grad: bool = False) -> Tensor:
        """Each row's score [R] (float32), as the served model scores it."""
        ids, mask = padded(rows, int(self.tokenizer.pad_token_id), self.dev.device)
        with torch.set_grad_enabled(grad), self.dev.autocast(self.setup.amp, self.setup.amp_dtype):
            return self.model(input_ids=ids, attention_mask=mask).logits[:, 0].float()

    def _micro(self, pairs: int, width: int) -> list[slice]:
        per = max(1, self.setup.micro_batch_tokens // (2 * width))
        return [slice(s, min(s + per, pairs)) for s in range(0, pairs, per)]

    def train(self) -> dict[str, Any]:
        """One update on the next prompts.batch_size pairs: its loss and statistics."""
        t0 = time.perf_counter()
        idx = self.order.next()
        chosen = [self.pairs.chosen_ids[i] for i in idx]
        rejected = [self.pairs.rejected_ids[i] for i in idx]
        margins = self.pairs.margins
        margin = None if margins is None else torch.tensor([margins[i] for i in idx], device=self.dev.device)
        width = bucket_width(chosen + rejected)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        got_c, got_r = [], []
        for s in self._micro(len(idx), width):
            scored = self.scores(chosen[s] + rejected[s], grad=True)
            c, r = scored[: len(chosen[s])], scored[len(chosen[s]) :]
            loss, _ = bradley_terry(c, r, None if margin is None else margin[s])
            (loss * (len(chosen[s]) / len(idx))).backward()  # each micro-batch its share of the mean
            got_c.append(c.detach())
            got_r.append(r.detach())
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.setup.max_grad_norm)
        if torch.isfinite(norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.updates += 1
        c, r = torch.cat(got_c), torch.cat(got_r)
        loss, stats = bradley_terry(c, r, margin)
        both = torch.cat([c, r])
        tokens = sum(len(x) for x in chosen + rejected)
        seconds = time.perf_counter() - t0
        return {
            "loss": float(loss),
            **{k: float(v) for k, v in stats.items()},
            "score_mean": float(both.mean()),
            "score_std": float(both.std(unbiased=False)),
            "grad_norm": float(norm),
            "trained_tokens_per_s": tokens / max(seconds, 1e-9),
            "update_s": seconds,
        }

    def evaluate(self, pairs: PairSet, batch: int = 16) -> dict[str, float]:
        """Loss, pair accuracy and mean margin on `pairs` (prompts.eval's), without training."""
        self.model.eval()
        c = torch.cat([self.scores(pairs.chosen_ids[s : s + batch]) for s in range(0, len(pairs), batch)])
        r = torch.cat([self.scores(pairs.rejected_ids[s : s + batch]) for s in range(0, len(pairs), batch)])
        margin = None if pairs.margins is None else torch.tensor(pairs.margins, device=c.device)
        loss, stats = bradley_terry(c, r, margin)
        return {"loss": float(loss), **{k: float(v) for k, v in stats.items()}}

    def state_dict(self) -> dict[str, Any]:
        """Tensors and numbers only: the weights on the CPU, Adam's state, the pairs' order."""
        return {
            "model": {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "order": self.order.state_dict(),
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.order.load_state_dict(state["order"])
        self.updates = int(state["updates"])

    def export_hf(self, folder: str | Path, check_rows: int = 8) -> None:
        """A folder `AutoModelForSequenceClassification.from_pretrained` loads (safetensors, its
        tokenizer beside it), checked before it takes its name: loaded back, it scores the first
        pairs as the learner does (within 1e-4), or nothing is left of it."""
        from transformers import AutoModelForSequenceClassification

        out = Path(folder)
        if out.exists():
            raise FileExistsError(f"{out} exists: relay never replaces a folder")
        # written beside it and renamed into place (as `relay export` writes a policy's): a crash
        # or a signal leaves nothing under its name, or the whole checked folder
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            self.model.save_pretrained(str(tmp), safe_serialization=True)
            self.tokenizer.save_pretrained(str(tmp))
            back = AutoModelForSequenceClassification.from_pretrained(
                str(tmp),
                local_files_only=True,
                trust_remote_code=False,
                use_safetensors=True,
                dtype=torch.float32,
            ).eval()
            rows = (self.pairs.chosen_ids + self.pairs.rejected_ids)[:check_rows]
            ids, mask = padded(rows, int(self.tokenizer.pad_token_id), torch.device("cpu"))
            with torch.no_grad():
                theirs = back(input_ids=ids, attention_mask=mask).logits[:, 0].float()
                ours = self.scores(rows).cpu()
            if not torch.allclose(theirs, ours, atol=1e-4, rtol=1e-4):
                raise RuntimeError(
                    f"the exported reward model scores {float((theirs - ours).abs().max()):.3g} away from "
                    "the learner's: nothing was exported"
                )
            os.rename(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
