"""`model.kind: causal_lm`: a Hugging Face causal language model from a local folder (`model.path`).

Not a trunk under relay's heads: the language model, its own head and its KV cache are the policy
(`policy/causal_lm.py`, a `LanguagePolicy`). A language run takes prompts instead of an env
(`contracts/config.py` `RelayConfig.language`); this entry says so to the env-side checks.
"""

from __future__ import annotations

from collections.abc import Callable

from ...contracts.config import RelayConfig
from ...contracts.spaces import EnvSpec
from ...policy.trunk import ModelKind, TrunkModule


class CausalLMKind(ModelKind):
    language = True

    def env_problem(self, cfg: RelayConfig, env: EnvSpec) -> str | None:
        return "model.kind=causal_lm trains on prompts (prompts.train), not on an env"

    def trunk_factory(self, cfg: RelayConfig, env: EnvSpec, in_dim: int) -> Callable[[], TrunkModule]:
        raise ValueError("model.kind=causal_lm is a whole policy, not a trunk under relay's heads")
