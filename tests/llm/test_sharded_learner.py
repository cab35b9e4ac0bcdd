"""A language learner sharded over two ranks with torch's FSDP2 (gloo on this CPU), on a real
local Ray: the learner group places and joins the ranks, each samples and trains its whole groups
of every round, and the run is the run one learner makes (the same completions, the same weights
to float tolerance), its checkpoint resumable at either N."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from relay_rl.contracts.checkpoint import Checkpoint
from relay_rl.learner.lm import shards
from relay_rl.services.cli import main
from relay_rl.services.runs.checkpoints import SHARDS_KEY, load_newest_valid
from tests.lm_helpers import sums_rows, tiny_model_folder, write_jsonl

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False)
    yield
    ray.shutdown()


def _sharded_folder(folder: Path, prompts: str, generation: str, learner: str, rest: str) -> None:
    """The tiny model, the sums and a run.yaml in `folder`: a group of 4 completions per prompt,
    one reward worker, its own `prompts`, `generation`, `learner` settings and further sections."""
    tiny_model_folder(folder / "model")
    write_jsonl(folder / "sums.jsonl", sums_rows())
    (folder / "run.yaml").write_text(
        "model: {kind: causal_lm, path: model}\n"
        "prompts: {train: sums.jsonl, max_prompt_tokens: 8, rewards: ['regex:7'], "
        f"batch_size: 4{prompts}}}\n"
        f"generation: {{max_new_tokens: 6{generation}}}\n"
        f"learner: {{group_size: 4, lr: 0.003, device: cpu, num_cpus: 1{learner}}}\n"
        "rollout: {num_workers: 1, num_cpus_per_worker: 1}\nmetrics: {progress: none}\n" + rest
    )


def _run(folder: Path, name: str, *sets: str) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """`relay train` of the tiny model for 5 iterations with CPU-drawn noise: its metrics lines and
    its final checkpoint's weights."""
    run = folder / "runs" / name
    args = ["train", "run.yaml", "--run-dir", str(run)]
    for kv in sets:
        args += ["--set", kv]
    assert main(args) == 0
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    _, ckpt = load_newest_valid(run / "checkpoints")
    return lines, whole_weights(ckpt)


def _one_and_two(
    folder: Path, generation: str, learner: str, iterations: int, interval: int
) -> tuple[list[dict], dict[str, torch.Tensor], list[dict], dict[str, torch.Tensor]]:
    """The same seeded run (CPU-drawn noise, float32) on one learner (`runs/one`) and on two
    ranks (`runs/two`): each one's metrics lines and final weights."""
    _sharded_folder(
        folder,
        ", seed: 3",
        f", noise: cpu{generation}",
        f", use_amp: false{learner}",
        f"checkpoint: {{interval: {interval}}}\nstop: {{iterations: {iterations}, env_steps: null}}\n",
    )
    one, w1 = _run(folder, "one")
    two, w2 = _run(folder, "two", "learner.num_learners=2")
    return one, w1, two, w2


def whole_weights(ckpt: Checkpoint) -> dict[str, torch.Tensor]:
    """A checkpoint's model weights, whole: a sharded checkpoint's read from its shards in this one
    process (DCP reshards every rank's pieces into whole tensors)."""
    folder = ckpt.learner.get(SHARDS_KEY)
    if folder is None:
        return ckpt.learner["model"]
    state = {"model": {k: torch.empty(t.shape, dtype=t.dtype) for k, t in ckpt.learner["model"].items()}}
    shards.load(state, Path(folder))
    return state["model"]


def test_two_fsdp_ranks_train_what_one_learner_does(local_ray, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one, w1, two, w2 = _one_and_two(tmp_path, "", ", kl_coef: 0.05", iterations=5, interval=5)
    assert len(one) == len(two) == 5
    # the same completions: their rewards and lengths, round by round
    for a, b in zip(one, two, strict=True):
        assert a["reward_mean"] == b["reward_mean"] and a["completion_len_mean"] == b["completion_len_mean"]
        assert a["policy_loss"] == pytest.approx(b["policy_loss"], abs=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    assert set(w1) == set(w2)
    # the sharded run's checkpoint is a folder in which each rank wrote its own shards
    ckpt = tmp_path / "runs" / "two" / "checkpoints" / "ckpt-00000005"
    assert sorted(p.name for p in (ckpt / "shards").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert max(float((w1[k] - w2[k]).abs().max()) for k in w1) < 1e-6  # 1.2e-7 measured
    # each rank holds about half the parameters; the whole model is the one learner's
    assert two[-1]["model_param_bytes"] == one[-1]["model_param_bytes"]
    assert two[-1]["learner_param_bytes"] <= 0.55 * one[-1]["learner_param_bytes"]
    # the memory estimate's weights term is what a rank measures holding (within 20%)
    from relay_rl.contracts.config import load_config
    from relay_rl.services.driver.families.language import memory_estimate

    for n, lines in ((1, one), (2, two)):
        est = memory_estimate(load_config("run.yaml", [f"learner.num_learners={n}"]))
        assert abs(est.weights - lines[-1]["learner_param_bytes"]) <= 0.2 * lines[-1]["learner_param_bytes"]
    # its Hugging Face export is one folder that generates the learner's greedy tokens (the
    # exporter checks that as it writes)
    assert (
        main(["export", str(tmp_path / "runs" / "two"), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    )
    assert (tmp_path / "hf" / "config.json").is_file()
    # the sharded run resumes at N=1 from its shards (read whole), and goes on learning
    assert (
        main(
            [
                "resume",
                str(tmp_path / "runs" / "two"),
                "--set",
                "learner.num_learners=1",
                "--set",
                "stop.iterations=7",
            ]
        )
        == 0
    )
    lines = (tmp_path / "runs" / "two" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["iteration"] for x in lines] == list(range(1, 8))
    # and the single learner's run resumes on two ranks from its whole file (each rank loads the
    # whole tensors, keeps its shards): its 6th and 7th updates are the ones the sharded run
    # resumed at N=1 made
    assert (
        main(
            [
                "resume",
                str(tmp_path / "runs" / "one"),
                "--set",
                "learner.num_learners=2",
                "--set",
                "stop.iterations=7",
            ]
        )
        == 0
    )
    again = (tmp_path / "runs" / "one" / "metrics.jsonl").read_text().splitlines()
    for a, b in zip(again[5:], lines[5:], strict=True):
        x, y = json.loads(a), json.loads(b)
        assert x["iteration"] == y["iteration"] and x["reward_mean"] == y["reward_mean"]
        assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-4)


def test_two_ranks_train_on_a_generators_completions_as_one_learner_does(local_ray, tmp_path, monkeypatch):
    """generation.placement=workers with two FSDP2 ranks: every rank prepares the round (the
    generator samples rank 0's, the whole round), takes its rows of the completions, and the
    whole weights are gathered once per version and sent from rank 0 with their version. With
    refills (drop_equal_groups): the groups kept are any of a round's, wherever their rows were;
    each rank trains its share of the kept batch, as one learner trains all of it."""
    monkeypatch.chdir(tmp_path)
    refills = ", grpo: {drop_equal_groups: true, refill_rounds: 2}"
    one, w1, two, w2 = _one_and_two(tmp_path, ", placement: workers", refills, iterations=3, interval=100)
    assert len(one) == len(two) == 3
    assert [x["refill_rounds"] for x in one] == [x["refill_rounds"] for x in two]
    assert max(x["refill_rounds"] for x in two) >= 1  # a rare reward: most groups all equal
    # version 0 is the model folder's on both: the same completions, the same update
    assert one[0]["reward_mean"] == two[0]["reward_mean"]
    assert one[0]["completion_len_mean"] == two[0]["completion_len_mean"]
    assert one[0]["grad_norm"] == pytest.approx(two[0]["grad_norm"], rel=1e-4)
    for a, b in zip(one, two, strict=True):  # each version's whole weights, once, none refused
        assert a["weight_sync_bytes"] == b["weight_sync_bytes"] > 0 and b["weight_sync_retries"] == 0
        assert b["policy_lag_mean"] == 0
    assert max(float((w1[k] - w2[k]).abs().max()) for k in w1) < 1e-4


def _update_on_ranks(
    rank: int, world: int, folder: str, port: int, out: str, sets: tuple[str, ...] = (), rounds: int = 1
) -> None:
    """`rounds` rounds generated and trained on rank `rank` of `world` (gloo), the config's
    `sets` applied: rank 0 writes the whole weights after them, the completions and each round's
    graph counts to `out`. With world > 1, rank 0 first makes the one learner's updates of the
    same rounds (to `one.pt`), while its peers wait to join."""
    import os

    import torch.distributed as dist

    from relay_rl.contracts.config import load_config
    from relay_rl.learner.distributed import init_group
    from relay_rl.learner.lm.learner import LanguageLearner

    os.chdir(folder)
    torch.set_num_threads(1)
    if world > 1 and rank == 0:
        _update_on_ranks(0, 1, folder, port, str(Path(folder) / "one.pt"), sets, rounds)
    learner = LanguageLearner(load_config("run.yaml", [f"learner.num_learners={world}", *sets]))
    if world > 1:
        init_group(learner.dev, rank, world, "127.0.0.1", port, timeout_s=120)
        learner.shard(rank, world)
    completions, graphs = [], []
    for _ in range(rounds):
        parts = [learner.generate_round()]
        if world > 1:
            gathered: list = [None] * world
            dist.all_gather_object(gathered, parts[0])
            parts = gathered
        completions += [c for p in parts for c in p["completions"]]
        # rewards that differ within every group: a real gradient, not a KL term's float noise
        # at its first step (the reference equals the policy there: Adam's first step is the sign
        # of the gradient, and a gradient of noise would flip signs between any two summation
        # orders)
        metrics = learner.train([float(i % 3) for i in range(len(parts) * len(parts[0]["completions"]))])
        graphs.append({k: metrics[k] for k in ("compiles", "update_compiles") if k in metrics})
    state = learner.state_dict()
    if rank == 0:
        torch.save({"model": state["model"], "completions": completions, "graphs": graphs}, out)
    if world > 1:
        dist.destroy_process_group()


def _one_and_two_processes(folder: Path, sets: tuple[str, ...] = (), rounds: int = 1) -> tuple[dict, dict]:
    """`_update_on_ranks` by one learner and by two ranks: what each wrote."""
    _two_processes(_update_on_ranks, str(folder), str(folder / "two.pt"), sets, rounds)
    return torch.load(folder / "one.pt"), torch.load(folder / "two.pt")


def _two_processes(fn: Any, folder: str, *args: Any) -> None:
    """`fn(rank, 2, folder, port, *args)` in two processes of their own (a rank changes its
    working folder and its torch threads), joined over a free local port."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(fn, args=(2, folder, port, *args), nprocs=2, start_method="spawn")


def _tiny_run_yaml(folder: Path, learner: str = "", generation: str = "", model: str = "") -> None:
    """A run.yaml for one round's update on the tiny model in `folder` (groups of 4, 4 prompts)."""
    (folder / "run.yaml").write_text(
        f"model: {{kind: causal_lm, path: model{model}}}\n"
        "prompts: {train: sums.jsonl, max_prompt_tokens: 8, rewards: ['regex:1'], batch_size: 4, seed: 5}\n"
        f"generation: {{max_new_tokens: 5, noise: cpu{generation}}}\n"
        f"learner: {{group_size: 4, device: cpu{learner}}}\n"
        "rollout: {num_workers: 1}\nstop: {iterations: 1}\n"
    )


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("variant", ["kl", "lora"])
def test_one_fsdp_update_at_two_ranks_is_the_update_at_one(arch, variant, tmp_path):
    """#60's engine check, without Ray: the same round's update by one learner and by two FSDP2
    ranks (two processes, gloo) gives the same weights within 1e-6, for each architecture the
    tests build, with a KL reference (sharded too) and with LoRA adapters (the base frozen)."""
    tiny_model_folder(tmp_path / "model", arch)
    # No dropout: each rank draws its own rows' masks, so with dropout the update is the same in
    # distribution at any N but not bit for bit (GPT-2's config has 0.1 by default).
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    config.update({k: 0.0 for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop") if k in config})
    (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    write_jsonl(tmp_path / "sums.jsonl", sums_rows())
    # LoRA's B starts at zero with gradients of Adam's eps's order: its first step, g / (|g| + eps)
    # times lr, carries their float differences at lr's scale (1.8e-6 at lr 0.01; 1.8e-7 here)
    learner = ", kl_coef: 0.1" if variant == "kl" else ", kl_coef: 0.1, lr: 0.001"
    lora = ", lora: {r: 4, alpha: 8}" if variant == "lora" else ""
    _tiny_run_yaml(tmp_path, ", use_amp: false" + learner, model=lora)
    one, two = _one_and_two_processes(tmp_path)
    assert one["completions"] == two["completions"]
    assert set(one["model"]) == set(two["model"])
    diffs = {k: float((one["model"][k] - two["model"][k]).abs().max()) for k in one["model"]}
    assert max(diffs.values()) < 1e-6


@pytest.mark.slow
def test_compiled_decoding_and_update_at_two_ranks_compile_once_and_match_one_learner(tmp_path):
    """generation.compile and learner.compile over two FSDP2 ranks. The compiled decoding step
    runs a hook-free copy of the model's structure handed the gathered tensors (a sharded unit's
    gathering hooks cannot be traced), the compiled update the bound `completion_logp` FSDP
    registered (its root unit gathered first; each unit's hooks a graph break). Three rounds:
    the same completions as one learner's, no graph compiled after the first round, and the
    same weights within 1e-6. (aot_eager traces and guards as inductor does, in seconds.)"""
    tiny_model_folder(tmp_path / "model")
    write_jsonl(tmp_path / "sums.jsonl", sums_rows())
    _tiny_run_yaml(tmp_path, ", use_amp: false, compile: true, compile_backend: aot_eager", ", compile: true")
    one, two = _one_and_two_processes(tmp_path, rounds=3)
    assert one["completions"] == two["completions"]
    for graphs in (one["graphs"], two["graphs"]):
        assert graphs[0]["compiles"] >= 1 and graphs[0]["update_compiles"] >= 1
        assert graphs == [graphs[0]] * 3  # compiled in the first round, never again
    diffs = {k: float((one["model"][k] - two["model"][k]).abs().max()) for k in one["model"]}
    assert max(diffs.values()) < 1e-6


def _fp16_steps_on_ranks(rank: int, world: int, folder: str, port: int) -> None:
    """Two float16 updates on rank `rank` of `world` (gloo) with the sharded grad scaler, the
    first with one inf planted in rank 1's gradient shards: each rank writes what it saw to
    `fp16-<rank>.pt` (steps skipped, the scale, whether its shards moved)."""
    import os

    import torch.distributed as dist
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
    from torch.distributed.tensor import DTensor

    from relay_rl.contracts.config import load_config
    from relay_rl.learner.device import DeviceContext
    from relay_rl.learner.distributed import init_group
    from relay_rl.learner.lm.learner import LanguageLearner

    os.chdir(folder)
    torch.set_num_threads(1)
    sets = [f"learner.num_learners={world}", "learner.use_amp=true", "learner.amp_dtype=float16"]
    learner = LanguageLearner(load_config("run.yaml", sets))
    init_group(learner.dev, rank, world, "127.0.0.1", port, timeout_s=120)
    assert learner.scaler is None  # the CPU takes no scaler: an accelerator's stands in

    def accelerators(dev: DeviceContext, enabled: bool, dtype: str, sharded: bool = False) -> Any:
        assert enabled and dtype == "float16" and sharded
        return ShardedGradScaler("cpu", init_scale=2.0**10)

    DeviceContext.grad_scaler = accelerators  # type: ignore[method-assign]  # this process's alone
    learner.shard(rank, world)
    assert not learner.optimizer.defaults["fused"]  # the scaler checks; Adam steps after
    backward = learner._backward

    def poisoned(*args, **kwargs):
        stats = backward(*args, **kwargs)
        if rank == 1:
            grad = next(p.grad for p in learner.policy.parameters() if p.grad is not None)
            (grad.to_local() if isinstance(grad, DTensor) else grad).view(-1)[0] = float("inf")
        return stats

    def shards() -> list[torch.Tensor]:
        return [p.to_local().detach().clone() for p in learner.policy.parameters()]

    seen = []
    for plant in (True, False):
        learner._backward = poisoned if plant else backward
        before = shards()
        completions = learner.generate_round()["completions"]
        metrics = learner.train([float(i % 3) for i in range(len(completions) * world)])
        moved = any(not torch.equal(a, b) for a, b in zip(before, shards(), strict=True))
        seen.append({"skipped": metrics["amp_skipped"], "scale": learner.scaler.get_scale(), "moved": moved})
    torch.save(seen, Path(folder) / f"fp16-{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.slow
def test_a_non_finite_gradient_on_one_rank_skips_the_float16_step_on_every_rank(tmp_path):
    """float16 over two FSDP2 ranks: the sharded grad scaler (torch's ShardedGradScaler, what the
    learner takes on cuda; torch_npu's on npu) all-reduces its non-finite check, so an inf in one
    rank's gradient shards skips the step on both, and both back off alike; the next step is
    taken by both. The CPU takes no scaler, so the test hands the ranks the accelerator's class,
    run on the CPU. (A plain scaler would skip on rank 1 alone, and the shards would part.)"""
    tiny_model_folder(tmp_path / "model")
    write_jsonl(tmp_path / "sums.jsonl", sums_rows())
    _tiny_run_yaml(tmp_path)
    _two_processes(_fp16_steps_on_ranks, str(tmp_path))
    seen = [torch.load(tmp_path / f"fp16-{r}.pt") for r in range(2)]
    assert seen[0] == seen[1]  # the same decisions, the same scale
    planted, clean = seen[0]
    assert planted == {"skipped": 1, "scale": 2.0**9, "moved": False}
    assert clean["skipped"] == 0 and clean["moved"] and clean["scale"] == 2.0**9


def test_a_sharded_group_that_loses_a_rank_is_restarted_from_the_checkpoint(
    local_ray, tmp_path, monkeypatch, capsys
):
    """One rank dies mid-run; its peer's collective fails with it (gloo: the connection resets;
    NCCL and HCCL: learner.collective_timeout_s), the whole group is recreated, joins and shards
    anew, loads the newest checkpoint, and the run ends at its stop."""
    import threading

    import ray

    from relay_rl.contracts.config import load_config
    from relay_rl.services.driver.lm_backend import LanguageBackend
    from relay_rl.services.driver.loop import TrainingLoop
    from relay_rl.services.runs.run_dir import RunDir
    from tests.helpers_proc import metrics_lines, wait_for

    monkeypatch.chdir(tmp_path)
    _sharded_folder(
        tmp_path,
        "",
        "",
        ", num_learners: 2, collective_timeout_s: 60",
        "checkpoint: {interval: 2}\nstop: {iterations: 12, env_steps: null}\n",
    )
    cfg = load_config("run.yaml")
    backend = LanguageBackend(cfg)
    # Sharded checkpoints need every rank to see the run folder's storage: here they do; a rank
    # that did not (on a node without the shared mount: one cannot exist here) is named in one
    # line, and the probe file is gone either way.
    assert backend.storage_problem(tmp_path / "runs" / "new") is None
    assert len(backend.learner.blind_ranks(str(tmp_path / "run.yaml"), "not its contents")) == 2
    monkeypatch.setattr(backend.learner, "blind_ranks", lambda path, token: ["rank 1 (node 5f2a)"])
    problem = backend.storage_problem(tmp_path / "runs" / "new")
    assert problem is not None and problem.startswith("checkpoint.format=sharded: learner rank 1 (node 5f2a)")
    assert not list(tmp_path.glob(".relay-storage-probe-*")) and not (tmp_path / "runs").exists()
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    loop = TrainingLoop(cfg, RunDir.claim(tmp_path / "run", cfg), backend)
    group = backend.learner.group
    victim = group.ranks[1]

    def kill_later() -> None:
        wait_for(lambda: len(metrics_lines(loop.run.root)) >= 5, 120, "five iterations")
        ray.kill(victim)

    threading.Thread(target=kill_later, daemon=True).start()
    try:
        assert loop.run_until_stop() == "iterations"
        lines = metrics_lines(loop.run.root)
        assert lines[-1]["learner_restarts"] == 1 and victim not in group.ranks and len(group) == 2
        assert lines[-1]["iteration"] == 12 and "restarted from ckpt-" in capsys.readouterr().err
        assert lines[-1]["learner_param_bytes"] < lines[-1]["model_param_bytes"]  # sharded again
    finally:
        backend.close()


def test_sigterm_stops_every_rank_cleanly(tmp_path):
    """SIGTERM to a sharded run: exit 143, a final checkpoint at the last metrics line (gathered
    from both ranks), and no process of the run left (the ranks work in the run's folder)."""
    import os
    import signal
    import subprocess
    import sys

    from tests.helpers_proc import ROOT, metrics_lines, wait_for

    _sharded_folder(
        tmp_path,
        "",
        "",
        ", num_learners: 2",
        "checkpoint: {interval: 1000}\nstop: {iterations: 100000, env_steps: null}\n",
    )
    run = tmp_path / "runs" / "r"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "relay_rl.services.train", "run.yaml", "--run-dir", str(run)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    wait_for(lambda: len(metrics_lines(run)) >= 3, 180, "three iterations")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    lines = metrics_lines(run)
    _, ckpt = load_newest_valid(run / "checkpoints")
    assert ckpt.counters.iteration == lines[-1]["iteration"] and ckpt.learner["version"] == len(lines)

    def left() -> list[str]:
        out = []
        for pid in os.listdir("/proc"):
            try:
                if pid.isdigit() and os.readlink(f"/proc/{pid}/cwd") == str(tmp_path):
                    out.append(pid)
            except OSError:
                continue
        return out

    wait_for(lambda: not left(), 30, "the run's processes to end")
