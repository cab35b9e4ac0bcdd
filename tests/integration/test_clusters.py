"""Signals and clusters with real Ray: SIGTERM and SIGHUP stop a Ray-mode run cleanly and leaves no Ray
process behind; Ctrl-C while Ray starts exits 130 with one line and nothing running; an address
nobody answers is refused in seconds; actors that cannot be placed are reported, then refused.

Each subprocess gets its own RAY_TMPDIR, so the Ray processes it starts are the ones whose
command lines name that folder.
"""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray

from relay_rl.services.cli import main
from relay_rl.services.driver import cluster
from relay_rl.services.runs.checkpoints import load_newest_valid
from tests.helpers_proc import ROOT, metrics_lines, processes_mentioning, ray_env, start_train, wait_for

pytestmark = pytest.mark.ray


@pytest.mark.parametrize(
    ("sig", "code", "word"), [(signal.SIGTERM, 143, "terminated"), (signal.SIGHUP, 129, "hangup")]
)
def test_sigterm_and_sighup_stop_a_ray_run_cleanly_and_leave_no_ray_process(
    tmp_path, ray_tmp, sig, code, word
):
    """SIGHUP (a closed terminal, a dropped ssh session) stops exactly as SIGTERM does."""
    run = tmp_path / "run"
    proc = start_train(run, "rollout.num_workers=2", "checkpoint.interval=1000", env=ray_env(ray_tmp))
    wait_for(lambda: len(metrics_lines(run)) >= 3, 180, "three iterations")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert f"stopped: {word}" in err
    lines = metrics_lines(run)
    assert load_newest_valid(run / "checkpoints")[1].counters.iteration == lines[-1]["iteration"]
    wait_for(lambda: not processes_mentioning(ray_tmp), 30, "Ray's processes to end")


def test_ctrl_c_while_ray_starts_is_one_line_exit_130_and_nothing_left_running(tmp_path, ray_tmp):
    run = tmp_path / "run"
    proc = start_train(run, "rollout.num_workers=2", env=ray_env(ray_tmp))
    # Ray's session folder appears as ray.init begins starting its processes.
    wait_for(lambda: any(Path(ray_tmp).rglob("session_*")), 120, "Ray to start")
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    relay_lines = [x for x in err.strip().splitlines() if x.startswith("relay")]
    assert relay_lines == ["relay train: interrupted"], err
    assert "Traceback" not in err
    assert not run.exists()
    wait_for(lambda: not processes_mentioning(ray_tmp), 30, "Ray's processes to end")


def test_an_address_nobody_answers_is_refused_in_seconds(tmp_path):
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "relay_rl.services.cli",
            "train",
            "configs/cartpole_ppo.yaml",
            "--run-dir",
            str(tmp_path / "run"),
            "--address",
            "127.0.0.1:1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert (
        proc.stderr.strip() == "relay train: cannot reach a Ray cluster at 127.0.0.1:1 (Connection refused)"
    )
    assert time.perf_counter() - t0 < 30 and not (tmp_path / "run").exists()


def test_unplaceable_actors_are_reported_then_refused_naming_what_is_missing(
    local_ray, tmp_path, capsys, monkeypatch
):
    """The module's cluster has 4 CPUs; a learner and 4 one-CPU workers need 5."""
    monkeypatch.setattr(cluster, "REPORT_S", 1.0)
    free_before = ray.available_resources().get("CPU")
    run = tmp_path / "run"
    # 15 s: the learner alone takes ~3 s to start here (more on a loaded machine) before the
    # workers' wait is reported.
    sets = ["rollout.num_workers=4", "rollout.placement_timeout_s=15", "learner.buffer_size=4096"]
    code = main(
        [
            "train",
            "configs/cartpole_ppo.yaml",
            "--run-dir",
            str(run),
            *(x for kv in sets for x in ("--set", kv)),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert any(x.startswith("relay: waiting") and "rollout worker" in x and "CPU 4" in x for x in err), err
    assert err[-1].startswith("relay train: 1 rollout worker (CPU 1) could not be placed within ")
    assert "they need CPU 1 and the cluster has CPU 4 (0 free)" in err[-1]
    assert "rollout.placement_timeout_s=null" in err[-1]
    assert not run.exists()  # nothing created for a run that could not start
    wait_for(lambda: ray.available_resources().get("CPU") == free_before, 30, "the placed actors to be freed")


def test_a_local_run_starts_ray_with_token_authentication(ray_tmp):
    """Ray binds its services on every interface; the token is what keeps other hosts out.
    (Ray has no public query for the mode, hence its internal one.)"""
    code = (
        "import ray; from relay_rl.contracts.config import build_config; "
        "from relay_rl.services.driver.cluster import init_ray; "
        "init_ray(build_config({}), None); "
        "from ray._raylet import AuthenticationMode, get_authentication_mode; "
        "print('mode', get_authentication_mode() == AuthenticationMode.TOKEN); ray.shutdown()"
    )
    env = {k: v for k, v in ray_env(ray_tmp).items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert "mode True" in proc.stdout, proc.stderr
