"""The token transformer policy: it reads exactly the filled context, trains, and learns the token task."""

import numpy as np
import pytest
import torch

from relay_rl.contracts.config import ConfigError, build_config
from relay_rl.learner.algorithms import algorithm_traits
from relay_rl.learner.learner import Learner
from relay_rl.policy.models import build_policy
from relay_rl.policy.models.transformer import TokenTransformer
from relay_rl.rollout_workers.sampler import make_sampler
from relay_rl.services.driver.preflight import check_config

VOCAB, SEQ = 5, 10


def _contexts(filled: list[int], seed: int = 0) -> torch.Tensor:
    """[len(filled), SEQ] random ids with the given number of filled slots each, -1 after."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (len(filled), SEQ), generator=gen)
    mask = torch.arange(SEQ) < torch.tensor(filled).unsqueeze(1)
    return torch.where(mask, ids, -1).float()


def _trunk() -> TokenTransformer:
    torch.manual_seed(0)
    return TokenTransformer(SEQ, VOCAB, d_model=32, heads=4, layers=2).eval()


def test_empty_slots_are_invisible_and_every_filled_slot_is_seen():
    trunk = _trunk()
    obs = _contexts([1, 4, 5, 9, 10])
    with torch.no_grad():
        before = trunk(obs)
        trunk.embed.weight[VOCAB].normal_(std=10.0)  # the empty-slot embedding
        torch.testing.assert_close(trunk(obs), before)
        for slot in (0, 3):  # change a filled slot of the rows that have it: their features change
            changed = obs.clone()
            changed[:, slot] = torch.where(changed[:, slot] >= 0, (changed[:, slot] + 1) % VOCAB, -1.0)
            moved = (trunk(changed) - before).abs().amax(dim=-1)
            has_slot = obs[:, slot] >= 0
            assert (moved[has_slot] > 1e-4).all() and (moved[~has_slot] == 0).all()


def test_features_are_read_at_the_last_filled_slot():
    """Appending a token changes the features; a row's features do not depend on other rows."""
    trunk = _trunk()
    obs = _contexts([5, 5])
    longer = obs.clone()
    longer[1, 5] = 2.0
    with torch.no_grad():
        out = trunk(torch.cat([obs, longer]))
        assert out.shape == (4, 32)
        assert (out[1] - out[3]).abs().max() > 1e-4
        torch.testing.assert_close(out[:1], trunk(obs[:1]))


def test_gradient_checkpointing_gives_the_same_gradients():
    grads = []
    for enabled in (False, True):
        trunk = _trunk().train()
        trunk.checkpointing = enabled
        trunk(_contexts([3, 6, 10])).square().sum().backward()
        grads.append([p.grad.clone() for p in trunk.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)


def test_config_rules_for_the_transformer():
    """The transformer kind's own rules, checked with the registry's (what validate and train run)."""
    with pytest.raises(ConfigError, match=r"set model\.normalize_obs=false"):
        check_config(build_config({}, ["model.kind=transformer"]))
    with pytest.raises(ConfigError, match=r"model\.transformer: d_model=30 is not divisible by heads=4"):
        check_config(
            build_config(
                {}, ["model.kind=transformer", "model.normalize_obs=false", "model.transformer.d_model=30"]
            )
        )


def _token_cfg(*overrides: str):
    return build_config(
        {},
        [
            "env.id=relay/ReverseDigits-v0",
            "env.kwargs={length: 3, vocab: 3}",
            "env.num_envs=64",
            "rollout.num_workers=0",
            "rollout.rollout_len=3",
            "learner.algo=grpo",
            "learner.group_size=8",
            "learner.buffer_size=192",
            "learner.batch_size=96",
            "learner.lr=0.002",
            "model.kind=transformer",
            "model.normalize_obs=false",
            "model.transformer.d_model=32",
            *overrides,
        ],
    )


def test_behaviour_log_probs_match_the_learners_evaluation():
    """The worker acts with the torch transformer; the learner must score those actions the same."""
    cfg = _token_cfg()
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    learner = Learner(cfg, sampler.spec)
    sampler.set_weights(0, learner.model.state_dict())
    seg = sampler.sample()
    obs = torch.from_numpy(seg["obs"].reshape(-1, sampler.spec.obs_dim))
    out = learner.model.evaluate(obs, torch.from_numpy(seg["actions"].reshape(-1)))
    torch.testing.assert_close(out.logp, torch.from_numpy(seg["logp"].reshape(-1)), atol=1e-5, rtol=1e-5)
    assert not learner.model.has_critic and isinstance(learner.model.pi_trunk, TokenTransformer)


@pytest.mark.slow
def test_grpo_transformer_learns_the_token_task_in_process():
    """Reverse 3 digits of vocab 3: the mean verifier reward climbs from ~1/3 (random)."""
    cfg = _token_cfg()
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    learner = Learner(cfg, sampler.spec)
    rewards = []
    for version in range(25):
        sampler.set_weights(version, learner.model.state_dict())
        seg = sampler.sample()
        rewards.append(float(seg["outcome"].mean()))
        learner.ingest(learner.stage(seg))
        learner.update()
    assert np.mean(rewards[:3]) < 0.5
    assert np.mean(rewards[-5:]) > 0.8, rewards


def test_build_policy_reads_the_vocabulary_it_writes():
    cfg = _token_cfg()
    model = build_policy(cfg, make_sampler(cfg, algorithm_traits(cfg)).spec, critic=False)
    assert model.pi_trunk.vocab_size == 3 and model.pi_head.out_features == 3
