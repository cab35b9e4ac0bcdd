"""Multi-agent (PettingZoo) benchmarks, each printing a table for docs/benchmarks.md:

    pip install -e ".[cpu,pettingzoo]"
    python benchmarks/multi_agent.py columns [--seconds 20]
    python benchmarks/multi_agent.py selfplay [--env-steps 600000]
    pip install -e ".[cpu,bench,pettingzoo]" && pip install "ray[rllib]==2.60.0"   # a venv of its own
    python benchmarks/multi_agent.py spread [--wall 300] [--only relay,rllib]
    python benchmarks/multi_agent.py groups [--seconds 20] [--env-steps 400000]
    python benchmarks/multi_agent.py mappo [--env-steps 1500000] [--seeds 0,1]
    python benchmarks/multi_agent.py pistonball [--wall 900] [--only relay,rllib]   # bench venv

columns: agent steps/s of one rollout worker's sampler (acting, recording, env) on simple_spread
  with A = 1, 3, 10, 20 agents per env copy at a fixed 240 columns (E = 240 / A copies), the env
  copies' own step and reset timed inside the same run: relay's own cost per agent step (acting,
  recording, the column plumbing: the sampler's time minus the env's) must stay flat as A grows.
selfplay: Connect Four by self-play (configs/connect_four_selfplay.yaml, local mode): the score
  against the random player and against the snapshot pool over training, then the final policy
  against its own snapshot from a quarter of the way in (400 games, seats alternating).
spread: simple_spread (3 agents, 25 steps) for the same wall time: relay (configs/
  simple_spread_ppo.yaml) against RLlib's PPO with one policy shared by the agents; the team
  return (the sum over agents: RLlib's episode_return_mean) against agent steps.
pistonball: butterfly's pistonball (20 pistons, 125 cycles) with SuperSuit's pixel preprocessing
  (one colour channel, 84x84, 3 frames) for the same wall time: relay (benchmarks/configs/
  pistonball_local_critic.yaml, env.preprocess=pixels) against RLlib's PPO with one CNN shared by
  the pistons, the same update; the team return (the sum over pistons) against agent steps.
groups: policy groups. What they cost: a rollout worker's sampler on simple_spread (240 columns)
  with one shared policy, 2 groups and 3 groups (one per agent), side by side in one run. What
  they learn: configs/simple_tag_groups.yaml (predators and prey, 2 workers on Ray), each group's
  return and entropy against env steps.
mappo: simple_spread with a centralized critic (configs/simple_spread_mappo.yaml: each value trunk
  reads the env's global state) against the same config without (each critic sees its own agent's
  observation), seed by seed, one run after the other: the team return at the same agent steps,
  and each run's agent steps/s.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))
from common import machine_header, read_metrics, run_training, table

ROOT = Path(__file__).parents[1]
SPREAD = "pettingzoo:mpe2.simple_spread_v3"
PISTONBALL = "benchmarks/configs/pistonball_local_critic.yaml"  # the local critic, as RLlib's side has


# ---- columns ----------------------------------------------------------------------------------
def _spread_cfg(agents: int, columns: int) -> Any:
    from relay_rl.contracts.config import build_config

    return build_config(
        {},
        [
            f"env.id={SPREAD}",
            f"env.kwargs={{N: {agents}, max_cycles: 25}}",
            f"env.num_envs={columns}",
            "rollout.num_workers=0",
            "rollout.rollout_len=25",
            f"learner.buffer_size={25 * columns}",
            f"learner.batch_size={25 * columns}",
            "model.hidden_sizes=[128,128]",
        ],
    )


class _Timed:
    """A PettingZoo env whose step and reset add their seconds to a shared clock."""

    def __init__(self, env: Any, clock: list[float]) -> None:
        self.env, self.clock = env, clock

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def step(self, actions: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self.env.step(actions)
        finally:
            self.clock[0] += time.perf_counter() - t0

    def reset(self, *a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self.env.reset(*a, **k)
        finally:
            self.clock[0] += time.perf_counter() - t0


def _sampler_split(agents: int, columns: int, seconds: float) -> tuple[float, float]:
    """(agent steps/s of the sampler, the fraction of its time the env copies themselves took):
    the copies' step and reset are timed inside the same run, so relay's own share (acting,
    recording, the column plumbing) is the rest."""
    from relay_rl.learner.algorithms import algorithm_traits
    from relay_rl.rollout_workers.sampler import make_sampler

    cfg = _spread_cfg(agents, columns)
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    clock = [0.0]
    vec = sampler.envs.env
    vec.envs = [_Timed(env, clock) for env in vec.envs]
    sampler.sample()  # warm
    clock[0], steps, t0 = 0.0, 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        steps += sampler.sample().env_steps
    total = time.perf_counter() - t0
    sampler.close()
    return steps / total, clock[0] / total


def columns(args: argparse.Namespace) -> None:
    rows = []
    for agents in (1, 3, 10, 20):
        copies = args.columns // agents
        rate, env_share = _sampler_split(agents, copies * agents, args.seconds)
        own_us = (1 - env_share) / rate * 1e6
        rows.append([agents, copies, copies * agents, rate, env_share, rate / env_share, own_us])
    print(
        machine_header(
            f"multi-agent columns (simple_spread, {args.columns} columns, {args.seconds:.0f} s each)"
        )
    )
    print(
        table(
            [
                "agents A",
                "copies E",
                "columns",
                "sampler agent steps/s",
                "env's share of the time",
                "env alone agent steps/s",
                "relay's own us per agent step",
            ],
            rows,
        )
    )


# ---- selfplay ---------------------------------------------------------------------------------
def _games_against(cfg: Any, run: Path, early: Path, late: Path, games: int) -> float:
    """The late checkpoint's score against the early one: the late policy's sampler with the
    early policy as its whole pool (no random games), stochastic as in training."""
    from relay_rl.learner.algorithms import algorithm_traits
    from relay_rl.rollout_workers.sampler import make_sampler
    from relay_rl.services.tools.load import load_policy

    def weights(path: Path) -> dict[str, Any]:
        return dict(load_policy(path).model.state_dict())

    cfg = cfg.model_copy(
        update={
            "multi_agent": cfg.multi_agent.model_copy(
                update={"self_play": cfg.multi_agent.self_play.model_copy(update={"random_opponent": 0.0})}
            )
        }
    )
    sampler = make_sampler(cfg, algorithm_traits(cfg))
    assert sampler.opponents is not None
    sampler.set_weights(0, weights(early))  # the pool's one snapshot: the early policy
    sampler.fast.load(weights(late))  # the seat: the late policy
    scores: list[float] = []
    while len(scores) < games:
        scores += sampler.sample().episode_stats.get("win_rate_pool", [])
    sampler.close()
    return sum(scores[:games]) / games


def selfplay(args: argparse.Namespace) -> None:
    from relay_rl.contracts.config import load_config
    from relay_rl.services.runs.checkpoints import list_checkpoints

    config = "configs/connect_four_selfplay.yaml"
    sets = [
        "rollout.num_workers=0",
        f"stop.env_steps={args.env_steps}",
        "checkpoint.interval=10",
        "checkpoint.keep=1000",
        "metrics.progress=none",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        _run_relay(config, run, sets)
        lines = read_metrics(run)
        ckpts = list_checkpoints(run / "checkpoints")  # oldest first
        early, late = ckpts[len(ckpts) // 4], ckpts[-1]
        cfg = load_config(ROOT / config)
        score = _games_against(cfg, run, early, late, args.games)
    marks = _marks(lines)
    print(machine_header(f"Connect Four self-play ({config}, local mode, seed 0)"))
    print(
        table(
            ["iteration", "env steps", "wall s", "vs random", "vs pool", "game length", "entropy"],
            [
                [
                    x["iteration"],
                    x["env_steps"],
                    x["wall_s"],
                    x.get("win_rate_random"),
                    x.get("win_rate_pool"),
                    x["episode_len_mean"],
                    x["entropy"],
                ]
                for x in marks
            ],
        )
    )
    print(
        f"\nfinal policy ({late.name}) vs its snapshot {early.name}, {args.games} games, seats alternating: "
        f"score {score:.3f} (win 1, draw 0.5, loss 0)"
    )


def _run_relay(config: str, run: Path, sets: list[str]) -> None:
    cmd = [sys.executable, "-m", "relay_rl.services.train", config, "--run-dir", str(run)]
    for kv in sets:
        cmd += ["--set", kv]
    run_training(cmd, ROOT)


def _relay_lines(config: str, sets: list[str]) -> list[dict[str, Any]]:
    """The metrics lines of a relay run of `config` in a folder that is then removed."""
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        _run_relay(config, run, sets)
        return read_metrics(run)


def _marks(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lines at 0, 10, 25, 50, 75 and 100% of a run."""
    return [lines[min(len(lines) - 1, int(f * (len(lines) - 1)))] for f in (0.0, 0.1, 0.25, 0.5, 0.75, 1.0)]


# ---- spread -----------------------------------------------------------------------------------
def _relay_spread(wall: float) -> list[tuple[float, int, float | None]]:
    sets = [f"stop.wall_s={wall}", "stop.env_steps=100000000", "metrics.progress=none"]
    lines = _relay_lines("configs/simple_spread_ppo.yaml", sets)
    return [(x["wall_s"], x["env_steps"], x.get("team_return_mean")) for x in lines]


def _rllib_spread(wall: float) -> list[tuple[float, int, float | None]]:
    from mpe2 import simple_spread_v3
    from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv

    # relay's round: 2 workers x 24 columns x 50 steps = 2,400 agent steps = 800 env steps;
    # RLlib counts a multi-agent train batch in env steps, its minibatches in agent steps
    return _rllib_shared(
        "spread",
        lambda _: ParallelPettingZooEnv(
            simple_spread_v3.parallel_env(N=3, max_cycles=25, continuous_actions=False)
        ),
        "configs/simple_spread_ppo.yaml",
        800,
        {"fcnet_hiddens": [128, 128]},
        wall,
        envs_per_runner=8,
        cpus=3,
    )


def _rllib_shared(
    name: str,
    make: Any,
    config: str,
    train_batch: int,
    model_config: dict[str, Any],
    wall: float,
    envs_per_runner: int,
    cpus: int,
    count_steps_by: str = "env_steps",
) -> list[tuple[float, int, float | None]]:
    """RLlib's PPO with one policy shared by every agent (2 env runners), relay's update of
    `config` (`train_batch` env steps a round): (seconds, agent steps, team return) per iteration
    for `wall` seconds."""
    import ray
    from common import rllib_ppo_update
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.tune.registry import register_env

    register_env(name, make)
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    try:
        cfg = (
            PPOConfig()
            .environment(name)
            .multi_agent(
                policies={"shared"},
                policy_mapping_fn=lambda agent_id, *a, **k: "shared",
                count_steps_by=count_steps_by,
            )
            .rl_module(
                rl_module_spec=MultiRLModuleSpec(
                    rl_module_specs={"shared": RLModuleSpec(model_config=model_config)}
                )
            )
            .env_runners(num_env_runners=2, num_envs_per_env_runner=envs_per_runner)
            .training(**rllib_ppo_update(config, train_batch=train_batch))
            .debugging(seed=0)
        )
        algo = cfg.build_algo()
        out, t0 = [], time.perf_counter()
        while time.perf_counter() - t0 < wall:
            result = algo.train()
            runners = result.get("env_runners", {})
            agent_steps = runners.get("num_agent_steps_sampled_lifetime", {})
            steps = int(sum(agent_steps.values())) if isinstance(agent_steps, dict) else int(agent_steps or 0)
            out.append((time.perf_counter() - t0, steps, runners.get("episode_return_mean")))
        algo.stop()
        return out
    finally:
        ray.shutdown()


def _at(curve: list[tuple[float, int, float | None]], wall: float) -> tuple[int | None, float | None]:
    """(agent steps, team return) at `wall` seconds: the steps of the last point by then, the last
    return reported by then (RLlib reports NaN for an iteration in which no episode ended)."""
    seen = [c for c in curve if c[0] <= wall]
    returns = [c[2] for c in seen if c[2] is not None and c[2] == c[2]]
    return (seen[-1][1], returns[-1] if returns else None) if seen else (None, None)


def spread(args: argparse.Namespace) -> None:
    runs = {"relay": _relay_spread, "rllib": _rllib_spread}
    _versus("simple_spread (3 agents, 25 steps)", runs, args)


# ---- mappo ------------------------------------------------------------------------------------
def mappo(args: argparse.Namespace) -> None:
    seeds = [int(x) for x in args.seeds.split(",")]
    marks = (0.25, 0.5, 0.75, 1.0)
    curves: dict[tuple[str, int], list[tuple[float, int, float | None]]] = {}
    for seed in seeds:
        for critic, central in (("local", "false"), ("central", "true")):
            sets = [
                f"env.seed={seed}",
                f"stop.env_steps={args.env_steps}",
                f"multi_agent.central_critic={central}",
                "metrics.progress=none",
            ]
            print(f"... {critic} critic, seed {seed}", file=sys.stderr, flush=True)
            lines = _relay_lines("configs/simple_spread_mappo.yaml", sets)
            curves[critic, seed] = [(x["wall_s"], x["env_steps"], x.get("team_return_mean")) for x in lines]
            print(f"... {critic} {seed}: {curves[critic, seed][-1]}", file=sys.stderr, flush=True)
    print(
        machine_header(f"simple_spread (3 agents, 25 steps), local vs centralized critic, seeds {args.seeds}")
    )
    rows = []
    for f in marks:
        steps = int(f * args.env_steps)
        row: list[Any] = [steps]
        for critic in ("local", "central"):
            got = [_by_steps(curves[critic, seed], steps) for seed in seeds]
            row += [sum(got) / len(got), " ".join(f"{g:.1f}" for g in got)]
        rows.append(row)
    rate = {c: [curves[c, s][-1][1] / curves[c, s][-1][0] for s in seeds] for c in ("local", "central")}
    headers = ["agent steps", "local critic", "by seed", "central critic", "by seed"]
    print(table(headers, rows))
    print(
        f"agent steps/s: local {sum(rate['local']) / len(seeds):,.0f}, "
        f"central {sum(rate['central']) / len(seeds):,.0f}"
    )


def _by_steps(curve: list[tuple[float, int, float | None]], steps: int) -> float:
    """The mean of the last 5 team returns reported by `steps` agent steps (the curve is noisy)."""
    seen = [r for _, n, r in curve if n <= steps and r is not None and r == r]
    tail = seen[-5:]
    return sum(tail) / len(tail) if tail else float("nan")


# ---- pistonball -------------------------------------------------------------------------------
def _pistonball_env(channels_first: bool) -> Any:
    """pistonball as relay's env.preprocess=pixels makes it; for RLlib channels last (its CNN's
    layout) and float32 in [0, 1] (relay's CNN scales uint8 frames itself, RLlib's takes floats;
    CleanRL divides by 255 in its network)."""
    import numpy as np
    import supersuit as ss
    from pettingzoo.butterfly import pistonball_v6

    from relay_rl.rollout_workers.preprocess import _pixels

    # rgb_array: pistonball draws its screen (what every observation is cut from) only with a
    # render mode; without one both systems would train on the reset's frame (preprocess.py).
    env = pistonball_v6.parallel_env(continuous=False, max_cycles=125, render_mode="rgb_array")
    if channels_first:
        return _pixels(env)
    env = ss.color_reduction_v0(env, mode="B")
    env = ss.resize_v1(env, 84, 84)
    env = ss.frame_stack_v1(env, 3)
    env = ss.dtype_v0(env, np.float32)
    return ss.normalize_obs_v0(env, env_min=0.0, env_max=1.0)


def _relay_pistonball(wall: float) -> list[tuple[float, int, float | None]]:
    sets = [f"stop.wall_s={wall}", "stop.env_steps=100000000", "metrics.progress=none"]
    lines = _relay_lines(PISTONBALL, sets)
    return [(x["wall_s"], x["env_steps"], x.get("team_return_mean")) for x in lines]


def _rllib_pistonball(wall: float) -> list[tuple[float, int, float | None]]:
    from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv

    # relay's round: 2 workers x 40 columns x 32 steps = 2,560 agent steps (128 env steps), counted
    # in agent steps on both sides (RLlib's minibatch of 640 agent steps must fit in its batch)
    return _rllib_shared(
        "pistonball",
        lambda _: ParallelPettingZooEnv(_pistonball_env(channels_first=False)),
        PISTONBALL,
        2560,
        {
            "conv_filters": [[32, 8, 4], [64, 4, 2], [64, 3, 1]],
            "head_fcnet_hiddens": [512],
            "vf_share_layers": True,
        },
        wall,
        envs_per_runner=2,
        cpus=4,
        count_steps_by="agent_steps",
    )


def pistonball(args: argparse.Namespace) -> None:
    runs = {"relay": _relay_pistonball, "rllib": _rllib_pistonball}
    _versus("pistonball (20 pistons, 125 cycles, pixels 84x84x3)", runs, args)


def _versus(title: str, runs: dict[str, Any], args: argparse.Namespace) -> None:
    """Each system's run of `args.wall` seconds; the agent steps and team return of each at
    quarters of the wall time, side by side."""
    curves = {}
    for system in args.only.split(","):
        print(f"... {system}: {title}, {args.wall:.0f} s", file=sys.stderr, flush=True)
        curves[system] = runs[system](args.wall)
        # each system's curve as soon as it is measured: a later system's failure loses nothing
        points = [(round(t, 1), n, r) for t, n, r in curves[system]]
        print(f"... {system}: {points}", file=sys.stderr, flush=True)
    print(machine_header(f"{title}, {args.wall:.0f} s each, seed 0"))
    rows = []
    for f in (0.25, 0.5, 0.75, 1.0):
        wall = f * args.wall
        row: list[Any] = [wall]
        for system in curves:
            row += list(_at(curves[system], wall))
        rows.append(row)
    headers = ["wall s"]
    for system in curves:
        headers += [f"{system} agent steps", f"{system} team return"]
    print(table(headers, rows))


# ---- groups -----------------------------------------------------------------------------------
def _sampler_rate(cfg: Any, seconds: float) -> float:
    """Agent steps/s of one sampler (of one policy, or of every group's around one env)."""
    from relay_rl.learner.algorithms import algorithm_traits
    from relay_rl.rollout_workers.sampler import make_sampler

    sampler = make_sampler(cfg, algorithm_traits(cfg))

    def steps() -> int:
        out = sampler.sample()
        return sum(s.env_steps for s in out.values()) if isinstance(out, dict) else out.env_steps

    steps()  # warm
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        done += steps()
    rate = done / (time.perf_counter() - t0)
    sampler.close()
    return rate


def groups(args: argparse.Namespace) -> None:
    layouts = {
        "one shared policy": None,
        "2 groups (agent_0; the others)": "{a: [agent_0], b: ['*']}",
        "3 groups (one per agent)": "{a: [agent_0], b: [agent_1], c: [agent_2]}",
    }
    rates = {}
    for _ in range(2):  # interleaved, twice: the machine is shared and noisy
        for label, policies in layouts.items():
            cfg = _spread_cfg(3, 240)
            if policies is not None:
                from relay_rl.contracts.config import build_config

                data = cfg.model_dump(mode="json")
                cfg = build_config(data, [f"multi_agent.policies={policies}"])
            rates.setdefault(label, []).append(_sampler_rate(cfg, args.seconds))
    base = max(rates["one shared policy"])
    print(
        machine_header(
            f"policy groups: sampler cost (simple_spread, 3 agents, 240 columns, {args.seconds:.0f} s x 2)"
        )
    )
    print(
        table(
            ["layout", "agent steps/s (best of 2)", "vs one shared policy"],
            [[label, max(r), max(r) / base] for label, r in rates.items()],
        )
    )
    sets = [f"stop.env_steps={args.env_steps}", "metrics.progress=none", "checkpoint.interval=1000"]
    marks = _marks(_relay_lines("configs/simple_tag_groups.yaml", sets))
    print()
    print(
        machine_header(
            "simple_tag, a policy group per kind (configs/simple_tag_groups.yaml, 2 workers, seed 0)"
        )
    )
    print(
        table(
            [
                "iteration",
                "agent steps",
                "wall s",
                "predator return",
                "prey return",
                "predator entropy",
                "prey entropy",
            ],
            [
                [
                    x["iteration"],
                    x["env_steps"],
                    x["wall_s"],
                    x.get("policy_return_mean/predator"),
                    x.get("policy_return_mean/prey"),
                    x.get("policy/predator/entropy"),
                    x.get("policy/prey/entropy"),
                ]
                for x in marks
            ],
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    c = sub.add_parser("columns")
    c.add_argument("--seconds", type=float, default=20.0)
    c.add_argument("--columns", type=int, default=240)
    s = sub.add_parser("selfplay")
    s.add_argument("--env-steps", type=int, default=600_000)
    s.add_argument("--games", type=int, default=400)
    p = sub.add_parser("spread")
    p.add_argument("--wall", type=float, default=300.0)
    p.add_argument("--only", default="relay,rllib")
    pb = sub.add_parser("pistonball")
    pb.add_argument("--wall", type=float, default=900.0)
    pb.add_argument("--only", default="relay,rllib")
    g = sub.add_parser("groups")
    g.add_argument("--seconds", type=float, default=20.0)
    g.add_argument("--env-steps", type=int, default=400_000)
    m = sub.add_parser("mappo")
    m.add_argument("--env-steps", type=int, default=1_500_000)
    m.add_argument("--seeds", default="0,1")
    args = parser.parse_args()
    what = {
        "columns": columns,
        "selfplay": selfplay,
        "spread": spread,
        "groups": groups,
        "pistonball": pistonball,
        "mappo": mappo,
    }
    what[args.what](args)


if __name__ == "__main__":
    main()
