"""`relay serve` as users run it: a real process on a real local Ray with real Ray Serve, 2,000
concurrent requests while `--follow` swaps the weights, bad requests mid-load, a clean stop on
SIGTERM; and the Serve application itself (`build`, as `serve run deploy/serve.yaml` uses it)
serving an ML-Agents export with onnxruntime on two replicas."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import onnxruntime as ort
import psutil
import pytest

from relay_rl.services.runs.checkpoints import list_checkpoints
from tests.helpers import hold_back_checkpoints, train_local
from tests.helpers_proc import wait_for
from tests.services.test_mlagents_import import MLAGENTS_EXPORTS

pytestmark = pytest.mark.ray
ROOT = Path(__file__).parents[2]
# In flight at once: enough for @serve.batch to form batches and for the follow watcher (0.5 s
# polls) to swap weights under load, at ~30 answers a second through Serve's proxy on 2 cores
# (2,000 took 63 s alone and 200 s in a loaded CI run)
REQUESTS = 600


async def _post(session, url, payload) -> tuple[int, dict]:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    async with session.post(url, data=data) as response:
        return response.status, json.loads(await response.read())


async def _load(url: str, during, newer_than: int) -> list[tuple[int, dict]]:
    """REQUESTS batch-1 requests in flight at once; `during` runs once a quarter have answered.
    Waves of REQUESTS more follow until an answer carries a weights version above `newer_than`
    (at most 120 s): the follow poller swaps on its own clock, which a loaded CI machine
    stretched past the first wave's end (every answer still on the old version)."""
    done = 0

    async def one(i: int) -> tuple[int, dict]:
        nonlocal done
        obs = np.random.default_rng(i).standard_normal(4).tolist()
        answer = await _post(session, url, {"obs": obs, "deterministic": i % 2 == 0, "seed": i})
        done += 1
        return answer

    async def trigger() -> None:
        while done < REQUESTS // 4:
            await asyncio.sleep(0.01)
        await during(session)

    connector = aiohttp.TCPConnector(limit=REQUESTS)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=600)
    ) as session:
        results = list(await asyncio.gather(*(one(i) for i in range(REQUESTS)), trigger()))[:-1]
        deadline = time.monotonic() + 120
        while max(body.get("weights_version", -1) for _, body in results) <= newer_than:
            if time.monotonic() > deadline:
                break
            results += await asyncio.gather(*(one(i) for i in range(len(results), len(results) + REQUESTS)))
    return results


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A CartPole run whose later checkpoints are held back, to land while the server is loaded."""
    root = tmp_path_factory.mktemp("serve")
    run = root / "run"
    sets = ["learner.buffer_size=512", "stop.env_steps=2560", "checkpoint.interval=2", "checkpoint.keep=5"]
    assert train_local("cartpole_ppo.yaml", run, *sets) == 0
    held = root / "held"
    hold_back_checkpoints(run, held)
    return run, held


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_relay_serve_follow_under_load_bad_requests_and_clean_stop(run_dir):
    run, held = run_dir
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "relay_rl.services.cli", "serve", str(run), "--follow", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(base) or proc.poll() is not None, 240, "relay serve to answer /healthz")
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        meta = json.loads(_get(f"{base}/metadata"))
        assert meta["obs_shape"] == [4] and meta["action"] == {"kind": "discrete", "size": 2}
        assert meta["follow"] is True and meta["runtime"] == "torch" and len(meta["fingerprint"]) == 64
        first_version = meta["weights_version"]
        newest = sorted(held.iterdir())[-1]

        async def during(session) -> None:
            # A newer checkpoint lands (atomically, as relay writes them) and bad requests arrive.
            shutil.move(newest, run / "checkpoints" / newest.name)
            bad = [
                b"not json",
                b'{"no_obs": 1}',
                b'{"obs": [1, 2, 3]}',
                b'{"obs": [1, NaN, 3, 4]}',
                b'{"obs": [' + b"0.5, " * 300_000 + b"0]}",  # > 1 MB
            ]
            answers = await asyncio.gather(*(_post(session, f"{base}/act", b) for b in bad))
            assert [status for status, _ in answers] == [400, 400, 400, 400, 413]
            assert all(set(body) == {"error"} for _, body in answers)

        results = asyncio.run(_load(f"{base}/act", during, first_version))
        assert [status for status, _ in results] == [200] * len(results)  # nothing dropped
        versions = [body["weights_version"] for _, body in results]
        assert set(versions) >= {first_version} and max(versions) > first_version  # swapped mid-load
        assert all(len(body["actions"]) == 1 and body["actions"][0] in (0, 1) for _, body in results)
        assert max(body["batch_requests"] for _, body in results) > 1  # @serve.batch formed batches
        # A seeded sampled request gets the same bits in a crowd as alone.
        alone, crowded = asyncio.run(_seeded_alone_and_in_a_crowd(f"{base}/act"))
        assert (
            alone["weights_version"] == crowded["weights_version"] and alone["actions"] == crowded["actions"]
        )
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children  # Ray's processes, the replica among them
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 143, err[-2000:]
    assert "relay serve: stopped (terminated)" in err
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, [p.pid for p in alive]  # nothing left running


async def _seeded_alone_and_in_a_crowd(url: str) -> tuple[dict, dict]:
    seeded = {"obs": [[0.1, -0.2, 0.03, 0.4]] * 3, "deterministic": False, "seed": 12345}
    async with aiohttp.ClientSession() as session:
        _, alone = await _post(session, url, seeded)
        crowd = [_post(session, url, {"obs": [0.0, 0.0, 0.0, 0.0]}) for _ in range(100)]
        answers = await asyncio.gather(*crowd[:50], _post(session, url, seeded), *crowd[50:])
    return alone, answers[50][1]


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


def _ready(base: str) -> bool:
    try:
        return json.loads(_get(f"{base}/healthz"))["status"] == "ok"
    except Exception:
        return False


def test_serve_application_runs_an_mlagents_export_on_two_onnxruntime_replicas(tmp_path):
    """A real ML-Agents export on the application `serve run deploy/serve.yaml` builds, started
    here with serve.run."""
    import ray
    from ray import serve

    from relay_rl.services.serving.app import build

    path = tmp_path / "Huggy.onnx"  # written by ML-Agents 1.1.0's own exporter (tests/services/data)
    path.write_bytes((MLAGENTS_EXPORTS / "continuous_normalized.onnx").read_bytes())
    port = _free_port()
    ray.init(address="local", num_cpus=4, include_dashboard=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build({"model": str(path), "runtime": "onnxruntime", "replicas": 2}), name="relay")
        obs = np.random.default_rng(0).standard_normal((8, 59)).astype(np.float32) * 30
        want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
            ["deterministic_continuous_actions"], {"obs_0": obs}
        )[0]

        async def ask() -> list[tuple[int, dict]]:
            async with aiohttp.ClientSession() as session:
                return await asyncio.gather(
                    *(
                        _post(session, f"http://127.0.0.1:{port}/act", {"obs": obs.tolist()})
                        for _ in range(64)
                    )
                )

        answers = asyncio.run(ask())
        assert all(status == 200 for status, _ in answers)
        for _, body in answers:
            assert np.abs(np.array(body["actions"]) - want).max() <= 1e-5
        meta = json.loads(_get(f"http://127.0.0.1:{port}/metadata"))
        assert meta["runtime"] == "onnxruntime" and meta["source"] == "Huggy.onnx"
        status = serve.status().applications["relay"].deployments["relay-policy"]
        assert status.replica_states.get("RUNNING") == 2
    finally:
        serve.shutdown()
        ray.shutdown()
    time.sleep(0.1)


def test_serve_run_accepts_the_shipped_config(run_dir, tmp_path):
    """`serve run deploy/serve.yaml`, Ray Serve's own CLI, with the model and port edited as a
    user would: it serves, and Ctrl-C stops it."""
    import yaml

    run, _ = run_dir
    config = yaml.safe_load((ROOT / "deploy" / "serve.yaml").read_text())
    port = _free_port()
    config["http_options"]["port"] = port
    config["applications"][0]["args"].update(
        model=str(list_checkpoints(run / "checkpoints")[0]), follow=False
    )
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(config))
    serve_cli = Path(sys.executable).parent / "serve"
    proc = subprocess.Popen(
        [str(serve_cli), "run", str(path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: _ready(f"http://127.0.0.1:{port}") or proc.poll() is not None, 240, "serve run")
        assert proc.poll() is None, proc.communicate()[0][-2000:]
        status, body = asyncio.run(_post_once(f"http://127.0.0.1:{port}/act", {"obs": [0.0, 0.1, 0.0, -0.1]}))
        assert status == 200 and body["actions"][0] in (0, 1)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise


async def _post_once(url: str, payload: dict) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session:
        return await _post(session, url, payload)


def test_serve_application_answers_tree_observations_and_masks(tmp_path):
    """A policy of a Dict observation with an obs mask and MultiDiscrete actions (from start 1 and
    -1) behind real Ray Serve: JSON trees in, the env's actions out, masked choices never
    answered, a bad leaf a 400 naming its path."""
    import ray
    from ray import serve

    from relay_rl.services.serving.app import build

    run = tmp_path / "pick"
    sets = [
        "env.id=tests.rollout_workers.structured_envs:PickEnv",
        "env.num_envs=4",
        "rollout.rollout_len=32",
    ]
    sets += [
        "learner.buffer_size=128",
        "learner.batch_size=64",
        "stop.env_steps=256",
        "stop.episode_return_mean=null",
    ]
    assert train_local("cartpole_ppo.yaml", run, *sets) == 0
    port = _free_port()
    ray.init(address="local", num_cpus=4, include_dashboard=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(
            build({"model": str(list_checkpoints(run / "checkpoints")[-1]), "runtime": "onnxruntime"}),
            name="relay",
        )
        url = f"http://127.0.0.1:{port}/act"
        mask = [1, 1, 1, 0, 0, 1, 0]  # component 1 may only be its third choice (env value 1)
        good = {
            "obs": {"target": [0, 2], "step": [2, 9], "pos": [[0.1, 0.2], [-0.5, 0.5]]},
            "action_mask": [mask, mask],
        }

        async def ask() -> list[tuple[int, dict]]:
            async with aiohttp.ClientSession() as session:
                return await asyncio.gather(
                    *(
                        _post(session, url, {**good, "deterministic": i % 2 == 0, "seed": i})
                        for i in range(16)
                    ),
                    _post(session, url, {"obs": {"target": 3, "step": 2, "pos": [0, 0]}}),
                )

        *answers, (bad_status, bad_body) = asyncio.run(ask())
        assert all(status == 200 for status, _ in answers)
        for _, body in answers:
            actions = np.array(body["actions"])
            assert actions.shape == (2, 2) and (actions[:, 1] == 1).all() and (actions[:, 0] >= 1).all()
        assert bad_status == 400 and '"obs/target"' in bad_body["error"]
        meta = json.loads(_get(f"http://127.0.0.1:{port}/metadata"))
        assert meta["action_mask"] is True and {leaf["path"] for leaf in meta["obs_leaves"]} == {
            "target",
            "step",
            "pos",
        }
    finally:
        serve.shutdown()
        ray.shutdown()
    time.sleep(0.1)


def test_serve_application_carries_a_recurrent_policys_state_per_session(tmp_path):
    """A recurrent policy behind real Ray Serve on two replicas: concurrent clients, each its own
    session, get their state carried call after call (the answers say so) whichever replica
    answers (Serve spreads a session's calls over both: they share one session store), with the
    actions the policy gives stepping each session alone; a 503 never, a missing session 400."""
    import ray
    from ray import serve

    from relay_rl.services.serving.app import build
    from relay_rl.services.serving.service import PolicyService, parse_act

    run = tmp_path / "novel"
    assert (
        train_local("cartpole_novel_lstm_ppo.yaml", run, "stop.env_steps=1024", "learner.buffer_size=256")
        == 0
    )
    ckpt = str(list_checkpoints(run / "checkpoints")[-1])
    port = _free_port()
    ray.init(address="local", num_cpus=4, include_dashboard=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build({"model": ckpt, "replicas": 2}), name="relay")
        url = f"http://127.0.0.1:{port}/act"

        def obs(name: str, step: int) -> list[float]:
            return [0.01 * step * (1 + int(name[1:])), -0.02 * step]

        async def client(session, name: str) -> list[tuple[int, dict]]:
            out = []
            for step in range(8):
                out.append(await _post(session, url, {"obs": obs(name, step), "session": name}))
            return out

        async def ask() -> tuple[list[list[tuple[int, dict]]], tuple[int, dict]]:
            async with aiohttp.ClientSession() as session:
                calls = await asyncio.gather(*(client(session, f"c{i}") for i in range(8)))
                return calls, await _post(session, url, {"obs": [0.0, 0.0]})

        calls, (status, body) = asyncio.run(ask())
        alone = PolicyService(ckpt)  # each session stepped by itself, here

        def locally(session: str, step: int, name: str) -> Any:
            raw = json.dumps({"obs": obs(name, step), "session": session}).encode()
            return alone.act([parse_act(raw, alone.handle)])[0]["actions"]

        spread, state_told = 0, 0
        for i, answers in enumerate(calls):
            assert [s for s, _ in answers] == [200] * 8
            assert [b["state"] for _, b in answers] == ["new"] + ["carried"] * 7
            for step, (_, b) in enumerate(answers):
                assert b["actions"] == locally(f"c{i}", step, f"c{i}"), (i, step)
                # from zeros instead: the carried state changed what the policy did
                state_told += b["actions"] != locally(f"fresh-{i}-{step}", step, f"c{i}")
            spread += len({b["replica"] for _, b in answers}) > 1
        assert spread > 0, "no session's calls reached both replicas"
        assert state_told > 0, "the policy acts the same whatever its state: the check shows nothing"
        assert status == 400 and '"session"' in body["error"]
    finally:
        serve.shutdown()
        ray.shutdown()
    time.sleep(0.1)
