"""The layers, read from the source: contracts at the bottom, the policy layer on them, the learner
and the rollout workers beside each other above it (neither imports the other), the services on
top; no import cycle anywhere (imports inside functions included); function-level imports only
for what is lazy on purpose."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGES = ("contracts", "policy", "learner", "rollout_workers", "services")
# Imported inside functions on purpose: heavy or optional (ray in the device layer, which must
# work without it; onnx and onnxruntime only for export/verify; tensorboard only when enabled;
# ale_py, envpool, minigrid and imageio_ffmpeg (videos) are optional extras; pynvml and acl read a
# CUDA or Ascend device's health where one is; services.serving brings Ray Serve, the serve extra,
# for `relay serve` alone; services.sweep.runner brings Ray Tune and Optuna, the sweep extra, for
# `relay sweep` alone; transformers (with safetensors), peft, accelerate and pyarrow are the llm
# extra, for a language run alone).
LAZY_OK = (
    "transformers",
    "pyarrow",
    "peft",
    "accelerate",
    "safetensors",
    "services.serving",
    "services.sweep.runner",
    "ray",
    "onnx",
    "onnxruntime",
    "tensorboard",
    "torch.utils.tensorboard",
    "torch._inductor",  # seconds to import; only where generation.compile is checked
    "torch_npu",
    "vllm",  # an optional engine, present only on GPU/NPU hosts that installed it
    "ale_py",
    "envpool",
    "minigrid",
    "pettingzoo",
    "supersuit",
    "imageio_ffmpeg",
    "pynvml",
    "acl",
)


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


MODULES = _modules()


def _absolute(path: Path, node: ast.ImportFrom) -> str:
    """The module a `from` import names, by the folders' names (`policy.trunk`): relay's packages
    import each other relatively (`from ...policy.trunk import`), up to `relay_rl`, their parent."""
    if not node.level:
        return node.module or ""
    package = ["relay_rl", *path.relative_to(ROOT).parts[:-1]]
    anchor = package[: len(package) - (node.level - 1)]
    return ".".join([*anchor[1:], *([node.module] if node.module else [])])


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(imported module, inside a function) for every import in the file; `from pkg import x`
    counts as an import of pkg.x when that is a module."""
    tree = ast.parse(path.read_text())
    inside = {
        id(sub)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for sub in ast.walk(node)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in inside) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or node.level):
            module = _absolute(path, node)
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.append((sub if sub in MODULES else module, id(node) in inside))
    return found


def _graph() -> dict[str, set[str]]:
    return {
        name: {m for m, _ in _imports(path) if m in MODULES and m != name} for name, path in MODULES.items()
    }


def _layer(module: str) -> str:
    return module.split(".")[0]


def test_contracts_import_nothing_of_relay():
    for name, deps in _graph().items():
        if _layer(name) == "contracts":
            assert {_layer(d) for d in deps} <= {"contracts"}, (name, deps)


def test_the_policy_layer_imports_only_contracts():
    for name, deps in _graph().items():
        if _layer(name) == "policy":
            assert {_layer(d) for d in deps} <= {"policy", "contracts"}, (name, deps)


def test_learner_and_rollout_workers_never_import_services_or_each_other():
    for name, deps in _graph().items():
        layer = _layer(name)
        if layer in ("learner", "rollout_workers"):
            assert not {d for d in deps if _layer(d) == "services"}, (name, deps)
        if layer == "rollout_workers":
            assert not {d for d in deps if _layer(d) == "learner"}, (name, deps)
        if layer == "learner":
            assert not {d for d in deps if _layer(d) == "rollout_workers"}, (name, deps)


def test_only_the_policy_layer_reads_state_dict_keys_or_model_classes():
    """Weight names ("pi_trunk.net.0.weight") and trunk classes are the policy layer's business:
    no module above it parses the one or checks for the other."""
    pattern = re.compile(
        r"\"(pi_|v_)(trunk|head)\.|normalizer\.(mean|var_sum|steps)\"|TokenTransformer|NatureCNN"
    )
    offenders = [
        name
        for name, path in MODULES.items()
        if _layer(name) not in ("policy",) and pattern.search(path.read_text())
    ]
    assert not offenders, offenders


def test_actor_critic_is_named_above_the_policy_layer_only_where_policies_are_built():
    """#59's count (house-policy-protocol): modules above policy/ work on the EnvPolicy protocol;
    the concrete ActorCritic is named only where a policy file is turned into one (load, the
    ML-Agents importer, the tools' handle): at most three modules."""
    named = sorted(
        name
        for name, path in MODULES.items()
        if _layer(name) != "policy" and re.search(r"\bActorCritic\b", path.read_text())
    )
    assert len(named) <= 3, named
    assert "services.tools.verify" not in named


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        v = todo.pop()
        if v not in seen:
            seen.add(v)
            todo.extend(graph.get(v, ()))
    return seen


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    """The modules that can reach themselves through imports."""
    return sorted(v for v in graph if v in _reachable(graph, v))


def test_no_import_cycles():
    """Over every import, function-level ones included."""
    assert _cycles(_graph()) == []


def test_function_level_imports_are_only_the_lazy_ones():
    offenders = [
        (name, mod)
        for name, path in MODULES.items()
        for mod, inside in _imports(path)
        if inside and not mod.startswith(LAZY_OK)
    ]
    assert not offenders, offenders


def test_the_checks_are_not_vacuous():
    """The cycle finder finds a cycle, and the graph holds the edges the layer rules read."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c"]
    graph = _graph()
    assert "contracts.config" in graph["learner.learner"]
    assert "policy.models" in graph["rollout_workers.sampler_core"]
    assert "services.driver.loop" in graph["services.driver.learner_group"]


def test_relay_is_one_namespace():
    """Installed, relay is `relay_rl.*` alone: no module imports a sibling package by a top-level
    name (`from contracts.config import`), which would need `contracts` in site-packages, where a
    PyPI package or a user's folder of that name collides with it (PyContracts ships `contracts`)."""
    absolute = [
        f"{name}: {node.module or alias.name}"
        for name, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom) and not getattr(node, "level", 0)
        for alias in node.names
        if (node.module if isinstance(node, ast.ImportFrom) else alias.name or "").split(".")[0] in PACKAGES
    ]
    assert absolute == []
    import relay_rl.contracts.config as config

    assert config.__name__ == "relay_rl.contracts.config"
    assert {p.name for p in (ROOT / "relay_rl").iterdir() if p.is_symlink()} == set(PACKAGES)


# services/ on floors: run storage at the bottom (files, run directories, checkpoints, metric sinks
# and readers, sweep records, trackers, signal handling), policy artifacts above it (tools/: load,
# export, verify), orchestration above that (driver/: preflight, cluster, backends, the loop), the
# applications on top (the commands, the dashboard, serving, sweeps). A floor imports its own and
# the ones below, never one above. The longest prefix decides a module's floor.
SERVICE_FLOORS: dict[str, int] = {
    "services": 3,  # services/__init__.py
    "services.runs": 0,  # one folder: files, run directories, checkpoints, sinks, records, signals
    "services.tracking": 0,
    "services.tools": 1,
    "services.driver": 2,
    "services.driver.run": 3,  # `relay train` / `relay resume`: a command
    "services.cli": 3,
    "services.train": 3,
    "services.validate": 3,
    "services.dashboard": 3,
    "services.serving": 3,
    "services.sweep": 3,
}


def floor_of(module: str) -> int:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in SERVICE_FLOORS:
            return SERVICE_FLOORS[prefix]
    raise KeyError(module)


def test_services_stand_on_floors():
    """Every import inside services/ goes to the same floor or one below (function-level ones
    included), so storage never reaches up into the loop and the loop never into a command."""
    upward = [
        (name, floor_of(name), dep, floor_of(dep))
        for name, deps in _graph().items()
        if _layer(name) == "services"
        for dep in deps
        if _layer(dep) == "services" and floor_of(dep) > floor_of(name)
    ]
    assert upward == [], upward
    assert floor_of("services.driver.loop") == 2 and floor_of("services.runs.run_dir") == 0
    # the floors are folders: floor 0 is services/runs/ and the trackers (services/tracking/)
    bottom = {name for name in MODULES if name.startswith("services.") and floor_of(name) == 0}
    assert bottom == {name for name in MODULES if name.startswith(("services.runs", "services.tracking"))}


# The families of runs (services/driver/families): modules that belong to one family, whose
# code runs only in its runs, and the family registry itself. Every other module is shared and
# asks the family's entry (or a registry the family chose), never which family it runs.
FAMILY_OWN = (
    "services.driver.families",  # the registry and its entries
    "learner.lm",  # the language learner, its estimators and losses
    "services.driver.lm_backend",
    "services.tools.export_hf",
    "services.tools.evaluate_lm",
    "policy.causal_lm",
    "policy.models.causal_lm",
    "policy.lm_decoding",
    "policy.vllm_decoding",
    "rollout_workers.lm",  # generators, rewards, reward actors, round collection
)
# What reads a run's family: its attribute, the family names, the language model kind.
FAMILY_ATTRS = {"family", "language"}
FAMILY_NAMES = {"ENV_FAMILY", "LANGUAGE_FAMILY", "MODEL_FAMILIES", "LANGUAGE_KIND"}


def _reads_family(node: ast.AST) -> bool:
    return any(
        (isinstance(sub, ast.Attribute) and sub.attr in FAMILY_ATTRS)
        or (isinstance(sub, ast.Name) and sub.id in FAMILY_NAMES)
        or (isinstance(sub, ast.Constant) and sub.value == "causal_lm")
        for sub in ast.walk(node)
    )


def family_branches(path: Path) -> list[int]:
    """Lines of `path` that branch on a run's family: an if/elif/while/ternary/comprehension
    condition or a comparison that reads it (asserts, which check and never branch, aside)."""
    tree = ast.parse(path.read_text())
    asserted = {id(sub) for node in ast.walk(tree) if isinstance(node, ast.Assert) for sub in ast.walk(node)}
    lines = []
    for node in ast.walk(tree):
        if id(node) in asserted:
            continue
        tests: list[ast.AST] = []
        if isinstance(node, ast.If | ast.IfExp | ast.While):
            tests = [node.test]
        elif isinstance(node, ast.comprehension):
            tests = list(node.ifs)
        elif isinstance(node, ast.Compare | ast.Match):
            tests = [node]
        if any(_reads_family(t) for t in tests):
            lines.append(node.lineno if hasattr(node, "lineno") else tests[0].lineno)  # type: ignore[attr-defined]
    return sorted(set(lines))


def test_no_shared_module_branches_on_the_family():
    """#59: the family registry answers what differs between an env run and a language run, so a
    shared module never asks which it runs (there were ten such branches in seven modules)."""
    shared = {
        name: path for name, path in MODULES.items() if not any(name.startswith(own) for own in FAMILY_OWN)
    }
    branches = {name: lines for name, path in shared.items() if (lines := family_branches(path))}
    assert branches == {}, branches
    # not vacuous: the registry's own check is found
    assert family_branches(MODULES["services.driver.families"])
    probe = ROOT / "tests" / "data_family_probe.py"
    try:
        probe.write_text("def f(cfg):\n    return 1 if cfg.language else 2\n")
        assert family_branches(probe) == [2]
    finally:
        probe.unlink()


def test_every_package_folder_is_a_regular_package():
    """Every folder of relay's code has its `__init__.py`: a folder without one still imports here
    (as a namespace package), so nothing but a fresh clone or a job's uploaded working directory
    would notice it missing (services/runs/'s was never committed: .gitignore's `runs/` matched
    it, and `ray job submit` left the whole folder out)."""
    folders = {path.parent for path in MODULES.values()}
    missing = sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").is_file())
    assert missing == []
    import subprocess

    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", *(str(p) for p in MODULES.values())],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert ignored == []  # no file of relay's code matches a .gitignore pattern


LEARNER_RANK_NAMES = re.compile(
    r"\b(LearnerActor|LanguageLearnerActor|create_learner_actor|join_group|rendezvous)\b"
)
# where a learner rank is defined, and the one place that creates and joins them
LEARNER_RANK_OWNERS = ("learner.actor", "learner.rank", "learner.lm.actor", "services.driver.learner_group")


def test_only_the_learner_group_creates_and_joins_learner_ranks():
    """#59: one learner group for both families. Creation, placement and the rendezvous of learner
    actors happen in services/driver/learner_group.py alone (the env backend and the language
    backend each did them their own way before)."""
    named = {
        name: [n for n, s in enumerate(path.read_text().splitlines(), 1) if LEARNER_RANK_NAMES.search(s)]
        for name, path in MODULES.items()
        if name not in LEARNER_RANK_OWNERS
    }
    assert {name: lines for name, lines in named.items() if lines} == {}
    assert LEARNER_RANK_NAMES.search(MODULES["services.driver.learner_group"].read_text())  # not vacuous
