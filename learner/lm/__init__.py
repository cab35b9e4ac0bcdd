"""The learner of a language run (`model.kind: causal_lm`): pure torch, no Ray but `actor.py`.

- `learner.py`: generation on the learner's device and micro-batched updates of one causal LM;
- `estimators/`: the advantage estimators (`learner.algo` of a language run: grpo, rloo,
  reinforce_pp), a registry whose entries carry their settings and metric keys;
- `policy_losses/`: the per-token policy losses (`learner.lm.policy_loss`: clip, gspo), likewise;
- `settings.py`: `learner.lm`, the update's settings every estimator and loss shares;
- `tokens.py`: per-token math of the update (KL estimators, loss aggregation, importance weights);
- `actor.py`: the learner as a Ray actor.
"""
