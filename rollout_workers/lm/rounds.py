"""Which of a language run's generated groups an update trains on: pure rules, no Ray, no model
(`services/driver/lm_backend.py` applies them as it collects a round).

A group is the learner.group_size completions of one prompt, members adjacent; a group carries
signal when at least two members were scored and not all alike (an all-equal group gets advantage
0 from every estimator that compares within groups)."""

from __future__ import annotations


def has_signal(rewards: list[float | None]) -> bool:
    """Whether a group's rewards differ: at least two scored, not all equal."""
    got = [r for r in rewards if r is not None]
    return len(got) >= 2 and max(got) > min(got)


def groups_to_keep(rewards: list[float | None], group_size: int, wanted: int, last: bool) -> list[int]:
    """The groups of a generated round (rewards [groups x group_size]) the update keeps, in order:
    those with signal, up to `wanted`; on the `last` try (learner.lm.refill_rounds spent),
    all-equal groups fill what is left, so the batch keeps its prompts.batch_size groups (DAPO's
    dynamic sampling)."""
    groups = [rewards[k : k + group_size] for k in range(0, len(rewards), group_size)]
    signal = [k for k, rs in enumerate(groups) if has_signal(rs)]
    take = signal[:wanted]
    if last:
        take += [k for k in range(len(groups)) if k not in signal][: wanted - len(take)]
    return take


def reward_means(per_reward: list[list[float | None]]) -> dict[str, float | None]:
    """reward_<i>_mean: each reward function's mean over the completions it scored."""
    out: dict[str, float | None] = {}
    for i, values in enumerate(per_reward):
        got = [v for v in values if v is not None]
        out[f"reward_{i}_mean"] = sum(got) / len(got) if got else None
    return out
