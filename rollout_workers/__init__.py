"""relay rollout workers: vector envs that emit fixed-shape [T, N] segments."""

import gymnasium as gym

TOKEN_ENV_ID = "relay/ReverseDigits-v0"

if TOKEN_ENV_ID not in gym.registry:
    gym.register(id=TOKEN_ENV_ID, entry_point="relay_rl.rollout_workers.token_env:ReverseDigitsEnv")
