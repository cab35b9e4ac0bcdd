"""The metric catalog: the run-wide keys (`contracts/metrics.py` RUN) and the keys each registry
entry declares beside its code (env algorithms, language estimators and policy losses, model kinds,
recurrent cores), assembled from the
registries as they are when asked (an entry a user's script registers after import counts too).

The sinks export, sweeps rank by, and the dashboards draw exactly these keys. A new entry's keys
arrive with its registry line; nothing here changes.
"""

from __future__ import annotations

from ...contracts.metrics import MetricCatalog, MetricKeys
from ...learner.algorithms import ALGORITHMS
from ...learner.lm.estimators import ESTIMATORS
from ...learner.lm.policy_losses import POLICY_LOSSES
from ...policy.cores import CORES
from ...policy.models import MODEL_KINDS


def declared() -> list[MetricKeys]:
    """Every registry entry's declaration, registry by registry, in registration order."""
    return [
        *(algo.metrics for algo in ALGORITHMS.values()),
        *(est.metrics for est in ESTIMATORS.values()),
        *(loss.metrics for loss in POLICY_LOSSES.values()),
        *(kind.metrics for kind in MODEL_KINDS.values()),
        *(core.metrics for core in CORES.values()),
    ]


_built: tuple[tuple[int, ...], MetricCatalog] | None = None


def catalog() -> MetricCatalog:
    """The catalog of every registered entry; rebuilt only when the registries changed (it is read
    for every metrics line)."""
    global _built
    parts = declared()
    key = tuple(id(part) for part in parts)
    if _built is None or _built[0] != key:
        _built = (key, MetricCatalog(parts))
    return _built[1]
