"""The driver: checks a config, starts Ray and the actors, runs the training loop, writes the run
directory (metrics, checkpoints) and stops cleanly."""
