"""RLHF on the tiny task with a known answer: a reward model trained by relay on preference pairs
(the right one-digit sum preferred to a wrong one), beside TRL's RewardTrainer, then GRPO against
it, each policy judged by the true (programmatic) reward.

    python benchmarks/rlhf.py reward-model [--seconds 10]
    python benchmarks/rlhf.py loop [--seconds 60]

reward-model: the same tiny random-init Llama folder and pairs (benchmarks/tiny_lm.py --pairs),
relay (configs/tiny_rm.yaml, local) and TRL's RewardTrainer (its defaults but the learning rate,
batch and CPU float32 of relay's), each for the same wall; reported: the held-out pair accuracy
each reached (relay's by `relay eval`, TRL's by its own evaluate), and pairs trained per second.

loop: relay's reward model (as above, 200 iterations) exported, then configs/tiny_lm_grpo.yaml
for the same wall with its rewards replaced: the reward model alone, the format reward beside it
(weights 4 and 1), and the programmatic rewards as shipped (the ceiling). Each policy is scored
by numeric_match on the 100 prompts, greedy (`relay eval --reward numeric_match`), beside the
untrained model; reward hacking shows as a high learned reward with a low true one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from common import failure, machine_header, table, train_relay
from tiny_lm import sum_pairs, sums_rows, tiny_model_folder, write_jsonl

ROOT = Path(__file__).parents[1]
BATCH, LR = 32, 3e-3
FORMAT = "regex:^[0-9]{1,2}$"


def relay_cli(*args: str) -> str:
    """`relay ARGS` in a fresh process: its stdout (stderr on failure, raised)."""
    done = subprocess.run(
        [sys.executable, "-m", "relay_rl.services.cli", *args], cwd=ROOT, capture_output=True, text=True
    )
    if done.returncode:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed")
    return done.stdout


def assets(tmp: Path) -> tuple[Path, Path, Path, Path]:
    """(the tiny model, the sums prompts, the training pairs, the held-out pairs) under `tmp`."""
    model = tiny_model_folder(tmp / "model")
    prompts = write_jsonl(tmp / "sums.jsonl", sums_rows())
    pairs = write_jsonl(tmp / "pairs.jsonl", sum_pairs(0))
    held = write_jsonl(tmp / "held.jsonl", sum_pairs(1, per_prompt=1))
    return model, prompts, pairs, held


def relay_reward_model(model: Path, pairs: Path, held: Path, run: Path, sets: list[str]) -> dict[str, Any]:
    """relay's reward model trained into `run`: its last line, wall and held-out accuracy."""
    base = [f"model.path={model}", f"prompts.train={pairs}", f"prompts.eval={held}", "learner.device=cpu"]
    lines = train_relay("configs/tiny_rm.yaml", [*base, *sets], run_dir=run)
    said = json.loads(relay_cli("eval", str(run), "--episodes", "1000", "--json").strip().splitlines()[-1])
    return {"lines": lines, "wall": lines[-1]["wall_s"], "accuracy": said["return_mean"]}


def trl_reward_model(model: Path, pairs: Path, held: Path, seconds: float, out: Path) -> dict[str, Any]:
    """TRL's RewardTrainer on the same pairs and model for `seconds`: held-out accuracy, steps."""
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback
    from trl import RewardConfig, RewardTrainer

    rows = [json.loads(x) for x in pairs.read_text().splitlines()]
    held_rows = [json.loads(x) for x in held.read_text().splitlines()]
    steps, t0 = [0], [0.0]

    class Clock(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if not t0[0]:
                t0[0] = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            steps[0] = state.global_step
            if time.perf_counter() - t0[0] >= seconds:
                control.should_training_stop = True

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    scorer = AutoModelForSequenceClassification.from_pretrained(str(model), num_labels=1)
    scorer.config.pad_token_id = tokenizer.pad_token_id
    cfg = RewardConfig(
        output_dir=str(out),
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH,
        learning_rate=LR,
        lr_scheduler_type="constant",
        max_steps=100_000,
        num_train_epochs=1000,
        use_cpu=True,
        bf16=False,
        logging_steps=10,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        seed=0,
    )
    trainer = RewardTrainer(
        model=scorer,
        args=cfg,
        train_dataset=Dataset.from_list(rows),
        eval_dataset=Dataset.from_list(held_rows),
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    trainer.train()
    wall = time.perf_counter() - t0[0]
    accuracy = trainer.evaluate().get("eval_accuracy")
    return {"wall": wall, "steps": steps[0], "accuracy": accuracy}


def reward_model(seconds: float) -> None:
    print(machine_header("RLHF: a reward model on the tiny sums pairs, relay beside TRL's RewardTrainer"))
    print(f"\n`python benchmarks/rlhf.py reward-model --seconds {seconds:g}`\n")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model, _, pairs, held = assets(Path(tmp))
        try:
            got = relay_reward_model(
                model, pairs, held, Path(tmp) / "rm", ["stop.iterations=null", f"stop.wall_s={seconds}"]
            )
            trained = got["lines"][-1]["pairs"]
            rows.append(
                [
                    "relay (model.kind=reward_model)",
                    got["wall"],
                    trained,
                    trained / got["wall"],
                    got["accuracy"],
                ]
            )
        except Exception as err:  # a side that fails is a row that says so
            rows.append(["relay (model.kind=reward_model)", failure(err), None, None, None])
        try:
            trl = trl_reward_model(model, pairs, held, seconds, Path(tmp) / "trl")
            trained = trl["steps"] * BATCH
            rows.append(["TRL RewardTrainer", trl["wall"], trained, trained / trl["wall"], trl["accuracy"]])
        except Exception as err:
            rows.append(["TRL RewardTrainer", failure(err), None, None, None])
    print(table(["trainer", "wall s", "pairs trained", "pairs/s", "held-out pair accuracy"], rows))


def loop(seconds: float) -> None:
    print(machine_header("RLHF: GRPO against a reward model relay trained, judged by the true reward"))
    print(f"\n`python benchmarks/rlhf.py loop --seconds {seconds:g}`\n")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model, prompts, pairs, held = assets(root)
        got = relay_reward_model(model, pairs, held, root / "rm", [])
        folder = root / "tiny-rm"
        relay_cli("export", str(root / "rm"), "--format", "hf", "--out", str(folder))
        rm = f"model:{folder}"
        true = ["--episodes", "100", "--prompts", str(prompts), "--reward", "numeric_match", "--json"]
        runs = [
            (
                "none (the untrained model: lr 1e-30, one iteration)",
                ["learner.lr=1e-30", "stop.iterations=1"],
            ),
            ("the reward model alone", [f"prompts.rewards=['{rm}']", "prompts.reward_weights=null"]),
            (
                "format + reward model (4 : 1)",
                [f"prompts.rewards=['{FORMAT}', '{rm}']", "prompts.reward_weights=[4.0, 1.0]"],
            ),
            ("format + numeric_match (the ceiling)", []),
        ]
        rows: list[list[Any]] = []
        for k, (name, sets) in enumerate(runs):
            run = root / f"policy-{k}"
            base = [
                f"model.path={model}",
                f"prompts.train={prompts}",
                "learner.device=cpu",
                f"stop.wall_s={seconds}",
            ]
            try:
                lines = train_relay("configs/tiny_lm_grpo.yaml", [*base, *sets], run_dir=run)
                score = json.loads(relay_cli("eval", str(run), *true).strip().splitlines()[-1])
                last = [x["reward_mean"] for x in lines[-5:] if x["reward_mean"] is not None]
                trained = sum(last) / len(last) if last else None
                rows.append([name, len(lines), trained, score["return_mean"]])
            except Exception as err:
                rows.append([name, failure(err), None, None])
    print(
        f"reward model: held-out pair accuracy {got['accuracy']:.2f} after {len(got['lines'])} iterations\n"
    )
    print(
        table(
            ["GRPO's rewards", "iterations", "trained reward (last 5)", "true reward (greedy, 100 prompts)"],
            rows,
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="what", required=True)
    r = sub.add_parser("reward-model")
    r.add_argument("--seconds", type=float, default=10.0)
    lo = sub.add_parser("loop")
    lo.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    if args.what == "reward-model":
        reward_model(args.seconds)
    else:
        loop(args.seconds)


if __name__ == "__main__":
    main()
