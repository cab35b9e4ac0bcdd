"""The rollout side of a language run: generator actors (`generator.py`: completions with the
weights the learner published, by version), reward functions (`rewards.py`: the registry and
user functions, each a fault counted rather than a crash), reward actors (`reward_workers.py`) and
the round's collection rules (`rounds.py`: which groups a round keeps)."""
