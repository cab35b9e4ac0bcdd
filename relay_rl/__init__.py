"""relay: a Ray actor-learner reinforcement-learning service (Ascend NPUs, CUDA GPUs, CPUs).

The one import namespace of the installed code. Its packages are the repository's top-level
folders, linked here (as Ray ships its root `rllib/` folder as `ray.rllib`): `relay_rl.contracts`,
`relay_rl.policy`, `relay_rl.learner`, `relay_rl.rollout_workers`, `relay_rl.services`. Inside
them, imports of each other are relative, so nothing of relay lands in site-packages under a
generic top-level name (`contracts`, `policy`, `services`...) where a PyPI package or a user's own
folder of that name would collide with it.
"""

__version__ = "0.1.0"
