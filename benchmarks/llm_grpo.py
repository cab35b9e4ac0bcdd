"""GRPO on a causal language model: relay beside TRL's GRPOTrainer, and the memory levers.

    python benchmarks/llm_grpo.py side-by-side [--seconds 90]
    python benchmarks/llm_grpo.py memory [--layers 10]
    python benchmarks/llm_grpo.py generate [--layers 10] [--rows 16] [--new 128] [--tiny]
    python benchmarks/llm_grpo.py weight-sync
    python benchmarks/llm_grpo.py overlap [--seconds 60] [--compile] [--pairs 1]

side-by-side: the same tiny random-init Llama folder (benchmarks/tiny_lm.py), the same task
(configs/tiny_lm_grpo.yaml: one-digit sums, a format reward 0.5 and numeric_match 1) and settings
(16 completions for each of 8 prompts a step, 3 new tokens, lr 1e-3, no KL, token-mean loss, group
std scaling, one update per generation, float32 on both sides), each in this process's machine for
the same wall budget: relay as the shipped config runs (a local Ray: the learner and the reward
actor are actors) and in local mode (no Ray: TRL has none either). Reported: the best reward
TRL reached (mean of 5 consecutive logged steps), the wall each took to first reach it, and
completions per second.

memory: one GRPO update of a Llama-shaped model of ~60M parameters (hidden 512, vocab 32,000) on
16 completions of 256 tokens after 64-token prompts, each variant in a fresh process (peak RSS is
what the CPU has for "device memory"): plain (the head's logits for all 256 positions at once, no
checkpointing), chunked log-probs, and chunked log-probs with gradient checkpointing; generation
and training tokens/s.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from common import machine_header, table, train_relay
from tiny_lm import hf_sample, sums_rows, tiny_model_folder, write_jsonl

ROOT = Path(__file__).parents[1]
PROMPTS, GROUP, NEW, LR = 8, 16, 3, 1e-3
FORMAT = "regex:^[0-9]{1,2}$"


def smoothed_best(points: list[tuple[float, float]], n: int = 5) -> float:
    """The best mean of n consecutive rewards."""
    rewards = [r for _, r in points]
    return max(sum(rewards[i : i + n]) / n for i in range(max(1, len(rewards) - n + 1)))


def first_reach(points: list[tuple[float, float]], target: float, n: int = 5) -> float | None:
    """The wall at which the mean of n consecutive rewards first reaches `target`."""
    rewards = [r for _, r in points]
    for i in range(len(rewards) - n + 1):
        if sum(rewards[i : i + n]) / n >= target - 1e-9:
            return points[i + n - 1][0]
    return None


def run_relay(
    model: Path, prompts: Path, seconds: float, compiled: bool, on_ray: bool = False
) -> tuple[list[tuple[float, float]], float, float]:
    """(reward points, completions/s over the run, completions/s after the first step). `on_ray`:
    as the shipped config runs (a local Ray, the learner and the reward actor as actors), else in
    local mode (no Ray, as TRL)."""
    lines = train_relay(
        "configs/tiny_lm_grpo.yaml",
        [
            f"generation.compile={str(compiled).lower()}",
            f"learner.compile={str(compiled).lower()}",
            f"model.path={model}",
            f"prompts.train={prompts}",
            *([] if on_ray else ["rollout.num_workers=0"]),
            "learner.use_amp=false",
            "learner.device=cpu",
            f"learner.lr={LR}",
            f"learner.group_size={GROUP}",
            f"prompts.batch_size={PROMPTS}",
            f"generation.max_new_tokens={NEW}",
            f"stop.wall_s={seconds}",
            "checkpoint.interval=100000",
        ],
    )
    points = [(x["wall_s"], x["reward_mean"]) for x in lines if x.get("reward_mean") is not None]
    first, last = lines[0], lines[-1]
    steady = (last["completions"] - first["completions"]) / (last["wall_s"] - first["wall_s"])
    return points, last["completions"] / last["wall_s"], steady


def run_trl(model: Path, seconds: float, out: Path) -> tuple[list[tuple[float, float]], float, float]:
    """(reward points, completions/s over the run, completions/s after the first step)."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from relay_rl.rollout_workers.lm.rewards import resolve_reward

    fmt, numeric = resolve_reward(FORMAT), resolve_reward("numeric_match")
    fmt.__name__, numeric.__name__ = "format", "numeric"  # type: ignore[attr-defined]
    points: list[tuple[float, float]] = []
    steps = [0]

    class Clock(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.t0: float | None = None

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if self.t0 is None:
                self.t0 = time.perf_counter()  # from the first step, as relay's wall_s

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "reward" in logs and self.t0 is not None:
                points.append((time.perf_counter() - self.t0, float(logs["reward"])))
                steps[0] = state.global_step
                if time.perf_counter() - self.t0 >= seconds:
                    control.should_training_stop = True

    cfg = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=PROMPTS * GROUP,
        num_generations=GROUP,
        max_completion_length=NEW,
        learning_rate=LR,
        beta=0.0,
        loss_type="dapo",
        scale_rewards="group",
        num_iterations=1,
        temperature=1.0,
        reward_weights=[0.5, 1.0],
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        max_steps=100_000,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        seed=0,
    )
    clock = Clock()
    trainer = GRPOTrainer(
        model=str(model),
        reward_funcs=[fmt, numeric],
        args=cfg,
        train_dataset=Dataset.from_list(sums_rows()),
        callbacks=[clock],
    )
    trainer.train()
    wall = points[-1][0] if points else seconds
    steady = (len(points) - 1) * PROMPTS * GROUP / (points[-1][0] - points[0][0])
    return points, steps[0] * PROMPTS * GROUP / wall, steady


def side_by_side(seconds: float) -> None:
    """TRL, relay's shipped config as a user runs it (on a local Ray, its reward actor beside the
    learner actor), relay eager in local mode, and relay compiled (generation.compile and
    learner.compile), each for `seconds`; relay compiled twice: from an empty inductor cache (a
    host's first run) and again with what the first compiled (every later run)."""
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_model_folder(Path(tmp) / "model")
        prompts = write_jsonl(Path(tmp) / "sums.jsonl", sums_rows())
        runs = {"TRL GRPOTrainer": run_trl(model, seconds, Path(tmp) / "trl")}
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(tmp) / "inductor")  # a cold compile
        runs["relay shipped config (on Ray)"] = run_relay(model, prompts, seconds, False, on_ray=True)
        runs["relay eager (local mode)"] = run_relay(model, prompts, seconds, False)
        runs["relay compiled (cold cache)"] = run_relay(model, prompts, seconds, True)
        # Inductor keeps what it compiled on disk: any later run on the host starts warm.
        runs["relay compiled (warm cache)"] = run_relay(model, prompts, seconds, True)
    target = smoothed_best(runs["TRL GRPOTrainer"][0])
    reach = {name: first_reach(points, target) for name, (points, _, _) in runs.items()}
    print(
        machine_header(
            f"GRPO on a tiny Llama: relay vs TRL {trl_version()} GRPOTrainer, {seconds:.0f} s each"
        )
    )
    head = [
        "",
        "steps",
        "best reward (5-step mean)",
        f"wall to {target:.2f} (s)",
        "completions/s",
        "after step 1",
    ]
    rows = [
        [name, len(points), smoothed_best(points), reach[name], rate, steady]
        for name, (points, rate, steady) in runs.items()
    ]
    print(table(head, rows))
    trl = runs["TRL GRPOTrainer"]
    for name in list(runs)[1:]:
        _, rate, steady = runs[name]
        wall = (
            f"{reach[name] / reach['TRL GRPOTrainer']:.2f}x"
            if reach[name] and reach["TRL GRPOTrainer"]
            else "n/a"
        )
        print(
            f"\n{name} / TRL: wall to TRL's best {wall}; completions/s {rate / trl[1]:.2f}x "
            f"(after step 1: {steady / trl[2]:.2f}x)",
            end="",
        )
    print()


def _overlap_run(
    model: Path, prompts: Path, staleness: int, seconds: float, compiled: bool
) -> dict[str, Any]:
    """One run of the shipped tiny config with its generation on one generator actor: its
    (wall s, reward) points, completions/s and mean policy lag."""
    lines = train_relay(
        "configs/tiny_lm_grpo.yaml",
        [
            f"model.path={model}",
            f"prompts.train={prompts}",
            "rollout.num_workers=1",
            "generation.placement=workers",
            f"generation.max_staleness={staleness}",
            f"generation.compile={str(compiled).lower()}",
            "learner.device=cpu",
            f"stop.wall_s={seconds}",
            "checkpoint.interval=100000",
        ],
    )
    return {
        "points": [(x["wall_s"], x["reward_mean"]) for x in lines if x.get("reward_mean") is not None],
        "rate": lines[-1]["completions"] / lines[-1]["wall_s"],
        "lag": sum(x["policy_lag_mean"] for x in lines) / len(lines),
    }


def overlap(seconds: float, compiled: bool, pairs: int = 1) -> None:
    """generation.max_staleness 0 vs 1 on Ray, the same seconds each, `pairs` times (the pair's
    order alternating, so a machine that slows down over the runs favours neither); per pair the
    wall each takes to a reward both reach (90% of the lower of their best 5-step means), then
    the median of the pairs' ratios: one pair's ratio moves by a fifth from run to run."""
    rows, ratios, rate_ratios = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_model_folder(Path(tmp) / "model")
        prompts = write_jsonl(Path(tmp) / "sums.jsonl", sums_rows())
        for pair in range(pairs):
            order = (0, 1) if pair % 2 == 0 else (1, 0)
            runs = {s: _overlap_run(model, prompts, s, seconds, compiled) for s in order}
            target = 0.9 * min(smoothed_best(r["points"]) for r in runs.values())
            walls = {s: first_reach(r["points"], target) for s, r in runs.items()}
            for s in (0, 1):
                r = runs[s]
                rows.append(
                    [
                        pair + 1,
                        s,
                        len(r["points"]),
                        smoothed_best(r["points"]),
                        r["rate"],
                        r["lag"],
                        target,
                        walls[s],
                    ]
                )
            if walls[0] and walls[1]:
                ratios.append(walls[0] / walls[1])
            rate_ratios.append(runs[1]["rate"] / runs[0]["rate"])
    how = "compiled" if compiled else "eager"
    print(
        machine_header(
            f"One-step off-policy generation: the tiny task on Ray, one generator actor ({how} "
            f"decoding), {seconds:.0f} s each, {pairs} pair(s)"
        )
    )
    headers = ["pair", "max_staleness", "steps", "best reward (5-step mean)", "completions/s", "policy lag"]
    print(table([*headers, "equal reward", "wall to it (s)"], rows))
    shown = ", ".join(f"{r:.2f}x" for r in ratios)
    print(
        f"\nwall to equal reward, staleness 0 / staleness 1: median {statistics.median(ratios):.2f}x "
        f"({shown}); completions/s: median {statistics.median(rate_ratios):.2f}x"
        if ratios
        else "\nno pair reached a common reward"
    )


def trl_version() -> str:
    import trl

    return str(trl.__version__)


# ---- memory ------------------------------------------------------------------------------------
def _measure(variant: str, layers: int, folder: str) -> None:
    """One update of the ~60M model in this (fresh) process; prints one JSON line."""
    import torch

    from relay_rl.contracts.config import RelayConfig
    from relay_rl.learner.lm.learner import LanguageLearner

    checkpointing, chunk = {"plain": (False, 256), "chunked": (False, 32), "chunked+ckpt": (True, 32)}[
        variant
    ]
    cfg = RelayConfig.model_validate(
        _memory_config(
            folder,
            256,
            {
                "grad_checkpointing": checkpointing,
                "grpo": {"logprob_chunk": chunk, "micro_batch_tokens": 16 * 320},
            },
        )
    )
    torch.manual_seed(0)
    learner = LanguageLearner(cfg)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    gen = learner.generate_round()
    rss_gen = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rewards = [float(i % 3 == 0) for i in range(16)]
    metrics = learner.train(rewards)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {
                "variant": variant,
                "parameters": sum(p.numel() for p in learner.policy.parameters()),
                "peak_after_load_mb": rss0 / 1024,
                "peak_generate_mb": rss_gen / 1024,
                "peak_update_mb": rss / 1024,
                "gen_tokens_per_s": gen["gen_tokens"] / gen["gen_s"],
                "trained_tokens_per_s": metrics["trained_tokens_per_s"],
            }
        )
    )


def _memory_config(folder: str, new_tokens: int, learner: dict[str, Any]) -> dict[str, Any]:
    """The memory measurements' run: 2 prompts x 8 completions of the Llama-shaped model on the
    CPU in float32, prompts padded to 64, `new_tokens` each, `learner`'s settings on top."""
    return {
        "model": {"kind": "causal_lm", "path": folder},
        "prompts": {
            "train": f"{folder}/prompts.jsonl",
            "rewards": ["exact_match"],
            "batch_size": 2,
            "max_prompt_tokens": 64,
        },
        "generation": {"max_new_tokens": new_tokens, "prompt_buckets": [64]},
        "learner": {"group_size": 8, "device": "cpu", "use_amp": False, **learner},
    }


def _memory_folder(tmp: str, layers: int) -> Path:
    """The Llama-shaped model with its prompts: 40-60 characters (one token each), so every row
    pads into the 64 bucket."""
    folder = _llama_folder(Path(tmp) / "m", layers)
    write_jsonl(
        folder / "prompts.jsonl",
        [{"prompt": "1234567890" * 4 + "+" * (i % 20), "answer": "x"} for i in range(8)],
    )
    return folder


def memory(layers: int) -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = _memory_folder(tmp, layers)
        for variant in ("plain", "chunked", "chunked+ckpt"):
            out = subprocess.run(
                [sys.executable, __file__, "_measure", variant, str(layers), str(folder)],
                cwd=ROOT,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
    params = rows[0]["parameters"]
    print(
        machine_header(
            f"GRPO update memory: a Llama-shaped model of {params / 1e6:.0f}M parameters, "
            "16 x (64 + 256) tokens, vocab 32,000, float32"
        )
    )
    print(
        table(
            [
                "variant",
                "peak RSS after load (MB)",
                "after generation (MB)",
                "after the update (MB)",
                "update - load (MB)",
                "generated tok/s",
                "trained tok/s",
            ],
            [
                [
                    r["variant"],
                    r["peak_after_load_mb"],
                    r["peak_generate_mb"],
                    r["peak_update_mb"],
                    r["peak_update_mb"] - r["peak_after_load_mb"],
                    r["gen_tokens_per_s"],
                    r["trained_tokens_per_s"],
                ]
                for r in rows
            ],
        )
    )
    print(
        "\nplain: logprob_chunk=256 (one [16, 256, 32000] logits block); chunked: logprob_chunk=32; "
        "+ckpt: learner.grad_checkpointing=true"
    )


def _sharded_rank(rank: int, world: int, folder: str, port: int, out: str) -> None:
    """One rank of `sharded`: a round and two updates of the Llama-shaped model, its figures to
    `out` (JSON): the tensor bytes it holds after the update, its peak RSS and tokens/s/device."""
    import torch

    from relay_rl.contracts.config import RelayConfig
    from relay_rl.learner.distributed import init_group
    from relay_rl.learner.lm.learner import LanguageLearner
    from relay_rl.learner.lm.sharding import DTensor

    def local(t: torch.Tensor) -> int:
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()

    torch.set_num_threads(1)
    # The estimate is of what a device's allocator would count: tensors. The libraries' code and
    # import-time state (transformers and the model's classes, the tokenizer's, relay's policy
    # layer) are on the host whatever the device, so the baseline is taken after importing them.
    import transformers.models.llama.modeling_llama  # noqa: F401

    import relay_rl.policy.causal_lm  # noqa: F401

    base = _resident(reset_peak=True)
    cfg = RelayConfig.model_validate(_sharded_config(folder, world))
    learner = LanguageLearner(cfg)
    if world > 1:
        init_group(learner.dev, rank, world, "127.0.0.1", port, 600)
        learner.shard(rank, world)
    grads: list[int] = []  # the gradient bytes at each step (the learner frees them after it)
    learner.optimizer.register_step_post_hook(
        lambda opt, *_: grads.append(
            sum(local(p.grad) for g in opt.param_groups for p in g["params"] if p.grad is not None)
        )
    )
    rates = []
    for _ in range(2):
        learner.generate_round()
        metrics = learner.train(
            [float(i % 3 == 0) for i in range(cfg.prompts.batch_size * cfg.learner.group_size)]
        )
        rates.append(metrics["tokens_per_s_per_device"])

    params = sum(local(p) for p in learner.policy.parameters())
    state = sum(local(v) for s in learner.optimizer.state.values() for v in s.values() if torch.is_tensor(v))
    peak = _resident("VmHWM")
    Path(out).write_text(
        json.dumps(
            {
                "held": params + max(grads) + state,
                "params": params,
                "peak_rss": peak - base,
                "tokens_per_s_per_device": rates[-1],
            }
        )
    )


def _resident(field: str = "VmRSS", reset_peak: bool = False) -> int:
    """This process's resident bytes now (VmRSS) or at their peak since the last reset (VmHWM);
    `reset_peak`: the peak starts again from now (Linux: /proc/self/clear_refs)."""
    if reset_peak:
        Path("/proc/self/clear_refs").write_text("5")
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _sharded_config(folder: str, world: int) -> dict[str, Any]:
    lm = {"logprob_chunk": 32, "micro_batch_tokens": 16 * 128}
    cfg = _memory_config(folder, 64, {"num_learners": world, "num_cpus": 1, "lm": lm})
    return {**cfg, "rollout": {"num_workers": 1}, "stop": {"iterations": 2}}


def sharded(layers: int) -> None:
    """The language learner on one rank and sharded over two (FSDP2, gloo, one process each, one
    thread each): the parameter + gradient + optimizer bytes a rank holds, its peak RSS over what it
    held once its libraries were imported (rank 0's, which reads the whole model once and hands
    each rank its shards, and the last rank's, which never holds it whole), tokens/s per device,
    and the memory estimate beside them."""
    import socket

    import torch.multiprocessing as mp

    from relay_rl.contracts.config import RelayConfig
    from relay_rl.services.driver.families.language import memory_estimate

    def ranks(world: int, folder: Path, tmp: str, malloc: dict[str, str]) -> list[dict[str, Any]]:
        """`world` ranks of `_sharded_rank`, spawned with `malloc` in their environment: what each wrote."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        outs = [f"{tmp}/rank{world}-{k}.json" for k in range(world)]
        saved = dict(os.environ)
        os.environ.update(malloc)  # spawned processes take the environment as it is at their start
        try:
            procs = [
                mp.get_context("spawn").Process(
                    target=_sharded_rank, args=(k, world, str(folder), port, outs[k])
                )
                for k in range(world)
            ]
            for proc in procs:
                proc.start()
            for proc in procs:
                proc.join()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        return [json.loads(Path(o).read_text()) for o in outs]

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = _memory_folder(tmp, layers)
        for world in (1, 2):
            # Memory: glibc's malloc keeps freed blocks below its dynamic mmap threshold (it
            # rises to 32 MB as big blocks are freed) in its heap, and RSS counts them, where a
            # device allocator's peak counts live tensors only. With the threshold fixed, a freed
            # tensor leaves RSS, and the peak is of live bytes. Speed: a run of its own with
            # malloc as it comes (mapping every block costs page faults).
            got = ranks(world, folder, tmp, {"MALLOC_MMAP_THRESHOLD_": "65536"})
            speed = ranks(world, folder, tmp, {})
            for g, sp in zip(got, speed, strict=True):
                g["tokens_per_s_per_device"] = sp["tokens_per_s_per_device"]
            est = memory_estimate(RelayConfig.model_validate(_sharded_config(str(folder), world)))
            rows.append((world, got[0], est, got[-1]))
    params = rows[0][1]["params"] // 4
    print(
        machine_header(
            f"Sharded language learner (FSDP2, gloo): a Llama-shaped model of {params / 1e6:.0f}M "
            "parameters, 16 x (64 + 64) tokens a round, float32, one thread a rank"
        )
    )
    one = rows[0][1]
    print(
        table(
            [
                "ranks",
                "held by rank 0 (MB)",
                "held / N=1",
                "estimate: weights+grads+optimizer (MB)",
                "peak RSS rank 0 (MB)",
                "peak RSS last rank (MB)",
                "estimate: peak (MB)",
                "tokens/s per device",
            ],
            [
                [
                    world,
                    got["held"] / 2**20,
                    got["held"] / one["held"],
                    (est.weights + est.gradients + est.optimizer) / 2**20,
                    got["peak_rss"] / 2**20,
                    last["peak_rss"] / 2**20,
                    est.peak / 2**20,
                    got["tokens_per_s_per_device"],
                ]
                for world, got, est, last in rows
            ],
        )
    )


def _llama_folder(folder: Path, layers: int) -> Path:
    """A Llama-shaped random model (hidden 512, vocab 32,000, `layers` blocks) with the tiny
    tokenizer, written as a model folder."""
    from tiny_lm import write_tokenizer
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(
        vocab_size=32_000,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    AutoModelForCausalLM.from_config(cfg).save_pretrained(str(folder))
    write_tokenizer(folder)
    return folder


def generate(layers: int, rows: int, new: int, tiny: bool = False) -> None:
    """relay's KV-cache samplers (eager, compiled) vs transformers' `generate` (TRL's default) on
    one model, batch and lengths: every row runs `new` tokens (no end token), best of 3 after a
    warm-up. `tiny`: the side-by-side's tiny Llama instead (per-step overhead, not arithmetic)."""
    import torch

    from relay_rl.policy.causal_lm import CausalLMPolicy, load_causal_lm
    from relay_rl.policy.lm_decoding import StaticDecoder

    torch.manual_seed(0)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = tiny_model_folder(Path(tmp) / "m") if tiny else _llama_folder(Path(tmp) / "m", layers)
        model = load_causal_lm(folder).eval()
        policy = CausalLMPolicy(model, 0, []).eval()  # no end token: every row decodes `new` tokens
        vocab, width = model.config.vocab_size, 8 if tiny else 64
        ids = torch.randint(3, vocab, (rows, width), generator=torch.Generator().manual_seed(0))
        mask = torch.ones_like(ids)

        def relay_gen() -> None:
            policy.generate(ids, mask, new, 1.0, 0, torch.Generator().manual_seed(0))

        decoders: dict[tuple[bool, bool], StaticDecoder] = {}

        def relay_compiled(autocast: bool, cast_once: bool = True) -> Any:
            def run() -> None:
                key = (autocast, cast_once)
                if key not in decoders:  # one decoder (one compile) per precision and form
                    decoders[key] = StaticDecoder(policy, "inductor", width, 1.0, 0, cast_once)
                decoders[key](ids, mask, new, 1.0, 0, torch.Generator().manual_seed(0))

            return run

        def hf_gen() -> None:
            hf_sample(model, ids, mask, new)

        half = copy.deepcopy(model).to(torch.bfloat16)  # a model loaded in bf16 (no master weights)

        def hf_half() -> None:
            hf_sample(half, ids, mask, new)

        for precision, autocast in (("float32", False), ("bf16 autocast", True)):
            samplers = (
                ("transformers generate", hf_gen, autocast),
                ("relay eager (KV cache)", relay_gen, autocast),
                ("relay compiled (static cache)", relay_compiled(autocast), autocast),
            )
            if autocast:  # the other way to sample in bf16: the model's weights in bf16; and the
                # compiled step casting its weights and cache every step, as it did before cast_once
                samplers += (
                    ("transformers generate, bf16 weights", hf_half, False),
                    ("relay compiled, casting every step", relay_compiled(True, False), True),
                )
            for name, fn, on in samplers:
                with torch.autocast("cpu", torch.bfloat16, enabled=on):
                    fn()  # warm-up (the compiled step compiles here)
                    best = min(_timed(fn) for _ in range(3))
                out.append([precision, name, rows, new, rows * new / best])
        compiles = sum(d.compiles for d in decoders.values())
    _print_generation(sum(p.numel() for p in model.parameters()), rows, width, new, out, compiles)


def _print_generation(
    params: int, rows: int, width: int, new: int, out: list[list[Any]], compiles: int
) -> None:
    """`generate`'s table and ratios: rows 0-2 float32 (transformers, eager, compiled), rows 3-5
    the same under bf16 autocast, row 6 transformers with bf16 weights, row 7 the compiled step
    casting its weights and its KV cache every step (`cast_once=False`)."""
    print(
        machine_header(
            f"Generation: a {params / 1e6:.2g}M Llama-shaped model, {rows} rows x {width}-token prompts, "
            f"{new} new tokens"
        )
    )
    print(table(["precision", "sampler", "rows", "new tokens", "tokens/s"], out))
    for i in (0, 3):
        print(
            f"\n{out[i][0]}: relay eager / transformers = {out[i + 1][4] / out[i][4]:.2f}x, "
            f"compiled / transformers = {out[i + 2][4] / out[i][4]:.2f}x",
            end="",
        )
    print(f"; compiled / transformers with bf16 weights = {out[5][4] / out[6][4]:.2f}x", end="")
    once = out[5][4] / out[7][4]
    print(f"\nbf16 autocast: compiled, weights cast once per version / casting every step = {once:.2f}x")
    print(f"compiles: {compiles} (one per precision and form; none after warm-up)")


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def weight_sync() -> None:
    """Seconds to move a Qwen2.5-0.5B-shaped model's weights (random, bf16 on the wire) from one
    process to another by version: ray.put in the learner, ray.get in a generator actor."""
    import ray
    from tiny_lm import qwen_05b_config
    from transformers import AutoModelForCausalLM

    from relay_rl.policy.weight_wires import wire_weights

    ray.init(address="local", num_cpus=2, include_dashboard=False)
    try:

        @ray.remote
        class Receiver:
            """A generator's side: its own copy of the model, the weights copied into it."""

            def __init__(self) -> None:
                self.model = AutoModelForCausalLM.from_config(qwen_05b_config())

            def take(self, weights: list[Any]) -> int:
                from relay_rl.policy.weight_wires import WIRES, load_weights

                packed = ray.get(weights[0])
                load_weights(self.model, WIRES["packed_bf16"].unpack(packed))
                return len(packed.index)

        model = AutoModelForCausalLM.from_config(qwen_05b_config())
        state = model.state_dict()
        receiver = Receiver.remote()
        ray.get(receiver.__ray_ready__.remote())
        params = sum(p.numel() for p in model.parameters())  # tied weights once
        rows: list[list[Any]] = []
        previous = None
        for _ in range(6):
            t0 = time.perf_counter()
            wire = wire_weights(state, previous)
            previous = wire.data
            t1 = time.perf_counter()
            ref = ray.put(wire)
            n = ray.get(receiver.take.remote([ref]))
            t2 = time.perf_counter()
            assert n == len(wire.index)
            rows.append([params, wire.nbytes / 2**20, t1 - t0, t2 - t1, t2 - t0])
            del ref
    finally:
        ray.shutdown()
    print(machine_header("Weight sync: a Qwen2.5-0.5B-shaped model, learner process -> generator actor"))
    print(
        table(
            ["parameters", "MiB on the wire (bf16)", "pack (s)", "put, get, copy in (s)", "total (s)"], rows
        )
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_measure":
        _measure(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    s = sub.add_parser("side-by-side")
    s.add_argument("--seconds", type=float, default=90.0)
    m = sub.add_parser("memory")
    m.add_argument("--layers", type=int, default=10)
    g = sub.add_parser("generate")
    g.add_argument("--layers", type=int, default=10)
    g.add_argument("--rows", type=int, default=16)
    g.add_argument("--new", type=int, default=128)
    g.add_argument("--tiny", action="store_true", help="the side-by-side's tiny Llama (vocab 48, hidden 32)")
    sub.add_parser("weight-sync")
    sh = sub.add_parser("sharded")
    sh.add_argument("--layers", type=int, default=10)
    o = sub.add_parser("overlap")
    o.add_argument("--seconds", type=float, default=60.0)
    o.add_argument("--compile", action="store_true", help="generation.compile on the generator")
    o.add_argument("--pairs", type=int, default=1, help="run the pair this many times; the median ratio")
    args = parser.parse_args()
    if args.what == "overlap" and not (1 <= args.pairs <= 50 and args.seconds > 0):
        parser.exit(
            2,
            f"llm_grpo.py overlap: --pairs {args.pairs} --seconds {args.seconds}: "
            "1 to 50 pairs, seconds > 0\n",
        )
    if args.what == "side-by-side":
        side_by_side(args.seconds)
    elif args.what == "overlap":
        overlap(args.seconds, args.compile, args.pairs)
    elif args.what == "memory":
        memory(args.layers)
    elif args.what == "sharded":
        sharded(args.layers)
    elif args.what == "generate":
        generate(args.layers, args.rows, args.new, args.tiny)
    else:
        weight_sync()


if __name__ == "__main__":
    main()
