"""relay learner: device layer, ring buffer, GAE, losses and updates (no Ray here but actor.py)."""
