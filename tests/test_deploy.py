"""deploy/: the cluster-launcher configs pass Ray's own schema; KubeRay manifests carry what relay needs."""

import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

DEPLOY = Path(__file__).parents[1] / "deploy"


@pytest.mark.parametrize("name", ["cluster.yaml", "cluster-gpu.yaml"])
def test_cluster_configs_validate_against_rays_autoscaler_schema(name):
    config = yaml.safe_load((DEPLOY / name).read_text())
    validate_config(prepare_config(config))  # what `ray up` does: fill defaults, then check
    types = config["available_node_types"]
    assert config["head_node_type"] in types
    rollout = types["rollout.cpu"]
    assert rollout["max_workers"] > rollout["min_workers"]  # autoscaled
    assert set(rollout["resources"]) == {"CPU"}  # rollout nodes are CPU only


def test_npu_node_type_declares_the_npu_resource_by_hand():
    config = yaml.safe_load((DEPLOY / "cluster.yaml").read_text())
    npu = config["available_node_types"]["learner.npu"]
    assert npu["resources"]["NPU"] == 8
    assert any("torch_npu" in cmd for cmd in npu["worker_setup_commands"])


def test_schema_check_is_not_vacuous():
    config = yaml.safe_load((DEPLOY / "cluster.yaml").read_text())
    config["available_node_types"]["rollout.cpu"]["max_wrokers"] = 3
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(config))


def _worker_groups(doc: dict) -> dict[str, dict]:
    spec = doc["spec"].get("rayClusterSpec", doc["spec"])
    assert spec["enableInTreeAutoscaling"] is True
    return {g["groupName"]: g for g in spec["workerGroupSpecs"]}


@pytest.mark.parametrize("name", ["raycluster.yaml", "rayjob.yaml"])
def test_kuberay_manifests(name):
    doc = yaml.safe_load((DEPLOY / "kuberay" / name).read_text())
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] in ("RayCluster", "RayJob")
    groups = _worker_groups(doc)
    rollout, npu = groups["rollout-cpu"], groups["learner-npu"]
    assert rollout["maxReplicas"] > rollout["minReplicas"]
    limits = npu["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["huawei.com/Ascend910"] == 8
    # rayStartParams.resources is a JSON object inside a quoted string: '"{\"NPU\": 8}"'
    raw = npu["rayStartParams"]["resources"]
    assert json.loads(json.loads(raw)) == {"NPU": 8}
    if doc["kind"] == "RayJob":
        assert doc["spec"]["entrypoint"].startswith("python -m relay_rl.services.train ")


def test_grafana_dashboard_queries_relays_metrics():
    from relay_rl.services.runs.metric_keys import catalog

    dash = json.loads((DEPLOY / "grafana" / "relay-learner.json").read_text())
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    for key in catalog().charted_keys:
        assert f"ray_relay_{key}{{" in exprs, key
    assert 'run=~"$run"' in exprs and dash["templating"]["list"][1]["name"] == "run"


@pytest.mark.parametrize("name", ["cluster.yaml", "cluster-gpu.yaml"])
def test_launcher_clusters_start_with_token_authentication(name):
    """Ray binds its services on every interface; the token is what keeps other hosts out."""
    config = yaml.safe_load((DEPLOY / name).read_text())
    starts = [
        c for c in config["head_start_ray_commands"] + config["worker_start_ray_commands"] if "ray start" in c
    ]
    assert starts and all(c.startswith("RAY_AUTH_MODE=token ray start") for c in starts)
    assert config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"


@pytest.mark.parametrize("name", ["raycluster.yaml", "rayjob.yaml"])
def test_kuberay_pods_run_with_token_authentication(name):
    doc = yaml.safe_load((DEPLOY / "kuberay" / name).read_text())
    spec = doc["spec"].get("rayClusterSpec", doc["spec"])
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    for group in groups:
        for container in group["template"]["spec"]["containers"]:
            env = {e["name"]: e for e in container["env"]}
            assert env["RAY_AUTH_MODE"]["value"] == "token"
            assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {
                "name": "relay-ray-token",
                "key": "auth_token",
            }


def test_serve_config_passes_serves_schema_and_relays_options():
    """deploy/serve.yaml: what `serve run` / `serve deploy` validate, with args `relay serve` accepts."""
    from ray.serve.schema import ServeDeploySchema

    from relay_rl.services.serving.app import ServeArgs

    config = yaml.safe_load((DEPLOY / "serve.yaml").read_text())
    schema = ServeDeploySchema.model_validate(config)
    app = schema.applications[0]
    assert app.import_path == "relay_rl.services.serving.app:build"
    ServeArgs.model_validate(app.args)
    assert config["http_options"]["host"] == "127.0.0.1"
    config["applications"][0]["args"]["replicas"] = 0
    with pytest.raises(ValueError):
        ServeArgs.model_validate(config["applications"][0]["args"])
