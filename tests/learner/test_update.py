"""The update step: a bandit trained to its optimum with only the learner's pieces; skip logic."""

import pytest
import torch

from relay_rl.contracts.config import LearnerConfig
from relay_rl.contracts.spaces import ActionSpec
from relay_rl.learner.algorithms.ppo import PPO
from relay_rl.learner.device import resolve_device
from relay_rl.learner.gae import EpisodeEnds, compute_gae
from relay_rl.learner.update import run_update
from relay_rl.policy.actor_critic import draw_noise
from relay_rl.policy.models.mlp import mlp_policy

ARM_REWARDS = torch.tensor([0.0, 1.0, 0.2])


def ppo_loss(cfg: LearnerConfig, policy):
    return PPO(cfg, policy, resolve_device("cpu")).loss


def _bandit_batch(policy, gen: torch.Generator, n: int) -> dict[str, torch.Tensor]:
    """n one-step episodes of a 3-armed bandit, as a [T=1, N=n] segment through GAE."""
    obs = torch.zeros(n, 2)
    actions, logp, values = policy.act(obs, draw_noise(policy.action, n, gen))
    rewards = ARM_REWARDS[actions] + 0.1 * torch.randn(n, generator=gen)
    ones, zeros = torch.ones(1, n), torch.zeros(1, n)
    adv, ret = compute_gae(
        rewards[None],
        values[None],
        EpisodeEnds(ones, zeros, zeros, torch.zeros(n), ones),
        gamma=0.99,
        lam=0.95,
    )
    return {
        "obs": obs,
        "actions": actions,
        "logp": logp,
        "values": values,
        "advantages": adv[0],
        "returns": ret[0],
        "mask": torch.ones(n),
    }


def _train_bandit(cfg: LearnerConfig, iterations: int = 40) -> object:
    torch.manual_seed(0)
    policy = mlp_policy(2, ActionSpec("discrete", 3), [16], normalize_obs=False)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    gen = torch.Generator().manual_seed(0)
    dev = resolve_device("cpu")
    for _ in range(iterations):
        batch = _bandit_batch(policy, gen, 256)
        run_update(
            policy, opt, batch, ppo_loss(cfg, policy), cfg, dev, generator=torch.Generator().manual_seed(1)
        )
    return policy


@pytest.mark.slow
def test_ppo_update_solves_a_bandit():
    cfg = LearnerConfig(lr=0.01, batch_size=64, epochs=4, entropy_coef=0.0)
    policy = _train_bandit(cfg)
    probs = torch.softmax(policy.distribution_params(torch.zeros(1, 2))[0], -1)[0]
    assert probs[1] > 0.95, probs


@pytest.mark.slow
def test_grad_accumulation_and_bf16_autocast_also_solve_it():
    cfg = LearnerConfig(
        lr=0.01, batch_size=64, epochs=4, grad_accum_steps=4, use_amp=True, amp_dtype="bfloat16"
    )
    policy = _train_bandit(cfg)
    probs = torch.softmax(policy.distribution_params(torch.zeros(1, 2))[0], -1)[0]
    assert probs[1] > 0.95, probs


def test_nonfinite_gradient_skips_the_step_and_counts_it():
    torch.manual_seed(0)
    policy = mlp_policy(2, ActionSpec("discrete", 3), [8], normalize_obs=False)
    before = [p.detach().clone() for p in policy.parameters()]
    cfg = LearnerConfig(batch_size=32, epochs=2)
    base = ppo_loss(cfg, policy)

    def exploding(model, b):
        loss, stats = base(model, b)
        return loss * float("inf"), stats

    batch = _bandit_batch(policy, torch.Generator().manual_seed(0), 64)
    opt = torch.optim.Adam(policy.parameters())
    result = run_update(policy, opt, batch, exploding, cfg, resolve_device("cpu"))
    assert result.optimizer_steps == 4 and result.skipped_steps == 4
    for p, q in zip(policy.parameters(), before, strict=True):
        assert torch.equal(p, q) and torch.isfinite(p).all()


def test_target_kl_stops_epochs_early():
    torch.manual_seed(0)
    policy = mlp_policy(2, ActionSpec("discrete", 3), [8], normalize_obs=False)
    batch = _bandit_batch(policy, torch.Generator().manual_seed(0), 128)
    cfg = LearnerConfig(batch_size=32, epochs=50, lr=0.05, target_kl=1e-4)
    result = run_update(
        policy,
        torch.optim.Adam(policy.parameters(), lr=0.05),
        batch,
        ppo_loss(cfg, policy),
        cfg,
        resolve_device("cpu"),
    )
    assert result.epochs_run < 50
    assert set(result.stats) >= {
        "policy_loss",
        "value_loss",
        "entropy",
        "approx_kl",
        "clip_fraction",
        "grad_norm",
    }


def _recording_update(seq_len, T=8, E=12, batch_size=24, accum=1):
    """run_update over a time-major [T, E] batch whose fields name each row's t and e; the loss
    records every micro-batch it is given."""
    t = torch.arange(T).repeat_interleave(E)
    e = torch.arange(E).repeat(T)
    batch = {"t": t, "e": e, "mask": torch.ones(T * E)}
    seen = []
    weight = torch.nn.Parameter(torch.zeros(1))
    model = torch.nn.Module()
    model.w = weight

    def loss_fn(_model, mb):
        seen.append((mb["t"].clone(), mb["e"].clone()))
        loss = (weight**2).sum() + 0 * mb["mask"].sum()
        return loss, {"approx_kl": torch.zeros(())}

    cfg = LearnerConfig(batch_size=batch_size, epochs=2, grad_accum_steps=accum)
    run_update(
        model, torch.optim.SGD([weight], lr=0.1), batch, loss_fn, cfg, resolve_device("cpu"), seq_len=seq_len
    )
    return seen


def test_sequence_minibatches_are_whole_columns_in_time_order():
    from relay_rl.learner.update import sequence_view

    T, E = 8, 12
    seen = _recording_update(seq_len=T, T=T, E=E, batch_size=24, accum=1)
    assert len(seen) == 2 * (T * E // 24)
    for epoch in (seen[:4], seen[4:]):
        columns = []
        for t, e in epoch:
            tv, ev = sequence_view(t, T), sequence_view(e, T)  # [T, k]
            assert tv.shape == (T, 3)
            assert (tv == torch.arange(T).unsqueeze(1)).all()  # each column in time order
            assert (ev == ev[0]).all()  # one env per column
            columns += ev[0].tolist()
        assert sorted(columns) == list(range(E))  # every column once per epoch
    assert [e.tolist() for _, e in seen[:4]] != [e.tolist() for _, e in seen[4:]]  # reshuffled


def test_flat_minibatches_stay_shuffled_steps():
    seen = _recording_update(seq_len=None)
    rows = torch.cat([t * 12 + e for t, e in seen[:4]])
    assert sorted(rows.tolist()) == list(range(96))
    t0, _ = seen[0]
    assert not (t0 == t0[0]).all()


def test_sequence_minibatches_need_whole_sequences():
    from relay_rl.contracts.config import ConfigError, build_config

    with pytest.raises(ConfigError, match=r"multiple of rollout\.rollout_len=32"):
        build_config(
            {},
            [
                "learner.minibatch=sequences",
                "learner.batch_size=48",
                "learner.buffer_size=1536",
                "rollout.rollout_len=32",
                "env.num_envs=6",
                "rollout.num_workers=0",
            ],
        )
    cfg = build_config(
        {},
        [
            "learner.minibatch=sequences",
            "learner.batch_size=64",
            "rollout.rollout_len=32",
            "learner.buffer_size=512",
            "env.num_envs=8",
            "rollout.num_workers=0",
        ],
    )
    assert cfg.learner.minibatch == "sequences"
