"""The metric catalog: the run-wide keys (`contracts/metrics.py` RUN) and the keys each registry
entry declares beside its code (algorithms, model kinds, recurrent cores), assembled once.

The sinks export, sweeps rank by, and the dashboards draw exactly these keys. A new entry's keys
arrive with its registry line; nothing here changes.
"""

from __future__ import annotations

from ..contracts.metrics import MetricCatalog, MetricKeys
from ..learner.algorithms import ALGORITHMS
from ..policy.cores import CORES
from ..policy.models import MODEL_KINDS


def declared() -> list[MetricKeys]:
    """Every registry entry's declaration, registry by registry, in registration order."""
    return [
        *(algo.metrics for algo in ALGORITHMS.values()),
        *(kind.metrics for kind in MODEL_KINDS.values()),
        *(core.metrics for core in CORES.values()),
    ]


CATALOG = MetricCatalog(declared())
METRICS: dict[str, str] = CATALOG.keys
