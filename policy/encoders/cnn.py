"""`nature_cnn`: the Nature CNN (Mnih et al. 2015) over uint8 frames, for `model.kind: cnn` (the
whole observation) and for image leaves of a Dict/Tuple observation.

32 8x8/4, 64 4x4/2, 64 3x3/1 convolutions, then a 512-unit layer, ReLU throughout, orthogonal
init (gain sqrt 2), as CleanRL's Atari PPO. Frames arrive as uint8 [B, C, H, W] (or [B, H, W, C],
gymnasium's usual image layout, moved here), in the ring buffer and in each minibatch; they become
float in [0, 1] here, on the learner's device, per minibatch (a quarter of float32's bytes
everywhere before this line).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ...contracts.spaces import ObsLeaf
from ...policy.encoders.base import LeafEncoder
from ...policy.trunk import TrunkModule

MIN_SIDE = 36  # the smallest frame the three convolutions leave at least 1x1 of


class NatureCNN(TrunkModule):
    """uint8 frames [B, C, H, W] -> features [B, 512]."""

    def __init__(self, obs_shape: tuple[int, ...], hidden: int = 512, channels_last: bool = False) -> None:
        super().__init__()
        self.channels_last = channels_last
        if channels_last:
            obs_shape = (obs_shape[2], obs_shape[0], obs_shape[1])
        channels = obs_shape[0]
        self.convs = nn.Sequential(
            nn.Conv2d(channels, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, *obs_shape)).shape[1]
        self.fc = nn.Sequential(nn.Linear(flat, hidden), nn.ReLU())
        self.out_dim = hidden
        self.checkpointing = False
        for module in self.modules():
            if isinstance(module, nn.Conv2d | nn.Linear):
                nn.init.orthogonal_(module.weight, math.sqrt(2))
                nn.init.zeros_(module.bias)  # type: ignore[arg-type]  # both layers have one

    def _forward(self, x: Tensor) -> Tensor:
        return self.fc(self.convs(x))

    def forward(self, obs: Tensor) -> Tensor:
        x = obs.permute(0, 3, 1, 2) if self.channels_last else obs
        kernel = next(self.convs.parameters())  # the first convolution's [32, C, 8, 8]
        if kernel.is_contiguous(memory_format=torch.channels_last) and not kernel.is_contiguous():
            # A learner that keeps its kernels NHWC (learner.channels_last) gets frames to match:
            # oneDNN/cuDNN then convolve without reordering either.
            x = x.contiguous(memory_format=torch.channels_last)
        # uint8 -> [0, 1], here on the device, one minibatch at a time, in one pass: reordered
        # while still a byte an element, converted straight to the dtype the first convolution
        # computes in (autocast's when on, which casts it there anyway), divided in place (the
        # copy is ours). Measured on a [512, 4, 84, 84] minibatch: 2x faster than converting to
        # float32, dividing, then reordering, and the same numbers.
        if torch.compiler.is_compiling():
            # Under torch.compile the autocast queries break the graph on torch before 2.13 (seen
            # with 2.11 on an H200: a graph break there, then 6 compiles of the resumed frame),
            # and inductor fuses the conversion, the division and autocast's cast into one kernel
            # anyway. The values are the same: uint8 is exact in every float type, and a bf16 or
            # fp16 division is a float32 one rounded to that type, as autocast rounds this one.
            x = x.to(kernel.dtype) / 255.0
        else:
            x = x.to(input_dtype(kernel), copy=True).div_(255.0)
        if self.checkpointing and self.training and torch.is_grad_enabled():
            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)


def input_dtype(weight: Tensor) -> torch.dtype:
    """The dtype a layer with this weight computes in: autocast's where it is on for the weight's
    device, else the weight's own."""
    device = weight.device.type
    # is_autocast_enabled raises for a device type autocast does not know (meta tensors, which
    # relay builds modules on to read their shapes).
    if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return weight.dtype


def image_layout(leaf: ObsLeaf) -> bool | None:
    """For a uint8 3-D Box leaf the Nature CNN can read: whether it is channels-last ([H, W, C]
    with C <= 4); None when it cannot read it (too small, not uint8, not 3-D)."""
    if leaf.kind != "box" or leaf.dtype != "uint8" or len(leaf.shape) != 3:
        return None
    if leaf.shape[2] <= 4 < leaf.shape[0] and min(leaf.shape[:2]) >= MIN_SIDE:
        return True
    return False if min(leaf.shape[1:]) >= MIN_SIDE else None


class CnnEncoder(LeafEncoder):
    numpy_mirror = False

    def problem(self, leaf: ObsLeaf) -> str | None:
        if image_layout(leaf) is None:
            return f"nature_cnn reads uint8 images [C, H, W] or [H, W, C] of at least {MIN_SIDE}x{MIN_SIDE}"
        return None

    def out_dim(self, leaf: ObsLeaf) -> int:
        return 512

    def module(self, leaf: ObsLeaf) -> nn.Module:
        return NatureCNN(leaf.shape, channels_last=bool(image_layout(leaf)))
