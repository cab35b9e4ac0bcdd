"""A stand-in for a Unity ML-Agents PPO policy (the `mlagents` package does not install on this
Python): the same module structure, state-dict key names, normalizer, SiLU body, action clipping
and ONNX input/output names as ML-Agents' exporter produces for the Huggy dog (59 -> 21).
"""

from __future__ import annotations

import io
import warnings

import torch
from torch import nn


class Normalizer(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.register_buffer("normalization_steps", torch.tensor(1))
        self.register_buffer("running_mean", torch.zeros(size))
        self.register_buffer("running_variance", torch.ones(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(
            (x - self.running_mean) / torch.sqrt(self.running_variance / self.normalization_steps), -5, 5
        )


class Processor(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.normalizer = Normalizer(size)


class ObservationEncoder(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.processors = nn.ModuleList([Processor(size)])


class Body(nn.Module):
    def __init__(self, size: int, hidden: int, layers: int) -> None:
        super().__init__()
        mods: list[nn.Module] = []
        for i in range(layers):
            mods += [nn.Linear(size if i == 0 else hidden, hidden), nn.SiLU()]
        self.seq_layers = nn.Sequential(*mods)


class NetworkBody(nn.Module):
    def __init__(self, size: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.observation_encoder = ObservationEncoder(size)
        self._body_endoder = Body(size, hidden, layers)  # sic: ML-Agents' own spelling


class ContinuousDistribution(nn.Module):
    def __init__(self, hidden: int, act: int) -> None:
        super().__init__()
        self.mu = nn.Linear(hidden, act)
        self.log_sigma = nn.Parameter(torch.zeros(1, act))


class ActionModel(nn.Module):
    def __init__(self, hidden: int, act: int) -> None:
        super().__init__()
        self._continuous_distribution = ContinuousDistribution(hidden, act)


class MLAgentsLikePolicy(nn.Module):
    def __init__(self, obs: int = 59, act: int = 21, hidden: int = 512, layers: int = 3) -> None:
        super().__init__()
        self.network_body = NetworkBody(obs, hidden, layers)
        self.action_model = ActionModel(hidden, act)
        self.register_buffer("version_number", torch.tensor([3.0]))
        self.register_buffer("memory_size", torch.tensor([0.0]))
        self.register_buffer("continuous_act_size", torch.tensor([float(act)]))

    def forward(self, obs_0: torch.Tensor):
        x = self.network_body.observation_encoder.processors[0].normalizer(obs_0)
        h = self.network_body._body_endoder.seq_layers(x)
        dist = self.action_model._continuous_distribution
        mu = dist.mu(h)
        sampled = mu + torch.exp(dist.log_sigma) * torch.randn_like(mu)
        return (
            self.version_number,
            self.memory_size,
            torch.clamp(sampled, -3, 3) / 3,
            self.continuous_act_size,
            torch.clamp(mu, -3, 3) / 3,
        )


OUTPUTS = [
    "version_number",
    "memory_size",
    "continuous_actions",
    "continuous_action_output_shape",
    "deterministic_continuous_actions",
]


def randomized(seed: int = 0, **kw) -> MLAgentsLikePolicy:
    """Random weights and non-trivial normalizer statistics (as after training)."""
    torch.manual_seed(seed)
    model = MLAgentsLikePolicy(**kw)
    norm = model.network_body.observation_encoder.processors[0].normalizer
    size = norm.running_mean.shape[0]
    norm.normalization_steps.fill_(20_000)
    norm.running_mean.copy_(torch.randn(size) * 0.5)
    norm.running_variance.copy_((torch.rand(size) + 0.2) * 20_000)
    with torch.no_grad():
        model.action_model._continuous_distribution.log_sigma.fill_(-0.5)
    return model.eval()


def export_opset9(model: MLAgentsLikePolicy) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (
                torch.zeros(
                    1, model.network_body.observation_encoder.processors[0].normalizer.running_mean.shape[0]
                ),
            ),
            buf,
            input_names=["obs_0"],
            output_names=OUTPUTS,
            dynamic_axes={
                "obs_0": {0: "batch"},
                "continuous_actions": {0: "batch"},
                "deterministic_continuous_actions": {0: "batch"},
            },
            opset_version=9,
            do_constant_folding=False,
            dynamo=False,
        )
    return buf.getvalue()
