"""Unity ML-Agents PPO policies (a `.pt` with a `Policy` state dict, or an ONNX export) as relay
ActorCritics, so they can be verified, exported and served on any device.

ML-Agents conventions (e.g. the Huggy dog: 59 obs -> 21 actions, three Swish layers of 512):
optional normalizer `clamp((obs - running_mean) / sqrt(running_variance / normalization_steps),
-5, 5)` with no epsilon, a body of Linear + activation layers, then a Gaussian head (`mu`, a
state-independent `log_sigma`, actions `clamp(a, -3, 3) / 3`) or categorical branches (masked
logits, argmax for the deterministic action).

ONNX exports are read from the graph's structure, never from initializer names: ML-Agents'
exporter constant-folds `sqrt(running_variance / normalization_steps)` into one unnamed tensor,
policies trained without normalization have no normalizer, and discrete policies route masks
through the logits. The graph is recognised by its interface (`obs_0`, `version_number`,
`memory_size`, `deterministic_*_actions`); the path from `obs_0` to the action head is walked
node by node, and anything not a normalizer, a linear layer or a supported activation is refused
in one line. `onnx_import` then cross-checks the result against onnxruntime on the original file.

Recurrent exports (`memory_size` > 0, ML-Agents' `network_settings.memory`) put an LSTM between the
body and the heads, one step per call: the graph reads `recurrent_in` [batch, 1, memory_size] and
writes `recurrent_out`, the memory being [h | c] with h = c = memory_size / 2 units: the layout of
relay's LSTM core state (`h_in`), so the import is that core after the same body.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor

from ...contracts.spaces import ActionSpec, EnvSpec
from ...policy.cores.lstm import LstmCore
from ...policy.models.mlp import mlp_policy
from ...services.tools.handle import PolicyHandle, PolicyLoadError, identity
from ...services.tools.onnx_graph import GraphError, Node, OnnxGraph

MLAGENTS_BODY = re.compile(r"_body_endoder\.seq_layers\.(\d+)\.weight$")
MLAGENTS_BRANCH = re.compile(r"_discrete_distribution\.branches\.(\d+)\.weight$")
INTERFACE = ("version_number", "memory_size")
DETERMINISTIC = {
    "continuous": "deterministic_continuous_actions",
    "discrete": "deterministic_discrete_actions",
}
MASKS_INPUT = "action_masks"
MEMORY_INPUT, MEMORY_OUTPUT = "recurrent_in", "recurrent_out"  # [batch, 1, memory_size]
PASS_THROUGH = ("Identity", "Cast", "Concat", "Flatten", "Reshape")  # single-input, value-preserving
# Around the LSTM the exporter moves the batch and sequence axes (sequence length 1: one step).
SEQUENCE_PASS = (*PASS_THROUGH, "Transpose", "Squeeze", "Unsqueeze")
# ONNX's LSTM gate blocks are (i, o, f, c); torch's (i, f, g, o): torch block k is ONNX block [k].
ONNX_TO_TORCH_GATES = (0, 2, 3, 1)


def mlagents_clip(actions: Tensor) -> Tensor:
    """ML-Agents' action post-processing: clamp(a, -3, 3) / 3."""
    return torch.clamp(actions, -3.0, 3.0) / 3.0


@dataclass
class ImportedMlp:
    """What an ML-Agents policy is, read from a state dict or a graph: enough to build it in relay."""

    obs_dim: int
    action: ActionSpec
    layers: list[tuple[np.ndarray, np.ndarray]]  # body (W [out, in], b [out]), input first
    activation: str
    head: tuple[np.ndarray, np.ndarray]
    log_sigma: np.ndarray | None = None  # [A], continuous only
    normalizer: tuple[np.ndarray, np.ndarray] | None = None  # (mean [obs], std [obs])
    clipped: bool = True  # continuous actions go through clamp(a, -3, 3) / 3
    # An LSTM after the body, in torch's layout: (W_ih [4H, in], W_hh [4H, H], b_ih [4H], b_hh [4H]).
    lstm: tuple[np.ndarray, ...] | None = None
    notes: list[str] = field(default_factory=list)

    def build(self, source: str) -> PolicyHandle:
        lstm = self.lstm
        model = mlp_policy(
            self.obs_dim,
            self.action,
            [w.shape[0] for w, _ in self.layers],
            self.activation,
            critic=False,
            normalize_obs=self.normalizer is not None,
            make_core=None if lstm is None else (lambda in_dim: LstmCore(in_dim, lstm[1].shape[1])),
        )
        try:
            self._copy_into(model, lstm)
        except RuntimeError as err:  # torch's copy_ of a tensor of another shape
            first = next((ln.strip() for ln in str(err).splitlines() if ln.strip()), "")[:160]
            raise PolicyLoadError(f"{source}: layers whose shapes do not fit together ({first})") from None
        env = EnvSpec((self.obs_dim,), self.action)
        transform = mlagents_clip if self.action.floats and self.clipped else identity
        return PolicyHandle(model.eval(), source, env, None, transform)

    def _copy_into(self, model: Any, lstm: tuple[np.ndarray, ...] | None) -> None:
        linears = [m for m in model.pi_trunk.modules() if isinstance(m, torch.nn.Linear)]
        with torch.no_grad():
            for linear, (w, b) in zip(linears, self.layers, strict=True):
                linear.weight.copy_(_tensor(w))
                linear.bias.copy_(_tensor(b))
            model.pi_head.weight.copy_(_tensor(self.head[0]))
            model.pi_head.bias.copy_(_tensor(self.head[1]))
            if lstm is not None:
                cell = cast(LstmCore, model.pi_core).cell
                for param, value in zip(
                    (cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh), lstm, strict=True
                ):
                    param.copy_(_tensor(value))
            if self.log_sigma is not None:
                model.log_std.copy_(_tensor(self.log_sigma).reshape(-1))
            if self.normalizer is not None:
                mean, std = (np.broadcast_to(a, (self.obs_dim,)) for a in self.normalizer)
                model.normalizer.mean.copy_(_tensor(mean))
                # relay keeps (var_sum, steps); the folded graph only has their ratio's root.
                model.normalizer.var_sum.copy_(_tensor(std).double().square().float())
                model.normalizer.steps.fill_(1.0)


def _tensor(value: Any) -> Tensor:
    if torch.is_tensor(value):
        return value.detach().float()
    return torch.from_numpy(np.array(value, dtype=np.float32))


# ---- .pt: a Policy state dict (module names are the format there) ---------------------------------
def _find(sd: dict[str, Any], suffix: str, required: bool = True) -> Any:
    """The one tensor whose name ends in `suffix`. ML-Agents 1.1.0 registers a normalizer under
    two names (`network_body.processors.0` and `...observation_encoder.processors.0`): names
    holding the same values are one tensor."""
    hits = [k for k in sd if k.endswith(suffix)]
    if hits and all(torch.equal(_tensor(sd[k]), _tensor(sd[hits[0]])) for k in hits[1:]):
        return sd[hits[0]]
    if not hits and not required:
        return None
    raise PolicyLoadError(f"expected one tensor named *{suffix}, found {len(hits)}")


def _numbered(sd: dict[str, Any], pattern: re.Pattern[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    found = sorted((int(m.group(1)), k) for k in sd if (m := pattern.search(k)))
    return [
        (_tensor(sd[k]).numpy(), _tensor(_find(sd, k[: -len("weight")] + "bias")).numpy()) for _, k in found
    ]


def mlagents_policy_from_state_dict(sd: dict[str, Any], source: str) -> PolicyHandle:
    """An ML-Agents PPO policy state dict: Swish body, a Gaussian head or one discrete branch,
    with or without a normalizer."""
    layers = _numbered(sd, MLAGENTS_BODY)
    if not layers:
        raise PolicyLoadError(f"{source}: no ML-Agents body layers (*_body_endoder.seq_layers.N.weight)")
    branches = _numbered(sd, MLAGENTS_BRANCH)
    mu_w = _find(sd, "_continuous_distribution.mu.weight", required=not branches)
    if branches and mu_w is not None:
        raise PolicyLoadError(f"{source}: hybrid (continuous + discrete) actions are not supported")
    mean = _find(sd, "normalizer.running_mean", required=False)
    normalizer = None
    if mean is not None:
        var = _tensor(_find(sd, "normalizer.running_variance")).double()
        steps = _tensor(_find(sd, "normalizer.normalization_steps")).double()
        normalizer = (_tensor(mean).numpy(), torch.sqrt(var / steps).float().numpy())
    if branches:
        head, action, log_sigma = _branch_head([(w, b) for w, b in branches]), _branch_action(branches), None
    else:
        head = (_tensor(mu_w).numpy(), _tensor(_find(sd, "_continuous_distribution.mu.bias")).numpy())
        action = ActionSpec("continuous", head[0].shape[0])
        log_sigma = _tensor(_find(sd, "_continuous_distribution.log_sigma")).numpy().reshape(-1)
    imported = ImportedMlp(layers[0][0].shape[1], action, layers, "silu", head, log_sigma, normalizer)
    imported.lstm = _state_dict_lstm(sd, source)
    return imported.build(source)


def _state_dict_lstm(sd: dict[str, Any], source: str) -> tuple[np.ndarray, ...] | None:
    """A recurrent policy's LSTM (`network_body.lstm.lstm`, torch's own layout), or None."""
    if _find(sd, "lstm.weight_ih_l0", required=False) is None:
        if any("lstm." in k for k in sd):
            raise PolicyLoadError(f"{source}: recurrent weights relay does not recognise (lstm.*)")
        return None
    if any(re.search(r"lstm\.weight_ih_l[1-9]", k) for k in sd):
        raise PolicyLoadError(f"{source}: an LSTM of several layers; relay's core has one")
    names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    return tuple(_tensor(_find(sd, f"lstm.{n}_l0")).numpy() for n in names)


# ---- ONNX: the graph's structure ------------------------------------------------------------------
def is_mlagents_graph(graph: OnnxGraph) -> bool:
    """ML-Agents' exporter interface: obs_N inputs, version/memory constants, deterministic actions."""
    outputs = set(graph.outputs)
    return (
        set(INTERFACE) <= outputs
        and any(name in outputs for name in DETERMINISTIC.values())
        and any(name.startswith("obs_") for name in graph.inputs)
    )


def _clip_bounds(graph: OnnxGraph, node: Node) -> tuple[float, float] | None:
    """A Clip's (min, max): attributes up to opset 10, inputs from 11."""
    if "min" in node.attrs or "max" in node.attrs:
        return float(node.attrs.get("min", -np.inf)), float(node.attrs.get("max", np.inf))
    bounds = [graph.const(i) for i in node.inputs[1:3]]
    if len(bounds) == 2 and all(b is not None and b.size == 1 for b in bounds):
        return float(bounds[0]), float(bounds[1])  # type: ignore[arg-type]
    return None


def _linear(graph: OnnxGraph, name: str) -> tuple[str, np.ndarray, np.ndarray] | None:
    """(input, W [out, in], b [out]) when `name` is a linear layer: Gemm, or MatMul (+ Add)."""
    node = graph.producer.get(name)
    if node is None:
        return None
    if node.op == "Gemm" and not node.attrs.get("transA", 0):
        w, b = graph.const(node.inputs[1]), graph.const(node.inputs[2]) if len(node.inputs) > 2 else None
        if w is None:
            return None
        w = (w if node.attrs.get("transB", 0) else w.T) * node.attrs.get("alpha", 1.0)
        bias = (
            np.zeros(w.shape[0])
            if b is None
            else np.broadcast_to(b * node.attrs.get("beta", 1.0), w.shape[:1])
        )
        return node.inputs[0], w, bias
    bias = np.zeros(0)
    if node.op == "Add" and (split := graph.split(node)) is not None:
        name, bias = split
        node = graph.producer.get(name)
    if node is not None and node.op == "MatMul" and (split := graph.split(node)) is not None:
        x, w = split
        if node.inputs[1] != x and w.ndim == 2:
            return x, w.T, (np.broadcast_to(bias, w.shape[1:]) if bias.size else np.zeros(w.shape[1]))
    return None


def _activation(graph: OnnxGraph, name: str) -> tuple[str, str] | None:
    """(input, relay activation name) when `name` is a supported activation's output."""
    node = graph.producer.get(name)
    if node is None:
        return None
    if node.op in ("Relu", "Tanh"):
        return node.inputs[0], node.op.lower()
    if node.op == "Mul" and len(node.inputs) == 2:  # Swish: x * sigmoid(x)
        for a, b in (node.inputs, node.inputs[::-1]):
            gate = graph.producer.get(b)
            if gate is not None and gate.op == "Sigmoid" and gate.inputs[0] == a:
                return a, "silu"
    return None


def _normalizer(graph: OnnxGraph, name: str, obs: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(mean, std) when `name` is clamp((obs - mean) / std, -5, 5) with constant mean and std."""
    clip = graph.producer.get(name)
    if clip is None or clip.op != "Clip" or _clip_bounds(graph, clip) != (-5.0, 5.0):
        return None
    div = graph.producer.get(clip.inputs[0])
    if div is None or div.op != "Div" or (std := graph.const(div.inputs[1])) is None:
        return None
    sub = graph.producer.get(div.inputs[0])
    if sub is None or sub.op != "Sub" or sub.inputs[0] != obs or (mean := graph.const(sub.inputs[1])) is None:
        return None
    return mean.reshape(-1), std.reshape(-1)


def _skip_pass_through(graph: OnnxGraph, name: str, ops: tuple[str, ...] = PASS_THROUGH) -> str:
    while (node := graph.producer.get(name)) is not None and node.op in ops:
        live = [i for i in node.inputs if i and graph.const(i) is None]
        if len(live) != 1:
            break
        name = live[0]
    return name


def _body(graph: OnnxGraph, head_input: str, obs: str, into: ImportedMlp) -> None:
    """Walk from the head's input back to `obs`: activation, linear, ..., [normalizer]."""
    t, layers, kinds = head_input, [], []
    while True:
        t = _skip_pass_through(graph, t)
        if t == obs:
            break
        if (norm := _normalizer(graph, t, obs)) is not None:
            into.normalizer = norm
            break
        act = _activation(graph, t)
        lin = _linear(graph, act[0]) if act is not None else None
        if act is None or lin is None:
            op = graph.producer[t].op if t in graph.producer else "an input"
            raise GraphError(f"{op} on the path from {obs} to the action head (expected Linear + activation)")
        kinds.append(act[1])
        layers.append(lin[1:])
        t = lin[0]
    if len(set(kinds)) > 1:
        raise GraphError(f"mixed activations {sorted(set(kinds))} in the body")
    into.layers = layers[::-1]
    into.activation = kinds[0] if kinds else "silu"
    if into.layers and into.layers[0][0].shape[1] != into.obs_dim:
        raise GraphError(
            f"the first layer reads {into.layers[0][0].shape[1]} values, {obs} has {into.obs_dim}"
        )


def _head(graph: OnnxGraph, name: str, obs: str, masks: str | None) -> tuple[str, np.ndarray, np.ndarray]:
    """The action head's linear layer under `name`, past masking and softmax (which keep argmax)."""
    t = _skip_pass_through(graph, name)
    while (lin := _linear(graph, t)) is None or not graph.depends_on(lin[0], obs):
        node = graph.producer.get(t)
        live = [i for i in (node.inputs if node else ()) if i and graph.depends_on(i, obs)]
        if (
            node is None
            or node.op not in ("Softmax", "Log", "Mul", "Sub", "Add", "Div", *PASS_THROUGH)
            or len(live) != 1
        ):
            raise GraphError(f"{node.op if node else t} between the action head and the actions")
        rest = [i for i in node.inputs if i and i != live[0]]
        if any(graph.const(i) is None and not (masks and graph.depends_on(i, masks)) for i in rest):
            raise GraphError(f"{node.op} mixes the logits with something other than the action masks")
        t = live[0]
    return lin


def _continuous(graph: OnnxGraph, obs: str, into: ImportedMlp) -> str:
    """Fill the Gaussian head; return the head's input tensor."""
    t = _skip_pass_through(graph, DETERMINISTIC["continuous"])
    node = graph.producer.get(t)
    if node is not None and node.op == "Div" and (split := graph.split(node)) and np.all(split[1] == 3):
        clip = graph.producer.get(split[0])
        if clip is None or clip.op != "Clip" or _clip_bounds(graph, clip) != (-3.0, 3.0):
            raise GraphError("deterministic_continuous_actions is x / 3 without clamp(x, -3, 3)")
        t, into.clipped = clip.inputs[0], True
    else:
        into.clipped = False
    lin = _linear(graph, _skip_pass_through(graph, t))
    if lin is None:
        op = graph.producer[t].op if t in graph.producer else t
        raise GraphError(f"{op} before deterministic_continuous_actions (expected the mu layer)")
    into.head = (lin[1], lin[2])
    into.action = ActionSpec("continuous", lin[1].shape[0])
    into.log_sigma = _log_sigma(graph, lin[1].shape[0])
    return lin[0]


def _log_sigma(graph: OnnxGraph, size: int) -> np.ndarray:
    """The Gaussian's log std from the sampled path: exp(mu * 0 + log_sigma) (or exp(log_sigma))."""
    if "continuous_actions" not in graph.outputs:
        raise GraphError("no continuous_actions output to read the policy's sigma from")
    found = []
    for node in graph.upstream_ops("continuous_actions"):
        if node.op != "Exp":
            continue
        arg = graph.const(node.inputs[0])
        add = graph.producer.get(node.inputs[0])
        if arg is None and add is not None and add.op == "Add" and (split := graph.split(add)):
            zero = graph.producer.get(split[0])
            if zero is not None and zero.op == "Mul" and (z := graph.split(zero)) and not np.any(z[1]):
                arg = split[1]
        if arg is None:
            raise GraphError("a state-dependent sigma (conditional_sigma) is not supported")
        found.append(np.broadcast_to(arg, (1, size)).reshape(-1))
    if len(found) != 1:
        raise GraphError(f"expected one exp(log_sigma) on the sampled path, found {len(found)}")
    return found[0]


def _branch_head(heads: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """ML-Agents' branches (a Linear each, all on the body's output) as one head: their rows stacked
    in branch order, which is how relay's MultiDiscrete logits are laid out."""
    return np.concatenate([w for w, _ in heads]), np.concatenate([b for _, b in heads])


def _branch_action(heads: list[tuple[np.ndarray, np.ndarray]]) -> ActionSpec:
    sizes = tuple(int(w.shape[0]) for w, _ in heads)
    if len(sizes) == 1:
        return ActionSpec("discrete", sizes[0])
    return ActionSpec("multi_discrete", sum(sizes), nvec=sizes)


def _branch_argmaxes(graph: OnnxGraph, t: str) -> list[Node]:
    """The ArgMax of each branch, in the order the deterministic actions concatenate them."""
    node = graph.producer.get(t)
    inputs = node.inputs if node is not None and node.op == "Concat" else [t]
    found = []
    for name in inputs:
        argmax = graph.producer.get(_skip_pass_through(graph, name))
        if argmax is None or argmax.op != "ArgMax":
            raise GraphError("deterministic_discrete_actions is not argmaxes over logits")
        found.append(argmax)
    return found


def _discrete(graph: OnnxGraph, obs: str, masks: str | None, into: ImportedMlp) -> str:
    """Fill the categorical head (one branch, or several: a MultiDiscrete head); return the head's
    input tensor (every branch reads the same one)."""
    t = _skip_pass_through(graph, DETERMINISTIC["discrete"])
    if graph.producer.get(t) is None:
        raise GraphError("deterministic_discrete_actions is not an argmax over logits")
    heads = [_head(graph, argmax.inputs[0], obs, masks) for argmax in _branch_argmaxes(graph, t)]
    if len({x for x, _, _ in heads}) != 1:
        raise GraphError("the discrete branches read different layers; relay's heads share one body")
    into.head = _branch_head([(w, b) for _, w, b in heads])
    into.action = _branch_action([(w, b) for _, w, b in heads])
    return heads[0][0]


def _memory_size(graph: OnnxGraph) -> int:
    """The export's memory_size constant (0: no memory), checked against its memory input."""
    value = graph.const("memory_size")
    memory = 0 if value is None or not value.size else int(np.asarray(value).reshape(-1)[0])
    has_input = MEMORY_INPUT in graph.inputs
    if memory < 0 or memory % 2 or (memory > 0) != has_input:
        raise GraphError(f"memory_size {memory} does not match the graph's {MEMORY_INPUT} input")
    if memory and graph.input_shapes.get(MEMORY_INPUT, ())[1:] != (1, memory):
        shape = list(graph.input_shapes.get(MEMORY_INPUT, ()))
        raise GraphError(f"{MEMORY_INPUT} has shape {shape}; expected [batch, 1, {memory}] (one step a call)")
    if memory and MEMORY_OUTPUT not in graph.outputs:
        raise GraphError(f"memory_size {memory} without a {MEMORY_OUTPUT} output")
    return memory


def _lstm(graph: OnnxGraph, head_input: str, memory: int, into: ImportedMlp) -> str:
    """Fill the LSTM between the body and the heads from the ONNX LSTM node under `head_input`;
    return the LSTM's input (the body's output)."""
    t = _skip_pass_through(graph, head_input, SEQUENCE_PASS)
    node = graph.producer.get(t)
    if node is None or node.op != "LSTM" or node.outputs[0] != t:
        op = node.op if node is not None else "an input"
        raise GraphError(f"memory_size {memory} but {op} before the action head (expected an LSTM)")
    attrs = {k: v for k, v in node.attrs.items() if k not in ("hidden_size",)}
    plain = {"direction": b"forward", "input_forget": 0, "layout": 0}
    if any(k not in plain or plain[k] != v for k, v in attrs.items()):
        raise GraphError(f"an LSTM with {sorted(attrs)} set; relay's core is a plain forward LSTM")
    ins = (*node.inputs, *[""] * 8)[:8]
    if ins[4] or ins[7]:
        raise GraphError("an LSTM with sequence lengths or peepholes; relay's core has neither")
    w, r, b = (graph.const(i) if i else None for i in ins[1:4])
    hidden = memory // 2
    if (
        w is None
        or r is None
        or w.ndim != 3
        or w.shape[:2] != (1, 4 * hidden)
        or r.shape != (1, 4 * hidden, hidden)
    ):
        raise GraphError(f"the LSTM's weights are not constants for {hidden} units (memory_size {memory})")
    b = np.zeros((1, 8 * hidden), np.float32) if b is None else b
    if b.shape != (1, 8 * hidden):
        raise GraphError(f"the LSTM's bias has shape {list(b.shape)}; expected [1, {8 * hidden}]")
    if not all(graph.depends_on(i, MEMORY_INPUT) for i in ins[5:7]):
        raise GraphError(f"the LSTM's initial state is not read from {MEMORY_INPUT}")

    def torch_order(x: np.ndarray) -> np.ndarray:
        return np.concatenate([x[k * hidden : (k + 1) * hidden] for k in ONNX_TO_TORCH_GATES])

    into.lstm = (
        torch_order(w[0]),
        torch_order(r[0]),
        torch_order(b[0, : 4 * hidden]),
        torch_order(b[0, 4 * hidden :]),
    )
    return _skip_pass_through(graph, ins[0], SEQUENCE_PASS)


def mlagents_policy_from_graph(graph: OnnxGraph, source: str) -> PolicyHandle:
    """An ML-Agents ONNX export (one vector observation; memory or none) as a relay policy."""
    obs_inputs = sorted(i for i in graph.inputs if i.startswith("obs_"))
    extra = [i for i in graph.inputs if i not in (*obs_inputs, MASKS_INPUT, MEMORY_INPUT)]
    try:
        if len(obs_inputs) != 1:
            raise GraphError(f"{len(obs_inputs)} observation inputs; relay imports one vector observation")
        if extra:
            raise GraphError(f"inputs {extra} are not supported")
        obs = obs_inputs[0]
        shape = graph.input_shapes.get(obs, ())
        if len(shape) != 2 or shape[1] is None:
            raise GraphError(f"{obs} has shape {list(shape)}; relay imports vector observations [batch, n]")
        memory = _memory_size(graph)
        kinds = [k for k, name in DETERMINISTIC.items() if name in graph.outputs]
        if len(kinds) != 1:
            raise GraphError("hybrid (continuous + discrete) actions are not supported")
        into = ImportedMlp(
            int(shape[1]), ActionSpec(cast(Any, kinds[0]), 1), [], "silu", (np.zeros(0), np.zeros(0))
        )
        masks = MASKS_INPUT if MASKS_INPUT in graph.inputs else None
        head_input = (
            _continuous(graph, obs, into) if kinds[0] == "continuous" else _discrete(graph, obs, masks, into)
        )
        if memory:
            head_input = _lstm(graph, head_input, memory, into)
        _body(graph, head_input, obs, into)
        return into.build(source)
    except GraphError as err:
        raise PolicyLoadError(f"{source}: {err}") from None
