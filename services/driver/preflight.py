"""Every check a config passes before anything starts: `relay validate` and `relay train` (and
`relay resume`) run exactly these, so they accept and refuse the same configs with the same line.

1. the sections entries declare (learner.lm, metrics.mlflow, ...), the model kind and the weight
   wire, the run's family's registry names and each chosen entry's own rules (algorithm or
   estimator, model kind, vector backend), and the packages of the trackers it names;
2. the family's inputs (`services/driver/families`): an env builds, its spaces are supported and
   the model kind can read its observations; or a language run's model folder, prompts and
   rewards read as data;
3. the learner device: it parses, and where the learner runs on this machine, it exists here;
4. memory: what the config implies (ring buffer, segments in flight) fits this machine.

Nothing here writes a file or starts Ray.
"""

from __future__ import annotations

from ...contracts.config import ConfigError, RelayConfig
from ...contracts.spaces import EnvSpec
from ...learner.device import parse_device_spec
from ...policy import cores, weight_wires
from ...policy.encoders import ENCODERS
from ...policy.models import MODEL_KINDS, model_kind
from ...rollout_workers.preprocess import PREPROCESSORS
from ...rollout_workers.vector_backends import VECTOR_BACKENDS
from ...services.driver.checks import PreflightError, registry_problems, wire_problems
from ...services.driver.families import FAMILIES, family
from ...services.driver.families.env import check_env
from ...services.driver.families.language import check_language
from ...services.runs.config_sections import resolve_sections
from ...services.tracking import missing_tracker


def choices() -> dict[str, list[str]]:
    """Registry-backed leaves and their names, for `relay validate --help-config` (read when
    asked: a user's script may have registered an entry)."""
    return {
        "learner.algo": list(dict.fromkeys(name for f in FAMILIES.values() for name in f.algorithms())),
        "model.kind": list(MODEL_KINDS),
        "env.vectorization": list(VECTOR_BACKENDS),
        "env.preprocess": list(PREPROCESSORS),
        "model.encoders": list(ENCODERS),
        "model.recurrent": [cores.NO_CORE, *cores.CORES],
        "learner.weight_wire": [weight_wires.AUTO, *weight_wires.WIRES],
    }


def check_config(cfg: RelayConfig) -> None:
    """Registry names, then the rules of the chosen entries, all reported together (ConfigError);
    the entries' own sections are checked first and stored resolved (services/runs/config_sections.py)."""
    resolve_sections(cfg)
    problems = registry_problems([(model_kind, cfg.model.kind)])
    if not problems:
        problems += wire_problems(cfg)
        problems += family(cfg).config_problems(cfg)
    if not problems:
        problems += model_kind(cfg.model.kind).config_problems(cfg)
    if problems:
        raise ConfigError("invalid config: " + "; ".join(problems))


def preflight(cfg: RelayConfig, address: str | None = None) -> EnvSpec | None:
    """All checks, in order; returns the env spec (None for a family without an env).
    ConfigError, PreflightError or DeviceError."""
    check_config(cfg)
    missing = missing_tracker(cfg)
    if missing:
        raise PreflightError(missing)
    parse_device_spec(cfg.learner.device)
    return family(cfg).check(cfg, address)


def learner_memory(cfg: RelayConfig) -> str | None:
    """The learner's memory per device, estimated by the config's family (None: no estimate)."""
    return family(cfg).memory(cfg)


def learner_precision(cfg: RelayConfig, spec: EnvSpec | None, address: str | None = None) -> str:
    """What the learner will compute in, for `relay validate` (its family's answer)."""
    return family(cfg).precision(cfg, spec, address)


__all__ = [
    "PreflightError",
    "check_config",
    "check_env",
    "check_language",
    "choices",
    "learner_memory",
    "learner_precision",
    "preflight",
]
