"""Recurrent cores: the learner's replay of a segment (stored initial state, resets at episode
starts by masks) reproduces exactly what the rollout worker computed step by step, across segment
boundaries and episode ends; config rules; the cores' sequence equals their steps."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relay_rl.contracts.config import ConfigError, load_config
from relay_rl.learner.algorithms import algorithm_traits
from relay_rl.learner.algorithms.base import evaluate_in_chunks, policy_inputs
from relay_rl.learner.device import DeviceContext, resolve_device
from relay_rl.learner.learner import time_major
from relay_rl.policy.cores import CORES
from relay_rl.policy.models import build_policy
from relay_rl.rollout_workers.sampler import make_sampler
from relay_rl.services.driver.preflight import check_config

RECURRENT = ["learner.minibatch=sequences", "rollout.num_workers=0", "learner.buffer_size=512"]


def recurrent_cfg(core: str, *more: str):
    return load_config(
        "configs/cartpole_ppo.yaml", [f"model.recurrent={core}", "model.recurrent_size=8", *RECURRENT, *more]
    )


@pytest.mark.parametrize("post", [0, 6])
@pytest.mark.parametrize("core", sorted(CORES))
def test_a_cores_sequence_is_its_steps_with_resets(core, post):
    """With an output layer (model.post_core_size) too: applied once over the sequence, it gives
    what it gives step by step."""
    torch.manual_seed(0)
    cell = CORES[core](5, 8, post)
    assert cell.out_dim == (post or 8)
    x, starts = torch.randn(6, 3, 5), torch.rand(6, 3) < 0.3
    state = torch.randn(3, cell.state_size)
    out, last = cell.sequence(x, state, starts)
    s = state
    for t in range(6):
        s = torch.where(starts[t].unsqueeze(-1), torch.zeros_like(s), s)
        y, s = cell.step(x[t], s)
        torch.testing.assert_close(out[t], y)
    torch.testing.assert_close(last, s)


@settings(max_examples=30, deadline=None)
@given(
    core=st.sampled_from(sorted(CORES)),
    post=st.sampled_from([0, 6]),
    steps=st.integers(2, 12),
    cols=st.integers(1, 5),
    reset_p=st.sampled_from([0.0, 0.2, 0.6, 1.0]),
    burn_in=st.integers(0, 4),
    seed=st.integers(0, 2**16),
)
def test_the_fused_replay_is_the_step_loop_with_its_gradients(
    core, post, steps, cols, reset_p, burn_in, seed
):
    """`sequence` without the final state (an update's replay: torch's fused LSTM/GRU over the
    chunks between episode starts) against `sequence_reference` (one cell call a step): the same
    features and the same gradients for inputs, stored state and every weight, resets anywhere
    (step 0 included, every step, none) and burn-in cut anywhere."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    cell = CORES[core](4, 6, post)
    x = torch.randn(steps, cols, 4, generator=gen, requires_grad=True)
    state = torch.randn(cols, cell.state_size, generator=gen, requires_grad=True)
    starts = torch.rand(steps, cols, generator=gen) < reset_p
    fused, none = cell.sequence(x, state, starts, burn_in, final_state=False)
    plain, _ = cell.sequence_reference(x, state, starts, burn_in)
    assert none is None
    torch.testing.assert_close(fused, plain, atol=1e-6, rtol=1e-5)
    weights = torch.randn(plain.shape, generator=gen)
    inputs = [x, state, *cell.parameters()]
    got = torch.autograd.grad((fused * weights).sum(), inputs, allow_unused=True)
    want = torch.autograd.grad((plain * weights).sum(), inputs, allow_unused=True)
    for g, w in zip(got, want, strict=True):
        if w is None:
            assert g is None or not g.any()
        else:
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    ("core", "shared", "post"), [("lstm", "false", 0), ("gru", "true", 0), ("lstm", "false", 16)]
)
def test_the_learner_replays_what_the_worker_computed(core, shared, post):
    """Two consecutive segments of 8 CartPole envs over 64 steps each: episodes end inside them and
    the second starts from the carried state, not zeros. Replayed from `initial_state` with the
    starts rule, log-probs and values match the worker's (its numpy mirror, the core's output
    layer included) to float precision."""
    cfg = recurrent_cfg(
        core,
        f"model.shared_trunk={shared}",
        "rollout.rollout_len=64",
        "learner.batch_size=512",
        f"model.post_core_size={post}",
    )
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    model = build_policy(cfg, sampler.spec, critic=True)
    sampler.set_weights(0, model.state_dict())  # the worker acts through its numpy mirror
    first, second = sampler.sample(), sampler.sample()
    assert np.abs(second["initial_state"]).sum() > 0  # carried over the boundary
    assert (first["terminated"].sum(0) > 0).any()  # some episode ended inside
    for seg in (first, second):
        data = time_major({k: torch.from_numpy(v).unsqueeze(0) for k, v in seg.arrays.items()})
        inputs = policy_inputs(data)
        dev = DeviceContext(resolve_device("cpu"))
        logp, value = evaluate_in_chunks(model, inputs, data["actions"].flatten(0, 1), cfg.learner, dev)
        np.testing.assert_allclose(logp.numpy(), seg["logp"].reshape(-1), atol=1e-5)
        np.testing.assert_allclose(value.numpy(), seg["values"].reshape(-1), atol=1e-5)


def test_column_rows_read_a_time_major_batch_column_by_column():
    from relay_rl.learner.update import column_rows

    assert column_rows(3, 2, torch.arange(2)).tolist() == [0, 2, 4, 1, 3, 5]  # rows t * 2 + e
    assert column_rows(3, 2, torch.tensor([1, 0])).tolist() == [1, 3, 5, 0, 2, 4]


@pytest.mark.parametrize(
    ("sets", "words"),
    [
        (["model.recurrent=lstm", "learner.minibatch=steps"], "set learner.minibatch=sequences"),
        (["model.recurrent=lstm", "learner.minibatch=sequences", "model.burn_in=32"], "model.burn_in=32"),
        (["model.burn_in=4"], "needs a recurrent core"),
        (["model.post_core_size=32"], "model.post_core_size=32 needs a recurrent core"),
        (["model.recurrent=transformer"], "not a core: choose none, lstm, gru"),
    ],
)
def test_recurrent_config_rules_name_the_fields(sets, words):
    cfg = load_config("configs/cartpole_ppo.yaml", sets)
    with pytest.raises(ConfigError, match=words):
        check_config(cfg)


def test_the_learner_reports_the_state_it_replays_from(tmp_path):
    from relay_rl.learner.learner import Learner

    cfg = recurrent_cfg("lstm", "learner.buffer_size=256")
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    learner = Learner(cfg, sampler.spec)
    sampler.sample()  # the second segment starts from a carried state
    seg = sampler.sample()
    metrics = learner.train_round([seg]).metrics
    resets = int((seg["terminated"][:-1] + seg["truncated"][:-1] > 0).sum())
    assert metrics["state_resets_per_segment"] == resets
    assert metrics["state_abs_mean"] == pytest.approx(float(np.abs(seg["initial_state"]).mean()), rel=1e-5)


@pytest.mark.parametrize(
    ("core", "shared", "critic", "post"),
    [
        ("lstm", "false", True, 0),
        ("gru", "true", True, 0),
        ("lstm", "false", False, 0),
        ("lstm", "false", True, 12),
        ("gru", "true", True, 12),
    ],
)
def test_the_numpy_mirror_steps_a_core_as_torch_does(core, shared, critic, post):
    """20 steps of 8 envs, each side feeding its own state back, with random episode starts."""
    from relay_rl.contracts.spaces import ActionSpec, EnvSpec
    from relay_rl.policy.actor_critic import STATE, draw_noise
    from relay_rl.policy.numpy_mirror import NumpyPolicy, cpu_policy

    cfg = recurrent_cfg(core, f"model.shared_trunk={shared}", f"model.post_core_size={post}")
    model = build_policy(cfg, EnvSpec((3,), ActionSpec("discrete", 4)), critic=critic)
    fast = cpu_policy(cfg.model, model)
    assert isinstance(fast, NumpyPolicy)
    gen = torch.Generator().manual_seed(0)
    s_np = np.zeros((8, model.state_size), np.float32)
    s_torch = torch.zeros(8, model.state_size)
    for _ in range(20):
        obs = torch.randn(8, 3, generator=gen)
        noise = draw_noise(model.action, 8, gen)
        a, logp, v, s_torch = model.act_with_state({"obs": obs, STATE: s_torch}, noise)
        a_np, logp_np, v_np, s_np = fast.act({"obs": obs.numpy(), STATE: s_np}, noise.numpy())
        assert np.array_equal(a.numpy(), a_np)
        np.testing.assert_allclose(logp_np, logp.numpy(), atol=1e-5)
        np.testing.assert_allclose(v_np, v.numpy(), atol=1e-5)
        np.testing.assert_allclose(s_np, s_torch.numpy(), atol=1e-5)
        starts = torch.rand(8, generator=gen) < 0.2
        s_torch = torch.where(starts[:, None], 0.0, s_torch)
        s_np = np.where(starts.numpy()[:, None], np.float32(0.0), s_np)


@pytest.mark.parametrize(
    ("config", "sets"),
    [
        # a Dict observation (image flattened, direction one-hot): the numpy mirror's encoders
        ("minigrid_doorkey_ppo.yaml", ["rollout.rollout_len=32", "env.num_envs=4"]),
        # the Nature CNN on Atari frames: the torch policy acts
        ("breakout_ppo.yaml", ["rollout.rollout_len=16", "env.num_envs=2", "learner.batch_size=32"]),
        # agents as columns, each value trunk (and its own core) reading the copy's global state
        (
            "simple_spread_mappo.yaml",
            [
                "rollout.rollout_len=32",
                "env.num_envs=6",
                "rollout.num_workers=0",
                "learner.buffer_size=192",
                "learner.batch_size=192",
            ],
        ),
    ],
)
def test_a_core_after_any_encoder_replays_as_the_worker_acted(config, sets):
    cfg = load_config(
        f"configs/{config}",
        ["model.recurrent=lstm", "model.recurrent_size=8", "learner.minibatch=sequences", *sets],
    )
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    model = build_policy(cfg, sampler.spec, critic=True)
    sampler.set_weights(0, model.state_dict())
    sampler.sample()
    seg = sampler.sample()
    data = time_major({k: torch.from_numpy(v).unsqueeze(0) for k, v in seg.arrays.items()})
    dev = DeviceContext(resolve_device("cpu"))
    logp, value = evaluate_in_chunks(
        model, policy_inputs(data), data["actions"].flatten(0, 1), cfg.learner, dev
    )
    np.testing.assert_allclose(logp.numpy(), seg["logp"].reshape(-1), atol=1e-5)
    np.testing.assert_allclose(value.numpy(), seg["values"].reshape(-1), atol=1e-5)


def _one_round_of_minibatches(cfg):
    """A learner's update on one fresh segment, and every minibatch its loss was given."""
    from relay_rl.learner.learner import Learner

    sampler = make_sampler(cfg, algorithm_traits(cfg))
    learner = Learner(cfg, sampler.spec)
    minibatches, loss = [], learner.algo.loss

    def recording(model, b):
        minibatches.append(b)
        return loss(model, b)

    learner.algo.loss = recording
    learner.train_round([sampler.sample()])
    return learner, minibatches


def test_every_recurrent_minibatch_has_the_same_shapes():
    """The fixed-shape promise with a core: whole [T] columns, the state per column, one shape for
    every minibatch of every epoch (nothing an NPU would recompile for)."""
    cfg = recurrent_cfg("lstm", "learner.buffer_size=256", "learner.batch_size=64", "learner.epochs=3")
    learner, minibatches = _one_round_of_minibatches(cfg)
    seen = [tuple(sorted((k, tuple(v.shape)) for k, v in b.items())) for b in minibatches]
    assert len(seen) == 3 * 256 // 64 and len(set(seen)) == 1
    shapes = dict(seen[0])
    assert shapes["h_in"] == (64 // 32, learner.model.state_size) and shapes["obs"] == (64, 4)


def test_burn_in_steps_warm_the_state_but_teach_nothing():
    cfg = recurrent_cfg("gru", "learner.buffer_size=256", "learner.batch_size=64", "model.burn_in=4")
    _, minibatches = _one_round_of_minibatches(cfg)
    for b in minibatches:
        mask = b["mask"].reshape(-1, 32)  # [k sequences, T] in time order
        assert (mask[:, :4] == 0).all() and (mask[:, 4:] == 1).all()
