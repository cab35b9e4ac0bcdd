"""The learner's precision and layout, decided once from the config and the device: `learner.use_amp`
and `learner.channels_last` may say `auto`, and this turns them into what the learner does.

auto picks bf16 autocast only where it is a speed-up: a convolutional policy (pixels; an MLP of
relay's sizes spends its time in launches, not arithmetic) on a device that computes bf16 in
hardware. Where bf16 is emulated (a CPU without avx512_bf16/amx_bf16) autocast makes the Nature
CNN's update slower than float32, so auto keeps float32 there. Normalizer statistics,
advantages and returns stay float32 whatever this says (they are computed outside autocast).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..contracts.config import LearnerConfig
from ..learner.device import DeviceContext


def is_convolutional(model: torch.nn.Module) -> bool:
    """Whether the policy convolves images: it has 4-D weights (2-D convolution kernels)."""
    return any(p.dim() == 4 for p in model.parameters())


@dataclass(frozen=True)
class Precision:
    """What the learner computes in: autocast (and its dtype) or float32, channels-last or not,
    and why, for `relay validate` and the metrics line."""

    use_amp: bool
    amp_dtype: str
    channels_last: bool
    why: str

    @property
    def name(self) -> str:
        """e.g. `bfloat16+channels_last`, `float32` (the metrics line's `precision`)."""
        base = self.amp_dtype if self.use_amp else "float32"
        return base + ("+channels_last" if self.channels_last else "")

    def describe(self) -> str:
        return f"{self.name} ({self.why})"

    def applied(self, cfg: LearnerConfig) -> LearnerConfig:
        """`cfg` with use_amp, amp_dtype and channels_last made concrete (no `auto` left)."""
        return cfg.model_copy(
            update={"use_amp": self.use_amp, "amp_dtype": self.amp_dtype, "channels_last": self.channels_last}
        )


def amp_enabled(cfg: LearnerConfig) -> bool:
    """`cfg.use_amp` as the update applies it: the learner made it concrete (`Precision.applied`);
    `auto` left unresolved (the update called alone, with no device to decide by) is float32."""
    return cfg.use_amp is True


def resolve_precision(cfg: LearnerConfig, dev: DeviceContext, convolutional: bool) -> Precision:
    """The precision for a learner on `dev` whose policy is (or is not) convolutional."""
    channels_last = (
        convolutional and dev.type in ("cpu", "cuda") if cfg.channels_last == "auto" else cfg.channels_last
    )
    if cfg.use_amp != "auto":
        why = "learner.use_amp=" + str(cfg.use_amp).lower()
        return Precision(cfg.use_amp, cfg.amp_dtype, channels_last and convolutional, why)
    if not convolutional:
        why = "auto: a policy without convolutions gains nothing from autocast"
        return Precision(False, "bfloat16", False, why)
    units = dev.bf16_units()
    if units is None:
        why = f"auto: {dev.type} has no bf16 units (emulated bf16 is slower than float32)"
        return Precision(False, "bfloat16", channels_last, why)
    return Precision(True, "bfloat16", channels_last, f"auto: a convolutional policy, {dev.type} has {units}")
