"""A stand-in for Unity ML-Agents PPO policies (the `mlagents` package does not install on this
Python): the same module structure and state-dict names, normalizer formula, Swish body
(`x * sigmoid(x)`), Gaussian head (`log_sigma = mu * 0 + log_sigma`, actions clamp(a, -3, 3) / 3),
masked categorical branches (`logits * mask - 1e8 * (1 - mask)`, argmax/multinomial of the
softmax) and ONNX interface as ML-Agents' exporter produces (opset 9, `do_constant_folding=True`,
which folds sqrt(running_variance / normalization_steps) into one unnamed tensor).

Shapes: `randomized()` is the Huggy dog (59 obs -> 21 continuous actions, three layers of 512);
`randomized(normalize=False)` has no normalizer; `randomized(branches=(5,))` is discrete.
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
    def __init__(self, size: int, normalize: bool) -> None:
        super().__init__()
        self.normalizer = Normalizer(size) if normalize else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.normalizer(x) if self.normalizer is not None else x


class ObservationEncoder(nn.Module):
    def __init__(self, size: int, normalize: bool) -> None:
        super().__init__()
        self.processors = nn.ModuleList([Processor(size, normalize)])


class Swish(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mul(x, torch.sigmoid(x))


class Body(nn.Module):
    def __init__(self, size: int, hidden: int, layers: int) -> None:
        super().__init__()
        mods: list[nn.Module] = []
        for i in range(layers):
            mods += [nn.Linear(size if i == 0 else hidden, hidden), Swish()]
        self.seq_layers = nn.Sequential(*mods)


class NetworkBody(nn.Module):
    def __init__(self, size: int, hidden: int, layers: int, normalize: bool) -> None:
        super().__init__()
        self.observation_encoder = ObservationEncoder(size, normalize)
        self._body_endoder = Body(size, hidden, layers)  # sic: ML-Agents' own spelling


class ContinuousDistribution(nn.Module):
    def __init__(self, hidden: int, act: int) -> None:
        super().__init__()
        self.mu = nn.Linear(hidden, act)
        self.log_sigma = nn.Parameter(torch.zeros(1, act))


class DiscreteDistribution(nn.Module):
    def __init__(self, hidden: int, branches: tuple[int, ...]) -> None:
        super().__init__()
        self.branches = nn.ModuleList([nn.Linear(hidden, n) for n in branches])
        self.sizes = branches


class ActionModel(nn.Module):
    def __init__(self, hidden: int, act: int, branches: tuple[int, ...]) -> None:
        super().__init__()
        if branches:
            self._discrete_distribution = DiscreteDistribution(hidden, branches)
        else:
            self._continuous_distribution = ContinuousDistribution(hidden, act)


class MLAgentsLikePolicy(nn.Module):
    def __init__(
        self,
        obs: int = 59,
        act: int = 21,
        hidden: int = 512,
        layers: int = 3,
        normalize: bool = True,
        branches: tuple[int, ...] = (),
    ) -> None:
        super().__init__()
        self.obs_size, self.branches = obs, branches
        self.network_body = NetworkBody(obs, hidden, layers, normalize)
        self.action_model = ActionModel(hidden, act, branches)
        self.register_buffer("version_number", torch.tensor([3.0]))
        self.register_buffer("memory_size", torch.tensor([0.0]))
        self.register_buffer(
            "act_size", torch.tensor([float(act)] if not branches else [float(b) for b in branches])
        )

    @property
    def normalizer(self) -> Normalizer | None:
        return self.network_body.observation_encoder.processors[0].normalizer

    def encode(self, obs_0: torch.Tensor) -> torch.Tensor:
        x = self.network_body.observation_encoder.processors[0](obs_0)
        return self.network_body._body_endoder.seq_layers(x)

    def forward(self, obs_0: torch.Tensor, action_masks: torch.Tensor | None = None):
        h = self.encode(obs_0)
        if self.branches:
            return (self.version_number, self.memory_size, *self._discrete(h, action_masks))
        dist = self.action_model._continuous_distribution
        mu = dist.mu(h)
        log_sigma = mu * 0 + dist.log_sigma  # ML-Agents' broadcast of a state-independent sigma
        sampled = mu + torch.randn_like(mu) * torch.exp(log_sigma)
        return (
            self.version_number,
            self.memory_size,
            torch.clamp(sampled, -3, 3) / 3,
            self.act_size,
            torch.clamp(mu, -3, 3) / 3,
        )

    def _discrete(self, h: torch.Tensor, masks: torch.Tensor) -> tuple[torch.Tensor, ...]:
        sampled, greedy, start = [], [], 0
        dist = self.action_model._discrete_distribution
        for branch, size in zip(dist.branches, dist.sizes, strict=True):
            allow = masks[:, start : start + size]
            start += size
            logits = branch(h) * allow - 1e8 * (-1.0 * allow + 1.0)
            probs = torch.softmax(logits, dim=-1)
            sampled.append(torch.multinomial(probs, 1))
            greedy.append(torch.argmax(probs, dim=1, keepdim=True))
        return torch.cat(sampled, dim=1), self.act_size, torch.cat(greedy, dim=1)

    def deterministic(self, obs: torch.Tensor) -> torch.Tensor:
        """What `deterministic_*_actions` holds, masks all ones."""
        if self.branches:
            return self(obs, torch.ones(len(obs), sum(self.branches)))[4]
        return self(obs)[4]


def outputs(model: MLAgentsLikePolicy) -> list[str]:
    kind = "discrete" if model.branches else "continuous"
    return [
        "version_number",
        "memory_size",
        f"{kind}_actions",
        f"{kind}_action_output_shape",
        f"deterministic_{kind}_actions",
    ]


def randomized(seed: int = 0, **kw) -> MLAgentsLikePolicy:
    """Random weights and non-trivial normalizer statistics (as after training)."""
    torch.manual_seed(seed)
    model = MLAgentsLikePolicy(**kw)
    norm = model.normalizer
    if norm is not None:
        size = norm.running_mean.shape[0]
        norm.normalization_steps.fill_(20_000)
        norm.running_mean.copy_(torch.randn(size) * 0.5)
        norm.running_variance.copy_((torch.rand(size) + 0.2) * 20_000)
    if not model.branches:
        with torch.no_grad():
            model.action_model._continuous_distribution.log_sigma.fill_(-0.5)
    return model.eval()


def export_opset9(model: MLAgentsLikePolicy, fold: bool = True) -> bytes:
    """The ONNX file ML-Agents' exporter writes (opset 9; constant folding on, as it leaves it)."""
    buf = io.BytesIO()
    args: tuple[torch.Tensor, ...] = (torch.zeros(1, model.obs_size),)
    names = ["obs_0"]
    if model.branches:
        args, names = (*args, torch.ones(1, sum(model.branches))), [*names, "action_masks"]
    outs = outputs(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            args,
            buf,
            input_names=names,
            output_names=outs,
            dynamic_axes={name: {0: "batch"} for name in [*names, outs[2], outs[4]]},
            opset_version=9,
            do_constant_folding=fold,
            dynamo=False,
        )
    return buf.getvalue()
