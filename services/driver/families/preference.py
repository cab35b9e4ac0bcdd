"""The preference family: runs that train a reward model (`model.kind: reward_model`) on
preference pairs. Its preflight reads the model folder, the tokenizer and the pairs files as data;
its algorithms are the preference losses (`learner/lm/reward_model.py` PREFERENCE_LOSSES); its
backend updates the scorer in the driver's process (`services/driver/preference_backend.py`); it
exports Hugging Face sequence-classification folders."""

from __future__ import annotations

from ....contracts.checkpoint import Checkpoint
from ....contracts.config import RelayConfig
from ....contracts.pairs import load_pairs
from ....contracts.prompts import PromptError
from ....learner.device import DeviceContext, check_device
from ....learner.lm.reward_model import PREFERENCE_LOSSES, build_scorer, preference_loss, preference_settings
from ....learner.lm.settings import amp_of
from ....policy.causal_lm import ModelFolderError, check_model_folder, load_tokenizer
from ....policy.models import weights_mismatch
from ....policy.models.reward_model import PREFERENCE_PANELS
from ....services.driver.checks import PreflightError, registry_problems
from ....services.driver.families.base import Family
from ....services.driver.preference_backend import PreferenceBackend
from ....services.runs.checkpoints import ResumeError, check_algo


def config_problems(cfg: RelayConfig) -> list[str]:
    """learner.algo is a preference loss (its section is checked with every entry section)."""
    return registry_problems([(preference_loss, cfg.learner.algo)])


def precision(cfg: RelayConfig, spec: None, address: str | None = None) -> str:
    """What the learner computes in: bf16 autocast over float32 weights where its device computes
    bf16 (`learner.use_amp: auto`). The learner runs in the driver's process: this host's device."""
    lc = cfg.learner
    if lc.use_amp != "auto":
        return f"{lc.amp_dtype} autocast, float32 weights" if lc.use_amp else "float32"
    amp, dtype = amp_of(lc.use_amp, lc.amp_dtype, DeviceContext(check_device(lc.device, lc.npu_ids)))
    return f"{dtype} autocast, float32 weights" if amp else "float32 (no bf16 units on the device)"


def check(cfg: RelayConfig, address: str | None) -> None:
    """The run's inputs, read as data before anything starts: the model folder, its tokenizer,
    and every pair of prompts.train and prompts.eval within the loss's max_tokens (PreflightError,
    one line, on the first problem). A reward model's run has no env: no spec."""
    assert cfg.model.path is not None and cfg.prompts.train is not None
    settings = preference_settings(cfg)
    try:
        check_model_folder(cfg.model.path)
        tokenizer = load_tokenizer(cfg.model.path)
        for label, path in (("prompts.train", cfg.prompts.train), ("prompts.eval", cfg.prompts.eval)):
            if path is not None:
                load_pairs(path, tokenizer, settings.max_tokens, label)
    except (ModelFolderError, PromptError, ValueError) as err:
        raise PreflightError(str(err)) from None
    except ImportError as err:
        raise PreflightError(
            f"model.kind=reward_model needs the llm extra: pip install 'relay-rl[llm]' ({err})"
        ) from None


def check_resumable(cfg: RelayConfig, spec: None, ckpt: Checkpoint, name: str) -> None:
    """A reward model's run continues only with the same loss, on a model of the same
    architecture, size and adapters: the weights must fit model.path's classifier (built on the
    meta device: no memory, no weights read)."""
    check_algo(cfg, ckpt, name)
    want = build_scorer(str(cfg.model.path), 0, cfg.model.lora, meta=True).state_dict()
    weights = ckpt.learner.get("model")
    problem = weights_mismatch(want, weights) if isinstance(weights, dict) else "no model weights"
    if problem:
        raise ResumeError(f"model.path={cfg.model.path} does not fit {name} ({problem})")


FAMILY = Family(
    algorithms=lambda: list(PREFERENCE_LOSSES),
    config_problems=config_problems,
    check=check,
    precision=precision,
    backend=lambda cfg: PreferenceBackend,
    check_resumable=check_resumable,
    export_formats=("hf",),
    panels=PREFERENCE_PANELS,
    x_axis=("iteration", "iterations"),
)
