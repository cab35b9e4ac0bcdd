"""relay's contracts: the data every layer exchanges, at the bottom of the import graph.

The config model, the Segment and its field table, the env and action specs, the round result,
the checkpoint schema and the metric keys. Nothing here imports relay (only numpy, pydantic and
yaml), so rollout workers, the learner and the services all import it and never each other's
internals for a shape or a name.
"""
