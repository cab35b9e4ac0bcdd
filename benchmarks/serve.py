"""`relay serve` latency and throughput: batch-1 requests from 127.0.0.1 at concurrency 1, 8 and
32 (a closed loop: each client sends its next request when the last is answered), for a CartPole
policy, the Huggy-size MLP (59 -> 3 x 512 -> 21, the ML-Agents-shaped graph the tests build) and
the Nature CNN on Breakout's frames, on the torch and onnxruntime runtimes; beside them, in the
same run, a bare Ray Serve deployment answering a constant (Serve's own per-request floor: relay's
p50 is held to 1.2x of it) and the in-process onnxruntime call.

    pip install -e ".[cpu,dev]"
    python benchmarks/serve.py [--seconds 8] [--wait-ms 2,0]

One Ray Serve application at a time (1 replica, --max-batch-size 32, --batch-wait-ms from
--wait-ms, 2 by default), on this machine's cores shared by client, proxy and replica.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))
from common import machine_header, table

CONCURRENCY = (1, 8, 32)


def _cartpole_checkpoint(folder: Path) -> Path:
    from relay_rl.services.cli import main
    from relay_rl.services.runs.checkpoints import list_checkpoints

    run = folder / "cartpole"
    sets = ["rollout.num_workers=0", "metrics.progress=none", "stop.env_steps=2048"]
    args = ["train", "configs/cartpole_ppo.yaml", "--run-dir", str(run)]
    for kv in sets:
        args += ["--set", kv]
    assert main(args) == 0
    return list_checkpoints(run / "checkpoints")[-1]


def _huggy(folder: Path) -> Path:
    from tests.services.mlagents_like import export_opset9, randomized

    path = folder / "Huggy.onnx"
    path.write_bytes(export_opset9(randomized()))
    return path


def _breakout_cnn(folder: Path) -> Path:
    """A Nature CNN checkpoint for Breakout's [4, 84, 84] uint8 frames (fresh weights: latency does
    not depend on what they learned), written as the training loop writes one."""
    from relay_rl.contracts.checkpoint import RunCounters
    from relay_rl.contracts.config import load_config
    from relay_rl.learner.algorithms import algorithm_traits
    from relay_rl.learner.learner import Learner
    from relay_rl.rollout_workers.sampler import make_sampler
    from relay_rl.services.runs.checkpoints import write_learner_checkpoint

    cfg = load_config(
        "configs/breakout_ppo.yaml", ["rollout.num_workers=0", "env.num_envs=1", "learner.batch_size=128"]
    )
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    learner = Learner(cfg, sampler.spec)
    return write_learner_checkpoint(folder / "cnn", cfg, sampler.spec, learner.state_dict(), RunCounters())


def _constant_app() -> Any:
    """A bare Ray Serve deployment that reads the request and answers a constant: Serve's own
    per-request floor on this machine, with no policy behind it."""
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    @serve.deployment
    class Constant:
        async def __call__(self, request: Request) -> JSONResponse:
            await request.body()
            return JSONResponse({"actions": [0], "batch_requests": 1})

    return Constant.bind()  # type: ignore[attr-defined]


def _floor(path: Path, calls: int = 3000) -> tuple[float, float]:
    """p50, p99 ms of one in-process onnxruntime call on a batch-1 observation (relay's export)."""
    import onnxruntime as ort

    from relay_rl.services.tools.export import onnx_bytes
    from relay_rl.services.tools.load import load_policy

    handle = load_policy(path)
    session = ort.InferenceSession(onnx_bytes(handle), providers=["CPUExecutionProvider"])
    x = handle.as_input(np.zeros((1, *handle.obs_shape)))
    for _ in range(200):
        session.run(None, x)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        session.run(None, x)
        times.append(time.perf_counter() - t0)
    return float(np.percentile(times, 50) * 1e3), float(np.percentile(times, 99) * 1e3)


def _parse_ms(path: Path, body: bytes, calls: int = 300) -> float:
    """p50 ms of reading one request in-process as the replica does: the JSON body parsed and the
    observation checked against the policy (`parse_act`), no HTTP and no model."""
    from relay_rl.services.serving.service import parse_act
    from relay_rl.services.tools.load import load_policy

    handle = load_policy(path)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        parse_act(body, handle)
        times.append(time.perf_counter() - t0)
    return float(np.percentile(times, 50) * 1e3)


async def _closed_loop(url: str, body: bytes, concurrency: int, seconds: float) -> dict[str, float]:
    import aiohttp

    latencies: list[float] = []
    batches: list[int] = []
    deadline = time.perf_counter() + seconds

    async def client(session: aiohttp.ClientSession) -> None:
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            async with session.post(url, data=body) as response:
                answer = json.loads(await response.read())
            assert response.status == 200, answer
            latencies.append(time.perf_counter() - t0)
            batches.append(int(answer["batch_requests"]))

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        for _ in range(20):  # warm the path
            async with session.post(url, data=body) as response:
                await response.read()
        start = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        wall = time.perf_counter() - start
    ms = np.array(latencies) * 1e3
    return {
        "rps": len(latencies) / wall,
        "p50": float(np.percentile(ms, 50)),
        "p95": float(np.percentile(ms, 95)),
        "p99": float(np.percentile(ms, 99)),
        "batch_mean": float(np.mean(batches)),
        "batch_max": int(np.max(batches)),
    }


def _run_levels(url: str, body: bytes, seconds: float, label: str) -> dict[int, dict[str, float]]:
    results = {}
    for c in CONCURRENCY:
        results[c] = r = asyncio.run(_closed_loop(url, body, c, seconds))
        print(f"... {label} c={c}: {r['rps']:.0f} req/s, p50 {r['p50']:.1f} ms", file=sys.stderr)
    return results


def _row(name: str, runtime: str, c: int, r: dict[str, float]) -> list[Any]:
    return [
        name,
        runtime,
        c,
        r["rps"],
        r["p50"],
        r["p95"],
        r["p99"],
        f"{r['batch_mean']:.1f} / {r['batch_max']}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="per concurrency level")
    parser.add_argument(
        "--wait-ms", default="2", help="relay's --batch-wait-ms values, each run for every policy (2,0)"
    )
    args = parser.parse_args()
    try:
        waits = [float(w) for w in args.wait_ms.split(",")]
    except ValueError:
        waits = []
    if not waits or min(waits) < 0:
        print(f"serve.py: --wait-ms {args.wait_ms!r}: comma-separated milliseconds >= 0", file=sys.stderr)
        sys.exit(2)
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    import ray
    from ray import serve

    from relay_rl.services.serving.app import build

    url = "http://127.0.0.1:8765/act"
    quiet = {"log_level": "ERROR", "enable_access_log": False}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        policies = {
            "CartPole MLP (4 -> 64x64 -> 2)": (_cartpole_checkpoint(folder), [0.1] * 4),
            "Huggy MLP (59 -> 3x512 -> 21)": (_huggy(folder), [0.1] * 59),
            "Nature CNN (4x84x84 uint8 -> 4)": (_breakout_cnn(folder), np.zeros((4, 84, 84), int).tolist()),
        }
        floors = {name: _floor(path) for name, (path, _) in policies.items()}
        parses = {
            name: _parse_ms(path, json.dumps({"obs": obs}).encode()) for name, (path, obs) in policies.items()
        }
        ray.init(address="local", include_dashboard=False, logging_level="ERROR")
        serve.start(http_options={"host": "127.0.0.1", "port": 8765}, logging_config=quiet)
        rows, checks = [], []
        serve.run(_constant_app(), name="bench", route_prefix="/", logging_config=quiet)
        bare = _run_levels(url, json.dumps({"obs": [0.1] * 4}).encode(), args.seconds, "constant")
        serve.delete("bench")
        rows += [_row("constant answer (Serve's floor)", "-", c, r) for c, r in bare.items()]
        for name, (path, obs) in policies.items():
            body = json.dumps({"obs": obs}).encode()
            for runtime in ("torch", "onnxruntime"):
                for wait in waits:
                    serve.run(
                        build(
                            {"model": str(path), "runtime": runtime, "device": "cpu", "batch_wait_ms": wait}
                        ),
                        name="bench",
                        logging_config=quiet,
                    )
                    label = f"{runtime}, wait {wait:g} ms"
                    results = _run_levels(url, body, args.seconds, f"{name} {label}")
                    serve.delete("bench")
                    rows += [_row(name, label, c, r) for c, r in results.items()]
                    p50_1, p50_8 = (results[c]["p50"] / bare[c]["p50"] for c in (1, 8))
                    scale = results[32]["rps"] / results[1]["rps"]
                    checks.append(
                        [
                            name,
                            label,
                            f"{p50_1:.2f}x",
                            f"{p50_8:.2f}x",
                            "met" if max(p50_1, p50_8) <= 1.2 else "missed",
                            f"{scale:.1f}x",
                            "met" if scale >= 5 else "missed",
                        ]
                    )
        serve.shutdown()
        ray.shutdown()
    print(
        machine_header(
            "relay serve: batch-1 requests from 127.0.0.1, closed loop, 1 replica, max batch 32, "
            f"batch wait {args.wait_ms} ms, "
            "beside a bare Serve deployment answering a constant"
        )
    )
    head = ["policy", "runtime", "concurrency", "req/s", "p50 ms", "p95 ms", "p99 ms", "batch mean / max"]
    print(table(head, rows))
    print()
    print(
        table(
            ["policy", "in-process onnxruntime p50 ms", "p99 ms", "in-process request parse + check p50 ms"],
            [[n, f[0], f[1], parses[n]] for n, f in floors.items()],
        )
    )
    print()
    head = ["policy", "runtime", "p50 c1 / floor", "p50 c8 / floor", "target <= 1.2x", "req/s c32 / c1"]
    print(table([*head, "target >= 5x"], checks))


if __name__ == "__main__":
    main()
