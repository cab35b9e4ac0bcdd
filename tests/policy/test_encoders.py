"""Observation encoders: the rule that picks one per leaf, the overrides, each encoder's numpy
mirror against its torch module, and a whole tree policy's numpy acting mirror (encoders, masks,
every action kind) against the torch policy it mirrors."""

import numpy as np
import pytest
import torch

from relay_rl.contracts.config import build_config
from relay_rl.contracts.spaces import ActionSpec, EnvSpec, ObsLeaf
from relay_rl.policy.actor_critic import draw_noise
from relay_rl.policy.encoders import ENCODERS, encoder_plan
from relay_rl.policy.models import build_policy
from relay_rl.policy.numpy_mirror import NumpyPolicy, TorchCpuPolicy, cpu_policy

LEAVES = (
    ObsLeaf("pos", "box", (3,), "float32", -1.0, 1.0),
    ObsLeaf("cell", "discrete", (), "int64", 0, 4, nvec=(5,)),
    ObsLeaf("grid", "multi_discrete", (2,), "int64", nvec=(3, 4)),
    ObsLeaf("bits", "multi_binary", (4,), "int8", 0, 1),
    ObsLeaf("small_image", "box", (5, 5, 3), "uint8", 0, 255),
)
ACTIONS = {
    "discrete": ActionSpec("discrete", 6),
    "multi_discrete": ActionSpec("multi_discrete", 7, nvec=(3, 4)),
    "multi_binary": ActionSpec("multi_binary", 3),
    "continuous": ActionSpec("continuous", 4, env_shape=(2, 2)),
}


def _fields(batch, gen, leaves=LEAVES, mask_size=None):
    out = {}
    for leaf in leaves:
        if leaf.kind == "box" and leaf.dtype == "uint8":
            out[leaf.field] = torch.randint(0, 256, (batch, *leaf.shape), generator=gen, dtype=torch.uint8)
        elif leaf.kind == "box":
            out[leaf.field] = torch.randn(batch, *leaf.shape, generator=gen) * 2
        elif leaf.kind == "multi_binary":
            out[leaf.field] = torch.randint(0, 2, (batch, *leaf.shape), generator=gen, dtype=torch.uint8)
        else:
            top = torch.tensor(leaf.nvec).reshape(leaf.shape) if leaf.shape else leaf.nvec[0]
            out[leaf.field] = (torch.rand(batch, *leaf.shape, generator=gen) * top).long()
    if mask_size:
        out["action_mask"] = torch.rand(batch, mask_size, generator=gen) < 0.6
    return out


def test_the_rule_picks_an_encoder_per_leaf():
    image = ObsLeaf("image", "box", (84, 84, 3), "uint8", 0, 255)
    planes = ObsLeaf("frames", "box", (4, 84, 84), "uint8", 0, 255)
    spec = EnvSpec((), ActionSpec("discrete", 2), leaves=(*LEAVES, image, planes))
    plan = dict((leaf.path, name) for leaf, name in encoder_plan(spec, {}).leaves)
    assert plan == {
        "pos": "flat",
        "cell": "one_hot",
        "grid": "one_hot",
        "bits": "binary",
        "small_image": "flat",  # 5x5 is too small for the Nature CNN: flattened, normalized
        "image": "nature_cnn",
        "frames": "nature_cnn",
    }
    assert encoder_plan(spec, {}).flat_dim == 3 + 75
    assert encoder_plan(spec, {"pos": "binary"}).flat_dim == 75  # pos as it is, not normalized
    with pytest.raises(ValueError, match="flat reads Box leaves"):
        encoder_plan(spec, {"bits": "flat"})
    with pytest.raises(ValueError, match="not a leaf"):
        encoder_plan(spec, {"nope": "flat"})
    with pytest.raises(ValueError, match="not an encoder"):
        encoder_plan(spec, {"pos": "lstm"})
    with pytest.raises(ValueError, match="nature_cnn reads uint8 images"):
        encoder_plan(spec, {"small_image": "nature_cnn"})


@pytest.mark.parametrize(
    "name, leaf",
    [("one_hot", LEAVES[1]), ("one_hot", LEAVES[2]), ("binary", LEAVES[3]), ("minigrid", LEAVES[4])],
)
def test_each_encoders_numpy_mirror_matches_its_module(name, leaf):
    gen = torch.Generator().manual_seed(0)
    x = _fields(64, gen, (leaf,))[leaf.field]
    encoder = ENCODERS[name]
    want = encoder.module(leaf)(x)
    got = encoder.np_encode(leaf, x.numpy())
    assert want.shape == (64, encoder.out_dim(leaf))
    np.testing.assert_array_equal(got, want.numpy())
    if name == "one_hot":
        assert (want.sum(-1) == (len(leaf.nvec))).all()
    if name == "minigrid":  # one id of each kind per cell, ids past MiniGrid's clamped (x is 0-255)
        assert (want.sum(-1) == leaf.numbers).all()


def test_the_minigrid_encoder_one_hots_each_cells_object_colour_and_state():
    """Its sizes are minigrid's constants (written out in the policy layer, which imports no env
    package), and a real MiniGrid view encodes to one block per id, in the view's C order."""
    import gymnasium as gym
    from minigrid.core.constants import COLOR_TO_IDX, OBJECT_TO_IDX, STATE_TO_IDX

    from relay_rl.policy.encoders.minigrid import CELL_IDS
    from relay_rl.rollout_workers.envs import env_spec

    assert (len(OBJECT_TO_IDX), len(COLOR_TO_IDX), len(STATE_TO_IDX)) == CELL_IDS
    env = gym.make("MiniGrid-MemoryS7-v0")
    spec = env_spec(env.observation_space, env.action_space)
    plan = dict((leaf.path, name) for leaf, name in encoder_plan(spec, {"image": "minigrid"}).leaves)
    assert plan == {"direction": "one_hot", "image": "minigrid"}
    leaf = next(leaf for leaf in spec.obs_leaves if leaf.path == "image")
    obs, _ = env.reset(seed=3)
    view = obs["image"][None]
    got = ENCODERS["minigrid"].np_encode(leaf, view).reshape(7 * 7, sum(CELL_IDS))
    cells = view.reshape(7 * 7, 3)
    offsets = np.cumsum((0, *CELL_IDS[:-1]))
    assert (np.flatnonzero(got[5]) == cells[5] + offsets).all()  # cell 5's object, colour, state
    assert got.sum() == 7 * 7 * 3
    with pytest.raises(ValueError, match="minigrid reads MiniGrid's symbolic view"):
        encoder_plan(spec, {"direction": "minigrid"})


@pytest.mark.parametrize("kind", sorted(ACTIONS))
@pytest.mark.parametrize("critic", [True, False])
def test_a_tree_policys_numpy_mirror_matches_torch(kind, critic):
    action = ACTIONS[kind]
    spec = EnvSpec((), action, leaves=LEAVES, action_mask="obs:action_mask" if action.maskable else None)
    cfg = build_config({}, ["model.hidden_sizes=[32,16]", "model.init_log_std=-0.5"])
    torch.manual_seed(0)
    model = build_policy(cfg, spec, critic=critic)
    with torch.no_grad():
        model.normalizer.mean.copy_(torch.randn(model.normalizer.mean.shape))
        model.normalizer.var_sum.copy_(torch.rand(model.normalizer.mean.shape) * 50 + 1)
        model.normalizer.steps.fill_(25.0)
        model.pi_head.weight.mul_(30)
    fast = cpu_policy(cfg.model, model)
    assert isinstance(fast, NumpyPolicy)
    gen = torch.Generator().manual_seed(1)
    fields = _fields(256, gen, mask_size=action.param_size if action.maskable else None)
    noise = draw_noise(action, 256, gen)
    a_ref, logp_ref, v_ref = model.act(fields, noise)
    a, logp, v, _ = fast.act({k: t.numpy() for k, t in fields.items()}, noise.numpy())
    assert a.shape == tuple(a_ref.shape)
    if kind == "continuous":
        torch.testing.assert_close(torch.from_numpy(a), a_ref, atol=1e-5, rtol=1e-5)
        same = torch.ones(256, dtype=torch.bool)
    else:
        same = (torch.from_numpy(a) == a_ref).reshape(256, -1).all(-1)
        assert same.float().mean() >= 0.99  # a u on a CDF edge may round apart
    torch.testing.assert_close(torch.from_numpy(logp)[same], logp_ref[same], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.from_numpy(v), v_ref, atol=1e-5, rtol=1e-5)
    if action.maskable:
        mask = fields["action_mask"]
        offsets = np.cumsum((0, *(action.nvec or (action.size,))))[:-1]
        cols = a.reshape(256, -1) + offsets
        open_rows = mask.numpy()
        allowed = np.take_along_axis(open_rows, cols, axis=1)
        row_any = [
            open_rows[:, lo : lo + n].any(1)
            for lo, n in zip(offsets, action.nvec or (action.size,), strict=True)
        ]
        assert (allowed | ~np.stack(row_any, 1)).all(), "a masked action was sampled"


def test_an_image_leaf_acts_through_torch():
    image = ObsLeaf("image", "box", (3, 40, 40), "uint8", 0, 255)
    spec = EnvSpec((), ActionSpec("discrete", 3), leaves=(LEAVES[0], image))
    cfg = build_config({}, [])
    policy = cpu_policy(cfg.model, build_policy(cfg, spec, critic=True))
    assert isinstance(policy, TorchCpuPolicy)
    fields = _fields(8, torch.Generator().manual_seed(0), (LEAVES[0], image))
    actions, logp, value, _ = policy.act(
        {k: t.numpy() for k, t in fields.items()}, np.full(8, 0.5, np.float32)
    )
    assert actions.shape == (8,) and np.isfinite(logp).all() and np.isfinite(value).all()
