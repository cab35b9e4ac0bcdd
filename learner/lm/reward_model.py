"""A reward model trained on preference pairs (`model.kind: reward_model`): a Hugging Face model
folder read as a scalar scorer (`AutoModelForSequenceClassification` with one label: a causal
LM's folder gains a fresh score head, a classifier's keeps its own), trained by a preference loss
(`learner.algo`, PREFERENCE_LOSSES: the Bradley–Terry loss) on the pairs of `contracts/pairs.py`,
exported as a folder that relay's own served reward model (`prompts.rewards: ["model:<folder>"]`)
and transformers load and score exactly as it was trained.

Scoring is the served model's (`rollout_workers/lm/reward_models.py`): rows padded on the right to
their bucket (`contracts/pairs.py` bucket_width: a few shapes; every row's positions start at 0,
as when it is scored alone), the score the logit at each row's last token. The update takes a
batch of pairs, both sides in one pass, in micro-batches under a token budget, with float32 master
weights under autocast where asked; LoRA adapters (model.lora) train instead of the whole body
where set. No Ray here: the driver runs it (`services/driver/preference_backend.py`).
"""

from __future__ import annotations

import copy
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from ...contracts.config import EntrySection, LoraConfig, RelayConfig, entry_section, language_seed
from ...contracts.pairs import BUCKET, PairSet, bucket_width, load_pairs, pad_right
from ...contracts.prompts import PromptOrder
from ...learner.device import resolve_device
from ...learner.lm.settings import amp_of
from ...policy.causal_lm import check_model_folder, checkpoint_blocks, load_tokenizer, with_lora


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


class PreferenceSettings(EntrySection):
    """`learner.<learner.algo>` of a reward model's run: how long a pair's side may be, and how
    many tokens a micro-batch takes."""

    max_tokens: int = Field(
        1024,
        ge=1,
        le=1_000_000,
        description="Tokens a pair's side (prompt and reply together) may take; a file with a longer "
        "one is refused before the run starts.",
    )
    micro_batch_tokens: int = Field(
        8192,
        ge=1,
        le=2**31,
        description="Tokens (both sides of the pairs, padding included) per forward/backward "
        "micro-batch; gradients accumulate over the update's prompts.batch_size pairs.",
    )


# A loss of scored pairs: (chosen [B], rejected [B], margin [B] or None) -> (the loss, its
# statistics pair_accuracy and reward_margin).
PairLoss = Callable[[Tensor, Tensor, Tensor | None], tuple[Tensor, dict[str, Tensor]]]


@dataclass(frozen=True)
class PreferenceLoss:
    """A registered loss of scored pairs (`PairLoss`) and its settings' class."""

    loss: PairLoss
    settings: type[PreferenceSettings] = PreferenceSettings


# `learner.algo` of a reward model's run. A new loss is one entry here.
PREFERENCE_LOSSES: dict[str, PreferenceLoss] = {"bradley_terry": PreferenceLoss(bradley_terry)}


def preference_loss(name: str) -> PreferenceLoss:
    """The registered loss; ValueError naming the known ones otherwise."""
    if name not in PREFERENCE_LOSSES:
        raise ValueError(
            f"learner.algo={name!r} is not a reward model's loss: choose {', '.join(PREFERENCE_LOSSES)}"
        )
    return PREFERENCE_LOSSES[name]


def preference_settings(cfg: RelayConfig) -> PreferenceSettings:
    """The run's `learner.<learner.algo>` section, validated, its defaults filled."""
    lc = cfg.learner
    return entry_section(lc, "learner", lc.algo, preference_loss(lc.algo).settings)


def learner_sections() -> dict[str, type[EntrySection]]:
    """Every preference loss's `learner.<name>` section."""
    return {name: entry.settings for name, entry in PREFERENCE_LOSSES.items()}


@dataclass(frozen=True)
class RewardModelSetup:
    """What a reward model's training reads: the model folder, the pairs file, pairs per update,
    the longest side in tokens, the optimizer's step size and clip, the seed, the device and
    precision, the token budget of a micro-batch, whether blocks are checkpointed, the loss and
    LoRA adapters (None: the whole model trains)."""

    path: str
    pairs: str
    batch_size: int
    max_tokens: int
    lr: float = 1e-5
    max_grad_norm: float = 1.0
    seed: int = 0
    device: str = "cpu"
    npu_ids: list[int] | None = None
    amp: bool | str = False  # True, False, or "auto": bf16 where the device computes it
    amp_dtype: str = "bfloat16"
    micro_batch_tokens: int = 8192
    grad_checkpointing: bool = False
    shuffle: bool = True
    loss: str = "bradley_terry"
    lora: LoraConfig | None = None

    @classmethod
    def of(cls, cfg: RelayConfig) -> RewardModelSetup:
        """The setup a run's config states (model.kind=reward_model)."""
        lc, pr = cfg.learner, cfg.prompts
        assert cfg.model.path is not None and pr.train is not None
        settings = preference_settings(cfg)
        return cls(
            path=str(cfg.model.path),
            pairs=str(pr.train),
            batch_size=pr.batch_size,
            max_tokens=settings.max_tokens,
            lr=lc.lr,
            max_grad_norm=lc.max_grad_norm,
            seed=language_seed(cfg),
            device=lc.device,
            npu_ids=lc.npu_ids,
            amp=lc.use_amp,
            amp_dtype=lc.amp_dtype,
            micro_batch_tokens=settings.micro_batch_tokens,
            grad_checkpointing=lc.grad_checkpointing,
            shuffle=pr.shuffle,
            loss=lc.algo,
            lora=cfg.model.lora,
        )


def build_scorer(path: str, pad_id: int, lora: LoraConfig | None = None, meta: bool = False) -> Any:
    """The folder as a sequence classifier with one label, in float32 (a causal LM's folder: its
    body, and a score head drawn from the global seed), with LoRA adapters where `lora` is set.
    `meta`: the architecture only, on the meta device (shape checks: no weights read)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    check_model_folder(path)  # the folder is data before transformers reads it
    if meta:
        config = AutoConfig.from_pretrained(
            path, num_labels=1, local_files_only=True, trust_remote_code=False
        )
        with torch.device("meta"):
            model = AutoModelForSequenceClassification.from_config(config)
    else:
        from transformers.utils import logging

        # A causal LM's folder has no score head: transformers' load report says so at length,
        # and that is what the folder is for here.
        was = logging.get_verbosity()
        logging.set_verbosity_error()
        try:
            model = AutoModelForSequenceClassification.from_pretrained(
                path,
                num_labels=1,
                local_files_only=True,
                trust_remote_code=False,
                use_safetensors=True,
                dtype=torch.float32,
            )
        finally:
            logging.set_verbosity(was)
    model.config.pad_token_id = pad_id  # the classifier finds each row's last token by it
    return model if lora is None else with_lora(model, lora, task="SEQ_CLS")


def padded(rows: list[list[int]], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Rows padded on the right to their bucket (`contracts/pairs.py` pad_right): ids and mask
    [R, W] on `device`."""
    ids, mask = pad_right(rows, pad_id)
    return torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)


def score_pairs(
    score: Callable[[list[list[int]]], Tensor], pairs: PairSet, loss: PairLoss, batch: int = 16
) -> dict[str, Any]:
    """`pairs` scored by `score` (rows -> [R] scores), `batch` rows at a time, without training:
    the loss and its statistics, and under "correct" each pair's 1.0 (chosen scored above
    rejected) or 0.0 and under "tokens" each pair's tokens."""
    n = len(pairs)
    c = torch.cat([score(pairs.chosen_ids[s : s + batch]) for s in range(0, n, batch)])
    r = torch.cat([score(pairs.rejected_ids[s : s + batch]) for s in range(0, n, batch)])
    margin = None if pairs.margins is None else torch.tensor(pairs.margins, device=c.device)
    value, stats = loss(c, r, margin)
    sizes = [len(a) + len(b) for a, b in zip(pairs.chosen_ids, pairs.rejected_ids, strict=True)]
    return {
        "loss": float(value),
        **{k: float(v) for k, v in stats.items()},
        "correct": (c > r).float().tolist(),
        "tokens": sizes,
    }


def pair_summary(correct: list[float], tokens: list[int], seconds: float) -> dict[str, Any]:
    """An evaluation's summary (`EvalReport.summary`, `relay eval`'s) of pairs each 1.0 or 0.0
    (ranked right or not): its return is the pair accuracy, its length a pair's tokens."""
    arr = np.asarray(correct if correct else [np.nan], dtype=np.float64)
    return {
        "return_mean": float(arr.mean()),
        "return_std": float(arr.std()),
        "return_min": float(arr.min()),
        "return_max": float(arr.max()),
        "len_mean": float(np.mean(tokens)) if tokens else 0.0,
        "episodes": len(correct),
        "seconds": seconds,
    }


def score_rows(model: Any, rows: list[list[int]], pad_id: int) -> Tensor:
    """Each row's score [R] by `model` on the CPU in float32, without gradients."""
    ids, mask = padded(rows, pad_id, torch.device("cpu"))
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits[:, 0].float()


def check_rows(vocab: int, pad_id: int, seed: int = 0) -> list[list[int]]:
    """Rows of random tokens (no pad token among them) that an export is checked on: short ones
    and one past the first bucket."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for length in (1, 5, 17, BUCKET + 3):
        row = torch.randint(0, vocab, (length,), generator=gen)
        rows.append([int(t) if int(t) != pad_id else (pad_id + 1) % vocab for t in row])
    return rows


def export_scorer(model: Any, tokenizer: Any, folder: str | Path) -> Path:
    """A folder `AutoModelForSequenceClassification.from_pretrained` loads (safetensors, its
    tokenizer beside it; LoRA adapters merged), checked before it takes its name: loaded back, it
    scores random rows as `model` does on the CPU in float32 (within 1e-4), or nothing is left of
    it. FileExistsError where `folder` exists: relay never replaces a folder."""
    from transformers import AutoModelForSequenceClassification

    out = Path(folder)
    if out.exists():
        raise FileExistsError(f"{out} exists: relay never replaces a folder")
    mine = copy.deepcopy(model).cpu().float().eval()  # the model itself stays where it trains
    # LoRA: the adapters folded into the weights they adapt
    whole = copy.deepcopy(mine).merge_and_unload() if hasattr(mine, "merge_and_unload") else mine
    # written beside it and renamed into place (as `relay export` writes a policy's): a crash or a
    # signal leaves nothing under its name, or the whole checked folder
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        whole.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        back = AutoModelForSequenceClassification.from_pretrained(
            str(tmp),
            local_files_only=True,
            trust_remote_code=False,
            use_safetensors=True,
            dtype=torch.float32,
        ).eval()
        pad_id = int(tokenizer.pad_token_id)
        rows = check_rows(int(whole.config.vocab_size), pad_id)
        theirs, ours = score_rows(back, rows, pad_id), score_rows(mine, rows, pad_id)
        if not torch.allclose(theirs, ours, atol=1e-4, rtol=1e-4):
            raise RuntimeError(
                f"the exported reward model scores {float((theirs - ours).abs().max()):.3g} away from "
                "the learner's: nothing was exported"
            )
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


class RewardModelLearner:
    """Preference-loss updates of a scalar scorer on a pairs file, its checkpointable state and
    its Hugging Face export."""

    def __init__(self, setup: RewardModelSetup) -> None:
        self.setup = setup
        self.loss = preference_loss(setup.loss).loss
        self.dev = resolve_device(setup.device, setup.npu_ids)
        torch.manual_seed(setup.seed)  # the score head of a causal LM's folder, and adapters, are drawn here
        self.tokenizer = load_tokenizer(setup.path)
        self.tokenizer.padding_side = "right"
        self.pad_id = int(self.tokenizer.pad_token_id)
        self.model = build_scorer(setup.path, self.pad_id, setup.lora).to(self.dev.device)
        if setup.grad_checkpointing:
            checkpoint_blocks(self.model, setup.lora is not None)
        self.trained = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = self.dev.adam(self.trained, setup.lr, 1e-8)
        self.amp, self.amp_dtype = amp_of(setup.amp, setup.amp_dtype, self.dev)
        self.pairs = load_pairs(setup.pairs, self.tokenizer, setup.max_tokens)
        self.order = PromptOrder(len(self.pairs), setup.batch_size, setup.seed, setup.shuffle)
        self.updates = 0

    def describe(self) -> dict[str, Any]:
        trained = sum(p.numel() for p in self.trained)
        return {
            "device": str(self.dev.device),
            "amp": self.amp_dtype if self.amp else None,
            "pairs": len(self.pairs),
            "trained_params": trained,
        }

    def scores(self, rows: list[list[int]], grad: bool = False) -> Tensor:
        """Each row's score [R] (float32), as the served model scores it."""
        ids, mask = padded(rows, self.pad_id, self.dev.device)
        with torch.set_grad_enabled(grad), self.dev.autocast(self.amp, self.amp_dtype):
            return self.model(input_ids=ids, attention_mask=mask).logits[:, 0].float()

    def _micro(self, pairs: int, width: int) -> list[slice]:
        per = max(1, self.setup.micro_batch_tokens // (2 * width))
        return [slice(s, min(s + per, pairs)) for s in range(0, pairs, per)]

    def train(self) -> dict[str, Any]:
        """One update on the next prompts.batch_size pairs: its metrics, and under "correct" each
        pair's 1.0 (chosen scored above rejected) or 0.0, and under "tokens" the tokens trained."""
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
            loss, _ = self.loss(c, r, None if margin is None else margin[s])
            (loss * (len(chosen[s]) / len(idx))).backward()  # each micro-batch its share of the mean
            got_c.append(c.detach())
            got_r.append(r.detach())
        norm = torch.nn.utils.clip_grad_norm_(self.trained, self.setup.max_grad_norm)
        skipped = not bool(torch.isfinite(norm))
        if not skipped:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.updates += 1
        c, r = torch.cat(got_c), torch.cat(got_r)
        loss, stats = self.loss(c, r, margin)
        both = torch.cat([c, r])
        tokens = sum(len(x) for x in chosen + rejected)
        seconds = time.perf_counter() - t0
        return {
            "loss": float(loss),
            **{k: float(v) for k, v in stats.items()},
            "score_mean": float(both.mean()),
            "score_std": float(both.std(unbiased=False)),
            "grad_norm": float(norm),
            "pair_width": width,
            "trained_tokens_per_s": tokens / max(seconds, 1e-9),
            "update_s": seconds,
            "amp_skipped": int(skipped),
            "correct": (c > r).float().tolist(),
            "tokens": tokens,
        }

    def evaluate(self, pairs: PairSet, batch: int = 16) -> dict[str, Any]:
        """Loss, pair accuracy and mean margin on `pairs` (prompts.eval's), without training, and
        under "correct" each pair's 1.0 or 0.0 and under "tokens" each pair's tokens."""
        self.model.eval()
        return score_pairs(self.scores, pairs, self.loss, batch)

    def weights(self) -> dict[str, Tensor]:
        """The model's tensors on the CPU, copies (a best checkpoint's `model`)."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def state_dict(self) -> dict[str, Any]:
        """Tensors and numbers only: the weights on the CPU, Adam's state, the pairs' order."""
        return {
            "model": self.weights(),
            "optimizer": self.optimizer.state_dict(),
            "order": self.order.state_dict(),
            "updates": self.updates,
            "version": self.updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.order.load_state_dict(state["order"])
        self.updates = int(state["updates"])

    def export_hf(self, folder: str | Path) -> Path:
        """The model as a Hugging Face folder (`export_scorer`), checked before it takes its name."""
        return export_scorer(self.model, self.tokenizer, folder)
