"""Recurrent policies on a task one frame cannot solve: CartPole without its velocities
(relay/CartPoleNoVel-v1, rl-baselines3-zoo's CartPoleNoVel) to a mean return of 475.

    python benchmarks/recurrent.py --max-wall 900

relay with an LSTM core (configs/cartpole_novel_lstm_ppo.yaml), relay without memory (the same
config, model.recurrent=none: it must plateau well below, which shows the memory is what solves
it), and sb3-contrib's RecurrentPPO with rl-baselines3-zoo's hyperparameters for this env
(VecNormalize, 8 envs x 32 steps, batch 256, gae_lambda 0.8, gamma 0.98, 20 epochs, lr and clip
annealed from 1e-3 and 0.2, LSTM 64 with a critic LSTM, ReLU [64] heads, no orthogonal init).
One process each (relay in local mode, as SB3), one after another on this machine, seed 0; wall
counts from the first env step. Target: relay reaches 475 in <= 0.5x RecurrentPPO's wall.

    python benchmarks/recurrent.py --only memory --env-steps 500000

A grid task with memory: MiniGrid-MemoryS7-v0 (configs/minigrid_memory_lstm_ppo.yaml, 2 workers
on Ray) with the LSTM core and without it (the same config, model.recurrent=none), the same env
steps each, seed 0: the mean return against env steps. Without memory the agent can at best
guess at the fork (about 0.5 once it navigates); above that is memory.

    python benchmarks/recurrent.py --only sampling --seconds 15 --repeats 3

What the core costs a rollout worker: env steps/s of 2 workers alone on CartPole (8 envs each)
without a core and with LSTM and GRU cores (both acting through the numpy mirror), and where it
goes: one acting call on 8 envs timed in-process for the numpy mirror with and without a core and
for the torch policy with one (what the workers would run without the mirror).

    python benchmarks/recurrent.py --only replay

The update's sequence replay through torch's fused LSTM (policy/cores/fused.py) against the step
loop, one round of each recurrent config in-process, and CartPoleNoVel end to end (local mode)
with the LSTM and without a core at the same 49,152 env steps.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
sys.path.insert(0, str(Path(__file__).parent))
from common import ZOO_CARTPOLE, machine_header, sampling_rate, sb3_learn_until, table, train_relay
from spaces import Outcome, Task, run_relay

TASK = Task("novel", "relay/CartPoleNoVel-v1", 475.0, 1_000_000)
CONFIG = "configs/cartpole_novel_lstm_ppo.yaml"
LOCAL = ["learner.buffer_size=256"]  # one process: a round is one 8 x 32 segment (SB3's 256 steps)


def run_recurrent_ppo(max_wall: float) -> Outcome:
    import gymnasium as gym
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize
    from torch import nn

    from relay_rl.rollout_workers.pomdp import register_pomdp

    register_pomdp()
    env = VecNormalize(make_vec_env(lambda: gym.make(TASK.env_id), n_envs=8, seed=0))

    model = RecurrentPPO(
        "MlpLstmPolicy",
        env,
        **ZOO_CARTPOLE,
        policy_kwargs={
            "ortho_init": False,
            "activation_fn": nn.ReLU,
            "lstm_hidden_size": 64,
            "enable_critic_lstm": True,
            "net_arch": {"pi": [64], "vf": [64]},
        },
        seed=0,
        device="cpu",
        verbose=0,
    )
    solved, wall, steps, final = sb3_learn_until(model, TASK.target, max_wall, 200_000)
    return Outcome(TASK.key, "sb3-contrib RecurrentPPO (rl-zoo)", solved, wall, steps, final)


def sampling_table(seconds: float, repeats: int) -> str:
    import time

    import numpy as np
    import ray
    import torch

    from relay_rl.contracts.config import load_config
    from relay_rl.policy.models import build_policy
    from relay_rl.policy.numpy_mirror import TorchCpuPolicy, cpu_policy
    from relay_rl.rollout_workers.envs import probe_env_spec

    base = ["learner.minibatch=sequences", "model.recurrent_size=64"]
    cores = {"no core": "none", "lstm 64": "lstm", "gru 64": "gru"}
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR")
    # Interleaved repeats, the median of each: the machine's speed drifts by more than a core costs.
    rates: dict[str, list[float]] = {name: [] for name in cores}
    for _ in range(repeats):
        for name, core in cores.items():
            cfg = load_config("configs/cartpole_ppo.yaml", [*base, f"model.recurrent={core}"])
            rates[name].append(sampling_rate(cfg, 2, seconds))
    ray.shutdown()
    rows = [[name, float(np.median(r)), min(r), max(r)] for name, r in rates.items()]
    rate = rows[0][1]
    for row in rows:
        row.append(row[1] / rate)

    def per_call_us(policy, state_size: int) -> float:
        obs = {"obs": np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)}
        if state_size:
            obs["h_in"] = np.zeros((8, state_size), np.float32)
        noise = np.random.default_rng(1).random(8).astype(np.float32)
        for _ in range(200):
            policy.act(obs, noise)
        t0 = time.perf_counter()
        for _ in range(2000):
            policy.act(obs, noise)
        return (time.perf_counter() - t0) / 2000 * 1e6

    torch.set_num_threads(1)
    calls = []
    for name, core, torch_path in (
        ("mlp, numpy mirror", "none", False),
        ("mlp + lstm 64, numpy mirror", "lstm", False),
        ("mlp + gru 64, numpy mirror", "gru", False),
        ("mlp + lstm 64, torch", "lstm", True),
    ):
        cfg = load_config("configs/cartpole_ppo.yaml", [*base, f"model.recurrent={core}"])
        model = build_policy(cfg, probe_env_spec(cfg.env), critic=True)
        policy = TorchCpuPolicy(model) if torch_path else cpu_policy(cfg.model, model)
        calls.append([name, per_call_us(policy, model.state_size)])
    return "\n".join(
        [
            table(
                ["policy (2 workers x 8 CartPole envs)", "env steps/s (median)", "min", "max", "vs no core"],
                rows,
            ),
            "",
            table(["acting call, 8 envs", "us per call"], calls),
        ]
    )


MEMORY_CONFIG = "configs/minigrid_memory_lstm_ppo.yaml"
MARKS = (0.1, 0.25, 0.5, 0.75, 1.0)  # of the env-step budget: the table's rows


def cue_success(checkpoint: Path, episodes: int = 400) -> tuple[float, float, float]:
    """The final policy (sampling, as it trains) on MemoryS7 episodes of seeds apart from
    training's: (the share of episodes in which the agent saw the start room's object, success
    when it had, success when it had not). A policy that remembers succeeds more often after
    seeing the cue; one that guesses succeeds half the time either way."""
    import gymnasium as gym
    import minigrid  # noqa: F401  (registers the envs)
    import numpy as np
    import torch

    from relay_rl.policy.actor_critic import STATE, draw_noise, fields_to_torch
    from relay_rl.services.tools.load import load_policy

    handle = load_policy(checkpoint)
    env = gym.make("MiniGrid-MemoryS7-v0")
    gen = torch.Generator().manual_seed(0)
    counts = {True: [0, 0], False: [0, 0]}  # saw the cue -> [episodes, successes]
    for episode in range(episodes):
        obs, _ = env.reset(seed=10_000_000 + episode)
        core = env.unwrapped
        cue = (1, core.height // 2 - 1)  # where the start room's object lies
        saw, reward, done = core.agent_sees(*cue), 0.0, False
        state = handle.initial_state(1)
        while not done:
            fields = {"obs/image": obs["image"][None], "obs/direction": np.array([obs["direction"]])}
            if handle.recurrent:
                fields[STATE] = state
            with torch.no_grad():
                action, after = handle.model.choose(
                    fields_to_torch(handle.as_input(fields)), draw_noise(handle.model.action, 1, gen)
                )
            state = after.numpy() if after is not None else state
            obs, reward, terminated, truncated, _ = env.step(int(handle.env.action.to_env(action.numpy())[0]))
            done = terminated or truncated
            saw = saw or (not done and core.agent_sees(*cue))
        counts[saw][0] += 1
        counts[saw][1] += reward > 0
    rate = {k: (s / n if n else float("nan")) for k, (n, s) in counts.items()}
    return counts[True][0] / episodes, rate[True], rate[False]


def memory_table(env_steps: int) -> str:
    """MemoryS7 with and without the LSTM core, the same budget each: the mean return (last 100
    episodes) and the wall at each mark of the budget; then each final policy's success with and
    without having seen the cue (`cue_success`)."""
    from relay_rl.services.runs.checkpoints import list_checkpoints

    runs, cues = {}, {}
    # the post-core layer sits on the core: without one, the heads read the trunk as they always do
    no_memory = ["model.recurrent=none", "learner.minibatch=steps", "model.post_core_size=0"]
    for name, sets in (("lstm 128", []), ("no memory", no_memory)):
        print(f"... MemoryS7, {name}", file=sys.stderr, flush=True)
        base = [f"stop.env_steps={env_steps}", "stop.episode_return_mean=null", "checkpoint.interval=1000"]

        def probe(run: Path, name: str = name) -> None:
            cues[name] = cue_success(list_checkpoints(run / "checkpoints")[-1])

        runs[name] = [x for x in train_relay(MEMORY_CONFIG, [*base, *sets], probe) if "env_steps" in x]
    rows = []
    for mark in MARKS:
        row: list[object] = [int(mark * env_steps)]
        for lines in runs.values():
            line = next((x for x in lines if x["env_steps"] >= mark * env_steps), lines[-1])
            row += [line["env_steps"], line["wall_s"], line["episode_return_mean"]]
        rows.append(row)
    headers = ["mark", "lstm env steps", "lstm wall s", "lstm return"]
    headers += ["no-memory env steps", "no-memory wall s", "no-memory return"]
    probe_rows = [[name, f"{a:.2f}", f"{b:.2f}", f"{c:.2f}"] for name, (a, b, c) in cues.items()]
    probe_headers = ["final policy (400 episodes)", "saw the cue", "success having seen it", "success not"]
    return table(headers, rows) + "\n\n" + table(probe_headers, probe_rows)


def replay_table(env_steps: int) -> str:
    """The update with the fused replay against the step loop (in-process, the same segments,
    best of 3 rounds after one), then CartPoleNoVel end to end in local mode with the LSTM and
    without a core at the same env steps."""
    import time

    import torch

    from relay_rl.contracts.config import load_config
    from relay_rl.learner.algorithms import algorithm_traits
    from relay_rl.learner.learner import Learner
    from relay_rl.policy.cores.base import RecurrentCore
    from relay_rl.rollout_workers.sampler import make_sampler

    rows = []
    for config in (CONFIG, "configs/minigrid_memory_lstm_ppo.yaml"):
        cfg = load_config(Path(__file__).parents[1] / config, ["rollout.num_workers=0"])
        torch.set_num_threads(cfg.learner.num_cpus)
        sampler = make_sampler(cfg, algorithm_traits(cfg))
        segments = [sampler.sample() for _ in range(cfg.segments_per_update)]
        times = {}
        for replay in ("step loop", "fused"):
            learner = Learner(cfg, sampler.spec)
            if replay == "step loop":  # a core without its fused RNN's template replays step by step
                for module in learner.model.modules():
                    if isinstance(module, RecurrentCore):
                        module._rnn = []
            learner.train_round(segments)
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                learner.train_round(segments)
                best = min(best, time.perf_counter() - t0)
            times[replay] = best
        rows.append(
            [
                Path(config).stem,
                f"{times['step loop']:.3f}",
                f"{times['fused']:.3f}",
                f"{times['step loop'] / times['fused']:.2f}x",
            ]
        )
    out = table(["config (its update, one round)", "step loop s", "fused s", "speed-up"], rows)
    walls, ratio = lstm_against_no_core(env_steps)
    wall_rows = [[name, steps, f"{wall:.1f}"] for name, (steps, wall) in walls.items()]
    return (
        out
        + "\n\n"
        + table(["CartPoleNoVel, local mode", "env steps", "wall s"], wall_rows)
        + (f"\nLSTM / no core wall: {ratio:.2f}")
    )


def lstm_against_no_core(
    env_steps: int, sets: Sequence[str] = ()
) -> tuple[dict[str, tuple[int, float]], float]:
    """CartPoleNoVel end to end in local mode, the shipped LSTM config and the same without a
    core, to the same env steps, `sets` on both: {run: (env steps, wall s)} and the LSTM run's
    wall over the no-core run's (#43's measure: at most 1.3)."""
    walls = {}
    for name, own in (("LSTM 64", []), ("no core", ["model.recurrent=none", "learner.minibatch=steps"])):
        lines = train_relay(
            CONFIG,
            [
                "rollout.num_workers=0",
                *LOCAL,
                *own,
                *sets,
                f"stop.env_steps={env_steps}",
                "stop.episode_return_mean=null",
            ],
        )
        walls[name] = (lines[-1]["env_steps"], lines[-1]["wall_s"])
    return walls, walls["LSTM 64"][1] / walls["no core"][1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-wall", type=float, default=900.0)
    parser.add_argument("--only", default="lstm,none,sb3")
    parser.add_argument("--seconds", type=float, default=15.0, help="sampling: seconds per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="sampling: interleaved repeats per policy")
    parser.add_argument("--env-steps", type=int, default=500_000, help="memory: env steps per run")
    args = parser.parse_args()
    if args.only == "memory":
        title = f"recurrent: MiniGrid-MemoryS7-v0, LSTM vs no memory, {args.env_steps:,} env steps (seed 0)"
        print(machine_header(title))
        print(memory_table(args.env_steps))
        return
    if args.only == "replay":
        print(machine_header("recurrent: the update's replay, fused against the step loop"))
        print(replay_table(min(args.env_steps, 49_152)))
        return
    if args.only == "sampling":
        print(machine_header("recurrent: what a core costs the rollout workers (CartPole, W = 2)"))
        print(sampling_table(args.seconds, args.repeats))
        return
    runs = {
        "lstm": lambda: run_relay(TASK, CONFIG, args.max_wall, LOCAL, "relay, LSTM 64"),
        "none": lambda: run_relay(
            TASK,
            CONFIG,
            args.max_wall / 3,
            [*LOCAL, "model.recurrent=none", "learner.minibatch=steps"],
            "relay, no memory",
        ),
        "sb3": lambda: run_recurrent_ppo(args.max_wall),
    }
    outcomes = []
    for key in args.only.split(","):
        print(f"... {key}", file=sys.stderr, flush=True)
        outcomes.append(runs[key]())
    print(machine_header("recurrent: CartPoleNoVel-v1 to a mean return of 475 (seed 0)"))
    relay = outcomes[0]
    rows = [
        [
            o.system,
            "yes" if o.solved else "NO",
            o.env_steps,
            o.wall_s,
            o.final_return,
            relay.wall_s / o.wall_s if relay.solved and o.solved and o is not relay else None,
        ]
        for o in outcomes
    ]
    print(table(["system", "reached", "env steps", "wall s", "return", "relay wall / this"], rows))


if __name__ == "__main__":
    main()
