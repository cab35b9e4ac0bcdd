"""`module:factory` ids that make real PettingZoo envs (mpe2's simple_spread): its AEC form, which
relay converts with PettingZoo's own aec_to_parallel (the env says it is parallelizable), and its
parallel form as it is."""

from mpe2 import simple_spread_v3


def spread_aec(**kwargs):
    return simple_spread_v3.env(**kwargs)


def spread_parallel(**kwargs):
    return simple_spread_v3.parallel_env(**kwargs)
