"""The numpy acting path against the torch policy it mirrors (the reference)."""

import pytest
import torch

from relay_rl.contracts.spaces import ActionSpec
from relay_rl.policy.actor_critic import draw_noise
from relay_rl.policy.models.mlp import mlp_policy
from relay_rl.policy.numpy_mirror import NumpyPolicy


@pytest.mark.parametrize("kind", ["discrete", "continuous"])
@pytest.mark.parametrize("activation", ["tanh", "relu", "silu"])
@pytest.mark.parametrize("shared, normalize", [(False, True), (True, False)])
def test_numpy_forward_matches_torch(kind, activation, shared, normalize):
    torch.manual_seed(0)
    action = ActionSpec(kind, 3)
    model = mlp_policy(
        6,
        action,
        [32, 16],
        activation=activation,
        shared_trunk=shared,
        normalize_obs=normalize,
        init_log_std=-0.3,
    )
    with torch.no_grad():
        model.normalizer.mean.copy_(torch.randn(6))
        model.normalizer.var_sum.copy_(torch.rand(6) * 50 + 1)
        model.normalizer.steps.fill_(25.0)
        model.pi_head.weight.mul_(100)  # peaked distributions, not near-uniform
    fast = NumpyPolicy(action, activation, shared, normalize)
    fast.load(model.state_dict())
    gen = torch.Generator().manual_seed(1)
    obs = torch.randn(512, 6, generator=gen) * 3
    noise = draw_noise(action, 512, gen)
    a_ref, logp_ref, v_ref = model.act(obs, noise)
    a, logp, v, _ = fast.act(obs.numpy(), noise.numpy())
    if kind == "discrete":
        assert (torch.from_numpy(a) == a_ref).float().mean() >= 0.998  # a u on a CDF edge may round apart
        same = torch.from_numpy(a) == a_ref
        torch.testing.assert_close(torch.from_numpy(logp)[same], logp_ref[same], atol=1e-5, rtol=1e-5)
    else:
        torch.testing.assert_close(torch.from_numpy(a), a_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(torch.from_numpy(logp), logp_ref, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(torch.from_numpy(v), v_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        torch.from_numpy(fast.value(obs.numpy())), model.value(obs), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("kind", ["discrete", "continuous"])
def test_critic_free_mirror_matches_torch(kind):
    """GRPO's policy has no value network: the mirror's actions and log-probs still match torch's,
    and its values are exactly zero."""
    torch.manual_seed(0)
    model = mlp_policy(4, ActionSpec(kind, 3), [16, 8], "silu", critic=False)
    with torch.no_grad():
        model.pi_head.weight.mul_(50)
    fast = NumpyPolicy(model.action, "silu", False, True)
    fast.load(model.state_dict())
    gen = torch.Generator().manual_seed(2)
    obs = torch.randn(256, 4, generator=gen)
    noise = draw_noise(model.action, 256, gen)
    a_ref, logp_ref, _ = model.act(obs, noise)
    a, logp, v, _ = fast.act(obs.numpy(), noise.numpy())
    if kind == "discrete":
        same = torch.from_numpy(a) == a_ref
        assert same.float().mean() >= 0.99
    else:
        same = torch.ones(256, dtype=torch.bool)
        torch.testing.assert_close(torch.from_numpy(a), a_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.from_numpy(logp)[same], logp_ref[same], atol=1e-4, rtol=1e-5)
    assert (v == 0).all() and (fast.value(obs.numpy()) == 0).all()


def test_the_mirror_reads_no_state_dict_key_names():
    """#59: each component reads its own part of the state dict (the trunk its layers, the
    normalizer its statistics, the core its cell, ActorCritic its children), so the acting mirror
    holds no key name: not a whole key, nor a part of one, of any policy it mirrors (an LSTM core,
    a centralized critic's global normalizer and learned log-std included)."""
    import ast
    from pathlib import Path

    from relay_rl.contracts.config import build_config
    from relay_rl.contracts.spaces import EnvSpec
    from relay_rl.policy import numpy_mirror
    from relay_rl.policy.models import build_policy
    from relay_rl.policy.models.mlp import Trunk

    cfg = build_config({"model": {"recurrent": "lstm", "shared_trunk": False}})
    keys = set(build_policy(cfg, EnvSpec((3,), ActionSpec("continuous", 2)), critic=True).state_dict())
    critic = mlp_policy(
        4, ActionSpec("discrete", 3), [8], global_state=2, make_value_trunk=lambda: Trunk(6, [8], "tanh")
    )
    keys |= set(critic.state_dict())
    # every run of a key's dotted components: "pi_core.cell.weight_hh" gives "cell.weight_hh" too
    runs = [key.split(".") for key in keys]
    parts = {".".join(c[i:j]) for c in runs for i in range(len(c)) for j in range(i + 1, len(c) + 1)}
    parts -= {str(i) for i in range(10)}
    assert {
        "pi_trunk",
        "v_head",
        "normalizer",
        "global_normalizer",
        "pi_core",
        "log_std",
        "weight_hh",
    } <= parts
    tree = ast.parse(Path(numpy_mirror.__file__).read_text())
    named = {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in parts
    }
    assert named == set(), named
