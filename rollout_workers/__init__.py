"""relay rollout workers: vector envs that emit fixed-shape [T, N] segments."""
