"""relay services: config, command line, training driver, checkpoints, metrics."""
