"""The language family: runs that train a causal language model (`model.kind: causal_lm`) on
prompts, their completions scored by reward functions. Its preflight reads the model folder, the
tokenizer, the prompt files and the rewards as data; its algorithms are the advantage estimators
(`learner/lm/estimators`); its backend generates, scores and trains by rounds
(`services/driver/lm_backend.py`); it exports Hugging Face folders."""

from __future__ import annotations

from pathlib import Path

import torch

from ....contracts.config import RelayConfig
from ....contracts.prompts import PromptError, load_prompts
from ....learner.device import DeviceContext, check_device
from ....learner.lm.estimators import ESTIMATORS, estimator
from ....learner.lm.learner import lm_precision
from ....learner.lm.memory import GIB, Architecture, MemoryEstimate, Settings, estimate
from ....learner.lm.reward_model import PREFERENCE_LOSSES
from ....learner.lm.settings import lm_settings
from ....policy.causal_lm import ModelFolderError, build_language_policy, check_model_folder, load_tokenizer
from ....policy.decoders import decoder_entry
from ....policy.lm_decoding import decoding_problem
from ....policy.models.causal_lm import LANGUAGE_PANELS
from ....rollout_workers.lm.rewards import resolve_rewards
from ....services.driver.checks import PreflightError, registry_problems, runs_here
from ....services.driver.families.base import Family
from ....services.driver.lm_backend import LanguageBackend
from ....services.runs.checkpoints import check_language_resumable


def config_problems(cfg: RelayConfig) -> list[str]:
    """The language family's registry names: learner.algo is an advantage estimator (its section,
    the update's and the policy loss's are checked with every entry section), generation.backend
    a decoder that samples where generation.placement puts it."""
    problems = registry_problems([(estimator, cfg.learner.algo)])
    if cfg.learner.algo in PREFERENCE_LOSSES:
        problems.append(f"learner.algo={cfg.learner.algo} trains a reward model: set model.kind=reward_model")
    try:
        decoder = decoder_entry(cfg)
    except ValueError as err:
        return [*problems, str(err)]
    gen = cfg.generation
    if gen.placement not in decoder.placements:
        where = " or ".join(decoder.placements)
        problems.append(
            f"generation.backend={gen.backend} samples on {where}, not generation.placement={gen.placement}"
        )
    return problems


def language_precision(cfg: RelayConfig, spec: None, address: str | None = None) -> str:
    """What the learner computes in: bf16 autocast over float32 master weights where its device
    computes bf16 (`learner.use_amp: auto`), as `lm_precision` decides on the learner's host."""
    lc = cfg.learner
    here = runs_here(cfg, address)
    if not here and lc.use_amp == "auto":
        return "decided on the learner's host: bfloat16 autocast where its device computes bf16"
    dev = DeviceContext(check_device(lc.device, lc.npu_ids) if here else torch.device("cpu"))
    amp, dtype = lm_precision(cfg, dev)
    return f"{dtype} autocast, float32 master weights" if amp else "float32 (no bf16 units on the device)"


def compile_problem(cfg: RelayConfig) -> str | None:
    """Why generation.compile or learner.compile cannot work here: the model's architecture or
    transformers' version (lm_decoding.decoding_problem, for the decoder), or inductor on a host
    without the C++ compiler it builds with."""
    from transformers import AutoConfig

    if cfg.generation.compile:
        config = AutoConfig.from_pretrained(
            str(cfg.model.path), local_files_only=True, trust_remote_code=False
        )
        problem = decoding_problem(config)
        if problem:
            return problem
    setting = "generation.compile" if cfg.generation.compile else "learner.compile"
    npu = cfg.learner.device.startswith("npu") and cfg.generation.placement == "learner"
    if cfg.learner.compile_backend in ("auto", "inductor") and not npu:
        from torch._inductor.cpp_builder import get_cpp_compiler

        try:
            get_cpp_compiler()
        except Exception as err:  # torch raises its own error types for a missing compiler
            return (
                f"{setting}: inductor needs a C++ compiler on this host ({type(err).__name__}); "
                f"install g++, or set {setting}=false"
            )
    return None


def check(cfg: RelayConfig, address: str | None) -> None:
    """`check_language`, then whether the learner fits its device. A language run has no env: no
    spec."""
    check_language(cfg)
    check_fits(cfg, address)


def architecture(cfg: RelayConfig) -> Architecture:
    """model.path's architecture (with its LoRA adapters), built on the meta device once per
    folder state and adapters: `relay validate` and the start of a run ask for it twice."""
    assert cfg.model.path is not None
    folder = Path(cfg.model.path).resolve()
    config_file = folder / "config.json"
    stamp = config_file.stat().st_mtime_ns if config_file.is_file() else 0
    lora = None if cfg.model.lora is None else cfg.model.lora.model_dump_json()
    key = (str(folder), stamp, lora)  # a rewritten config, or other adapters, are built anew
    if key not in _ARCHITECTURES:
        from transformers import AutoConfig

        policy, _ = build_language_policy(cfg, meta=True)
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
        if len(_ARCHITECTURES) >= 4:
            _ARCHITECTURES.pop(next(iter(_ARCHITECTURES)))
        _ARCHITECTURES[key] = Architecture.of(policy, config.get_text_config())
    return _ARCHITECTURES[key]


_ARCHITECTURES: dict[tuple[str, int, str | None], Architecture] = {}


def memory_estimate(cfg: RelayConfig) -> MemoryEstimate:
    """The learner's memory per device (`learner/lm/memory.py`), from model.path's architecture
    on the meta device and the run's settings."""
    lc, lm = cfg.learner, lm_settings(cfg)
    half = lc.amp_dtype == "bfloat16" and (
        lc.use_amp is True or (lc.use_amp == "auto" and not lc.device.startswith("cpu"))
    )
    settings = Settings(
        ranks=lc.num_learners,
        half=half,
        reference=lc.kl_coef > 0 and cfg.model.lora is None,
        checkpointing=lc.grad_checkpointing,
        micro_batch_tokens=lm.micro_batch_tokens,
        logprob_chunk=lm.logprob_chunk,
        rows=cfg.prompts.batch_size * lc.group_size,
        prompt_tokens=cfg.prompts.max_prompt_tokens,
        new_tokens=cfg.generation.max_new_tokens,
    )
    return estimate(architecture(cfg), settings)


def describe_memory(cfg: RelayConfig) -> str:
    """The estimate in words, for `relay validate` and the start of a run."""
    ranks = cfg.learner.num_learners
    return f"{memory_estimate(cfg).describe()} on each of {ranks} learner device{'s' * (ranks != 1)}"


def device_memory(cfg: RelayConfig, address: str | None) -> float | None:
    """One learner device's memory in bytes: learner.device_memory_gb, else a CUDA device's where
    the learner runs on this host, else unknown (None)."""
    lc = cfg.learner
    if lc.device_memory_gb is not None:
        return lc.device_memory_gb * GIB
    if lc.device.startswith("cuda") and runs_here(cfg, address) and torch.cuda.is_available():
        index = int(lc.device.split(":")[1]) if ":" in lc.device else 0
        return float(torch.cuda.get_device_properties(index).total_memory)
    return None


def check_fits(cfg: RelayConfig, address: str | None) -> None:
    """PreflightError (one line naming the knobs) where the estimate is above the device's memory."""
    have = device_memory(cfg, address)
    if have is None:
        return
    est = memory_estimate(cfg)
    if est.peak > have:
        raise PreflightError(
            f"the learner needs about {est.describe()} per device, more than its {have / GIB:.3g} GiB: "
            "shard it over more ranks (learner.num_learners), train LoRA adapters (model.lora), turn on "
            "learner.grad_checkpointing, or lower learner.lm.micro_batch_tokens, prompts.batch_size or "
            "generation.max_new_tokens"
        )


def check_language(cfg: RelayConfig) -> None:
    """A language run's inputs, all read as data before anything starts: the model folder, its
    tokenizer, every prompt file (each prompt within prompts.max_prompt_tokens) and the rewards
    (PreflightError, one line, on the first problem)."""

    assert cfg.model.path is not None and cfg.prompts.train is not None
    try:
        check_model_folder(cfg.model.path)
        tokenizer = load_tokenizer(cfg.model.path)
        for label, path in (("prompts.train", cfg.prompts.train), ("prompts.eval", cfg.prompts.eval)):
            if path is not None:
                load_prompts(path, tokenizer, cfg.prompts.max_prompt_tokens, label)
        resolve_rewards(cfg.prompts.rewards)
        problem = decoder_entry(cfg).problem(cfg)
        if problem:
            raise PreflightError(problem)
        if cfg.generation.compile or cfg.learner.compile:
            problem = compile_problem(cfg)
            if problem:
                raise PreflightError(problem)
    except (ModelFolderError, PromptError, ValueError) as err:
        raise PreflightError(str(err)) from None
    except ImportError as err:
        raise PreflightError(
            f"model.kind=causal_lm needs the llm extra: pip install 'relay-rl[llm]' ({err})"
        ) from None


FAMILY = Family(
    algorithms=lambda: list(ESTIMATORS),
    config_problems=config_problems,
    check=check,
    precision=language_precision,
    backend=lambda cfg: LanguageBackend,
    check_resumable=check_language_resumable,
    export_formats=("hf",),
    panels=LANGUAGE_PANELS,
    x_axis=("iteration", "iterations"),
    memory=describe_memory,
)
