"""Every shipped config names an env that exists on every gymnasium the requirements allow."""

import json
import re
import subprocess
import sys
from pathlib import Path

import gymnasium
import pytest
import yaml

ROOT = Path(__file__).parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def _floor() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    m = re.search(r'"gymnasium>=([0-9.]+)"', text)
    assert m, "pyproject.toml names no gymnasium floor"
    return m.group(1)


def _gymnasium_ids() -> dict[str, str]:
    """{config file: env id} for configs whose env is one of gymnasium's own (not a plugin's)."""
    own = {k for k, spec in gymnasium.registry.items() if str(spec.entry_point).startswith("gymnasium.")}
    # A language run's config (model.kind: causal_lm) names no env.
    ids = {p.name: (yaml.safe_load(p.read_text()).get("env") or {}).get("id") for p in CONFIGS}
    return {name: env for name, env in ids.items() if env in own}


@pytest.mark.e2e
def test_shipped_gymnasium_ids_exist_on_the_lowest_allowed_gymnasium(tmp_path):
    """Installs the floor version beside the venv (no deps: it is pure Python) and asks its
    registry; configs/taxi_ppo.yaml named Taxi-v4 while gymnasium>=1.1 allowed 1.2, which has
    only Taxi-v3."""
    floor = _floor()
    wanted = _gymnasium_ids()
    assert "taxi_ppo.yaml" in wanted and "cartpole_ppo.yaml" in wanted
    target = tmp_path / "gym"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target)]
    subprocess.run([*pip, f"gymnasium=={floor}"], check=True, capture_output=True, timeout=300)
    probe = (
        "import json, sys, gymnasium as g; "
        "print(json.dumps([g.__version__, sorted(set(json.loads(sys.argv[1])) - set(g.registry))]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, json.dumps(sorted(set(wanted.values())))],
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    version, missing = json.loads(out)
    assert tuple(map(int, version.split("."))) == (*map(int, floor.split(".")), 0, 0)[:3]
    assert missing == [], (
        f"gymnasium {floor} lacks {missing} (named by {[n for n, e in wanted.items() if e in missing]})"
    )
