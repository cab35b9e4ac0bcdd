"""relay's policy layer: what both sides of a run act or train with, above `contracts/` only.

The model kinds (`policy/models/`), the actor-critic around them, the observation normalizer and
the numpy acting mirror the rollout workers use. The learner trains these modules, the rollout
workers act with them, and export, verify and serving read them; none of those reaches into
another's internals for a policy.
"""
