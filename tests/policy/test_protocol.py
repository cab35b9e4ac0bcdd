"""Both policy families implement the protocols the learner, algorithms and tools are typed on."""

from __future__ import annotations

import torch

from relay_rl.policy.causal_lm import CausalLMPolicy, load_causal_lm, load_tokenizer
from relay_rl.policy.protocol import EnvPolicy, LanguagePolicy, Policy
from tests.helpers import local_config
from tests.lm_helpers import tiny_model_folder


def _actor_critic(*overrides: str):
    from relay_rl.policy.models import build_policy
    from relay_rl.rollout_workers.envs import probe_env_spec

    cfg = local_config("CartPole-v1", *overrides)
    return build_policy(cfg, probe_env_spec(cfg.env, []), critic=True)


def test_actor_critic_is_an_env_policy_with_its_initial_state_and_acting_weights():
    plain = _actor_critic()
    assert isinstance(plain, EnvPolicy) and isinstance(plain, Policy)
    assert not isinstance(plain, LanguagePolicy)
    assert plain.initial_state(3) is None
    weights = plain.acting_weights()
    assert weights.keys() == plain.state_dict().keys()
    assert all(v.device.type == "cpu" and v.is_contiguous() for v in weights.values())
    lstm = _actor_critic("model.recurrent=lstm", "model.recurrent_size=16")
    state = lstm.initial_state(3)
    assert state is not None and state.shape == (3, lstm.state_size) and not state.any()


def test_a_causal_lm_is_a_language_policy(tmp_path):
    folder = tiny_model_folder(tmp_path / "m")
    tok = load_tokenizer(folder)
    lm = CausalLMPolicy(load_causal_lm(folder), tok.pad_token_id, [tok.eos_token_id])
    assert isinstance(lm, LanguagePolicy) and isinstance(lm, Policy) and not isinstance(lm, EnvPolicy)
    assert lm.acting_weights().keys() == lm.state_dict().keys()
    assert all(isinstance(v, torch.Tensor) for v in lm.acting_weights().values())
