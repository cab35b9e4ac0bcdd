"""`relay serve` latency and throughput: batch-1 requests from 127.0.0.1 at concurrency 1, 8 and
32 (a closed loop: each client sends its next request when the last is answered), for a CartPole
policy and the Huggy-size MLP (59 -> 3 x 512 -> 21, the ML-Agents-shaped graph the tests build),
on the torch and onnxruntime runtimes; beside them the in-process onnxruntime call (the floor).

    pip install -e ".[cpu,dev]"
    python benchmarks/serve.py [--seconds 8]

One Ray Serve application at a time (1 replica, --max-batch-size 32, --batch-wait-ms 2), on this
machine's cores shared by client, proxy and replica.
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

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))
from common import machine_header, table

CONCURRENCY = (1, 8, 32)


def _cartpole_checkpoint(folder: Path) -> Path:
    from services.cli import main
    from services.driver.checkpoints import list_checkpoints

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


def _floor(path: Path, calls: int = 3000) -> tuple[float, float]:
    """p50, p99 ms of one in-process onnxruntime call on a batch-1 observation (relay's export)."""
    import onnxruntime as ort

    from services.tools.export import onnx_bytes
    from services.tools.load import load_policy

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


async def _closed_loop(url: str, obs_dim: int, concurrency: int, seconds: float) -> dict[str, float]:
    import aiohttp

    latencies: list[float] = []
    batches: list[int] = []
    body = json.dumps({"obs": [0.1] * obs_dim}).encode()
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="per concurrency level")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    import ray
    from ray import serve

    from services.serving.app import build

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        policies = {
            "CartPole MLP (4 -> 64x64 -> 2)": _cartpole_checkpoint(folder),
            "Huggy MLP (59 -> 3x512 -> 21)": _huggy(folder),
        }
        dims = {"CartPole MLP (4 -> 64x64 -> 2)": 4, "Huggy MLP (59 -> 3x512 -> 21)": 59}
        floors = {name: _floor(path) for name, path in policies.items()}
        ray.init(include_dashboard=False, logging_level="ERROR")
        serve.start(
            http_options={"host": "127.0.0.1", "port": 8765},
            logging_config={"log_level": "ERROR", "enable_access_log": False},
        )
        rows, checks = [], []
        for name, path in policies.items():
            for runtime in ("torch", "onnxruntime"):
                serve.run(
                    build({"model": str(path), "runtime": runtime, "device": "cpu"}),
                    name="bench",
                    logging_config={"log_level": "ERROR", "enable_access_log": False},
                )
                results = {}
                for c in CONCURRENCY:
                    r = asyncio.run(_closed_loop("http://127.0.0.1:8765/act", dims[name], c, args.seconds))
                    results[c] = r
                    rows.append(
                        [
                            name,
                            runtime,
                            c,
                            r["rps"],
                            r["p50"],
                            r["p95"],
                            r["p99"],
                            f"{r['batch_mean']:.1f} / {r['batch_max']}",
                        ]
                    )
                    print(
                        f"... {name} {runtime} c={c}: {r['rps']:.0f} req/s, p99 {r['p99']:.1f} ms",
                        file=sys.stderr,
                    )
                serve.delete("bench")
                scale = results[32]["rps"] / results[1]["rps"]
                ratio = results[8]["p99"] / floors[name][1]
                checks.append(
                    [
                        name,
                        runtime,
                        f"{scale:.1f}x",
                        "met" if scale >= 5 else "missed",
                        f"{ratio:.0f}x",
                        "met" if ratio <= 5 else "missed",
                    ]
                )
        serve.shutdown()
        ray.shutdown()
    print(
        machine_header(
            "relay serve: batch-1 requests from 127.0.0.1, closed loop, 1 replica, max batch 32, wait 2 ms"
        )
    )
    print(
        table(
            ["policy", "runtime", "concurrency", "req/s", "p50 ms", "p95 ms", "p99 ms", "batch mean / max"],
            rows,
        )
    )
    print()
    print(
        table(
            ["policy", "in-process onnxruntime p50 ms", "p99 ms"],
            [[n, f[0], f[1]] for n, f in floors.items()],
        )
    )
    print()
    print(
        table(
            [
                "policy",
                "runtime",
                "req/s c32 / c1",
                "target >= 5x",
                "p99 c8 / in-process p99",
                "target <= 5x",
            ],
            checks,
        )
    )


if __name__ == "__main__":
    main()
