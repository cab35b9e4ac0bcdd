"""A token-generation task for GRPO at a size that trains on a CPU: reverse a prompt of digits.

The LLM-RLHF shape: a prompt, a policy emitting one token per step up to a fixed length, and a
verifier scoring the finished sequence, with reward only at the end.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class ReverseDigitsEnv(gym.Env[np.ndarray, np.int64]):
    """Prompt: `length` digits in [0, vocab). The policy emits `length` tokens; the verifier's
    reward at the last step is the fraction of positions equal to the reversed prompt (0..1).

    Observation: the context as token ids [2 * length], the prompt then the tokens emitted so far,
    -1 in the slots not yet filled (what relay's transformer policy reads, `model.kind:
    transformer`). A uniformly random policy scores 1 / vocab on average.
    """

    metadata = {"render_modes": []}  # noqa: RUF012 (gymnasium's own attribute)

    def __init__(self, length: int = 5, vocab: int = 5) -> None:
        self.length, self.vocab = length, vocab
        self.observation_space = gym.spaces.Box(-1, vocab - 1, shape=(2 * length,), dtype=np.int64)
        self.action_space = gym.spaces.Discrete(vocab)
        self._prompt = np.zeros(length, dtype=np.int64)
        self._emitted: list[int] = []

    def _obs(self) -> np.ndarray:
        L = self.length
        obs = np.full(2 * L, -1, dtype=np.int64)
        obs[:L] = self._prompt
        obs[L : L + len(self._emitted)] = self._emitted
        return obs

    def score(self, tokens: list[int]) -> float:
        """The verifier: fraction of positions matching the reversed prompt."""
        return float(np.mean(np.asarray(tokens) == self._prompt[::-1]))

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._prompt = self.np_random.integers(0, self.vocab, self.length)
        self._emitted = []
        return self._obs(), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict]:
        if len(self._emitted) >= self.length:
            raise RuntimeError("step() after the sequence finished; call reset()")
        self._emitted.append(int(action))
        done = len(self._emitted) == self.length
        reward = self.score(self._emitted) if done else 0.0
        return self._obs(), reward, done, False, {}
