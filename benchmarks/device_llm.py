"""The device report's language section: GRPO on a Qwen2.5-0.5B-shaped causal LM (its config,
random weights, nothing downloaded) on the device, beside transformers' `generate` and TRL's
`GRPOTrainer` on the same model and device in the same run.

    python benchmarks/device_llm.py [--device auto] [--quick]

1. generation at 64 rows x 256 new tokens (no end token: every row decodes every step):
   transformers `generate`, relay's eager KV-cache loop and its compiled static-cache step
   (inductor; on cuda also inductor with CUDA graphs), tokens/s, compile seconds, compiles;
2. relay's learner, a round of 8 prompts x 8 completions of 256 tokens, with and without
   gradient checkpointing, and sharded by FSDP2 over a group of this one device (the sharded
   learner's path): generated and trained tokens/s, the device's peak memory, and `compiles`
   over rounds of prompts of many lengths (flat after the first round);
3. TRL's GRPOTrainer on the same folder, batch and lengths: seconds per step and tokens/s.

--quick runs the tiny test model instead, at 8 rows x 16 tokens, compiled through aot_eager on the
CPU (inductor's C++ build is minutes there): the code path CI runs, not measurements.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from common import failure, machine_header, table
from tiny_lm import hf_sample, qwen_05b_config, tiny_model_folder, write_jsonl, write_tokenizer

GROUP = 8


def _missing(*modules: str) -> str | None:
    gone = [m for m in modules if importlib.util.find_spec(m) is None]
    return f"skipped: {', '.join(gone)} not importable here" if gone else None


def model_folder(root: Path, quick: bool) -> Path:
    """The tiny test model (--quick) or a Qwen2.5-0.5B-shaped one with random weights."""
    if quick:
        return tiny_model_folder(root / "model")
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    folder = root / "qwen-0.5b-shape"
    AutoModelForCausalLM.from_config(qwen_05b_config()).save_pretrained(str(folder))
    write_tokenizer(folder)
    return folder


def _backends(device: str, quick: bool) -> dict[str, Any]:
    """The compile backends the compiled step is measured under, by name."""
    import functools

    if quick and device == "cpu":
        return {"aot_eager": "aot_eager"}
    from relay_rl.learner.device import resolve_device

    out: dict[str, Any] = {"auto": resolve_device(device).compile_backend("auto")}
    if device.startswith("cuda"):
        from torch._inductor.compile_fx import compile_fx

        out["inductor + CUDA graphs"] = functools.partial(
            compile_fx, config_patches={"triton.cudagraphs": True}
        )
    return out


def _timed_generation(fn: Any, dev: Any, bf16: bool, repeats: int) -> tuple[float, float]:
    """(seconds of the first call, which compiles; best seconds of `repeats` calls after it)."""
    with dev.autocast(bf16, "bfloat16"):
        t0 = time.perf_counter()
        fn()
        dev.synchronize()
        first = time.perf_counter() - t0
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            dev.synchronize()
            times.append(time.perf_counter() - t0)
    return first, min(times)


def generation(folder: Path, device: str, rows: int, new: int, quick: bool) -> str:
    import torch

    from relay_rl.learner.device import resolve_device
    from relay_rl.policy.causal_lm import CausalLMPolicy, load_causal_lm
    from relay_rl.policy.lm_decoding import StaticDecoder

    dev = resolve_device(device)
    bf16 = dev.bf16_units() is not None
    model = load_causal_lm(folder).to(dev.device).eval()
    policy = CausalLMPolicy(model, 0, []).to(dev.device).eval()  # no end token: every row decodes
    width = 64 if not quick else 8
    ids = torch.randint(3, model.config.vocab_size, (rows, width), generator=torch.Generator().manual_seed(0))
    ids, mask = ids.to(dev.device), torch.ones_like(ids).to(dev.device)
    noise = torch.Generator(dev.device).manual_seed(0)

    samplers: list[tuple[str, Any, StaticDecoder | None]] = [
        ("transformers generate", lambda: hf_sample(model, ids, mask, new), None),
        ("relay eager (KV cache)", lambda: policy.generate(ids, mask, new, 1.0, 0, noise), None),
    ]
    for name, backend in _backends(device, quick).items():
        decoder = StaticDecoder(policy, backend, width, 1.0, 0)
        samplers.append(
            (f"relay compiled ({name})", lambda d=decoder: d(ids, mask, new, 1.0, 0, noise), decoder)
        )
    out = []
    for name, fn, decoder in samplers:
        try:
            first, best = _timed_generation(fn, dev, bf16, 2 if quick else 3)
        except Exception as err:  # one sampler's failure (a backend, CUDA graphs) keeps the others' rows
            why = " ".join(f"{type(err).__name__}: {err}".split())[:160]
            out.append([name, rows, new, f"failed: {why}", "", decoder.compiles if decoder else ""])
            continue
        compile_s = f"{max(first - best, 0.0):.1f}" if decoder is not None else ""
        out.append(
            [name, rows, new, f"{rows * new / best:,.0f}", compile_s, decoder.compiles if decoder else ""]
        )
    head = ["sampler", "rows", "new tokens", "tokens/s", "compile s", "compiles"]
    precision = "bf16 autocast" if bf16 else "float32"
    return f"precision: {precision}\n" + table(head, out)


def _prompt_rows() -> list[dict[str, str]]:
    """Prompts 1 to 15 characters long, in an order that visits every bucket of [4, 8, 16] within
    the first three prompts (a round of one prompt, --quick's, still changes width)."""
    order = [1, 6, 11, 2, 7, 12, 3, 8, 13, 4, 9, 14, 5, 10, 15]
    return [{"prompt": ("12+" * 5)[:n], "answer": "3"} for n in order]


def training(folder: Path, root: Path, device: str, rows: int, new: int, quick: bool) -> str:
    import torch

    from relay_rl.contracts.config import RelayConfig
    from relay_rl.learner.lm.learner import LanguageLearner

    prompts = write_jsonl(root / "prompts.jsonl", _prompt_rows())
    out = []
    # plain, with gradient checkpointing, and sharded with FSDP2 over a group of this one device
    # (the path learner.num_learners > 1 takes, on the one device a check is lent; eager decoding,
    # as the sharded learner decodes)
    for ckpt, fsdp in ((False, False), (True, False), (False, True)):
        cfg = RelayConfig.model_validate(
            {
                "model": {"kind": "causal_lm", "path": str(folder)},
                "prompts": {
                    "train": str(prompts),
                    "rewards": ["numeric_match"],
                    "batch_size": rows // GROUP,
                    "max_prompt_tokens": 16,
                    "shuffle": False,
                },
                "generation": {"max_new_tokens": new, "compile": not fsdp, "prompt_buckets": [4, 8, 16]},
                "learner": {
                    "group_size": GROUP,
                    "device": device,
                    "grad_checkpointing": ckpt,
                    "compile_backend": "aot_eager" if quick and device == "cpu" else "auto",
                },
            }
        )
        learner = LanguageLearner(cfg)
        if fsdp:
            _one_rank_group(learner)
            learner.shard(0, 1)
        compiles, widths = [], set()
        gen_rate = train_rate = 0.0
        peak, step_s = 0, float("inf")
        for i in range(3):
            t0 = time.perf_counter()
            got = learner.generate_round()
            widths.add(got["prompt_width"])
            g = torch.Generator().manual_seed(i)
            metrics = learner.train(torch.rand(len(got["lengths"]), generator=g).tolist())
            compiles.append(metrics.get("compiles"))
            if i:  # the first round compiles
                step_s = min(step_s, time.perf_counter() - t0)
                gen_rate = max(gen_rate, got["gen_tokens"] / max(got["gen_s"], 1e-9))
                train_rate = max(train_rate, metrics["trained_tokens_per_s"])
            peak = max(peak, int(metrics.get("device_memory_peak_bytes", 0)))
        mib = f"{peak / 2**20:,.0f}" if peak else "n/a on cpu"
        out.append(
            [
                "fsdp2, 1 rank" if fsdp else "-",
                "on" if ckpt else "off",
                learner.describe()["precision"],
                f"{gen_rate:,.0f}",
                f"{train_rate:,.0f}",
                f"{step_s:.2f}",
                mib,
                "eager" if fsdp else " ".join(str(c) for c in compiles),
                " ".join(str(w) for w in sorted(widths)),
            ]
        )
        del learner
        if fsdp:
            torch.distributed.destroy_process_group()
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    head = [
        "sharding",
        "grad checkpointing",
        "precision",
        "generated tok/s",
        "trained tok/s",
        "s per round (best after the first)",
        "peak device MiB",
        "compiles by round",
        "prompt widths",
    ]
    return f"{rows // GROUP} prompts x {GROUP} completions, {new} new tokens\n" + table(head, out)


def _one_rank_group(learner: Any) -> None:
    """A process group of this process alone, on the learner's device's backend."""
    import socket

    from relay_rl.learner.distributed import init_group

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    init_group(learner.dev, 0, 1, "127.0.0.1", port, timeout_s=300)


def trl_beside(folder: Path, device: str, rows: int, new: int, quick: bool) -> str:
    why = _missing("trl", "datasets", "accelerate")
    if why:
        return why
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    times: list[float] = []

    class Clock(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            times.append(time.perf_counter() - self.t0)

    def reward(completions: list[str], **kw: Any) -> list[float]:
        return [float(len(c) % 3 == 0) for c in completions]

    with tempfile.TemporaryDirectory() as out:
        cfg = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=rows,
            num_generations=GROUP,
            max_completion_length=new,
            learning_rate=1e-6,
            beta=0.0,
            num_iterations=1,
            temperature=1.0,
            use_cpu=device == "cpu",
            bf16=device != "cpu",
            logging_steps=1,
            max_steps=3,
            save_strategy="no",
            report_to=[],
            disable_tqdm=True,
            seed=0,
        )
        trainer = GRPOTrainer(
            model=str(folder),
            reward_funcs=[reward],
            args=cfg,
            train_dataset=Dataset.from_list(_prompt_rows() * 8),
            callbacks=[Clock()],
        )
        trainer.train()
    step = min(times[1:] or times)
    return table(
        ["", "rows", "new tokens", "s per step (best after the first)", "completion tokens/s"],
        [["TRL GRPOTrainer", rows, new, f"{step:.2f}", f"{rows * new / step:,.0f}"]],
    )


def report(device: str, quick: bool) -> str:
    """The three parts as one text (each part says why where it was skipped or failed)."""
    why = _missing("transformers", "tokenizers", "safetensors")
    if why:
        return why
    rows, new = (GROUP, 16) if quick else (64, 256)
    parts = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folder = model_folder(root, quick)
        shape = json.loads((folder / "config.json").read_text())
        parts.append(
            f"model: {shape.get('model_type')} hidden {shape.get('hidden_size')}, "
            f"{shape.get('num_hidden_layers')} layers, vocab {shape.get('vocab_size')} (random weights)"
        )
        for title, body in (
            ("generation", lambda: generation(folder, device, rows, new, quick)),
            ("relay's learner", lambda: training(folder, root, device, rows, new, quick)),
            ("TRL beside it", lambda: trl_beside(folder, device, rows, new, quick)),
        ):
            try:
                parts.append(f"### {title}\n{body()}")
            except Exception as err:  # a report keeps going: the other parts are still worth having
                parts.append(f"### {title}\n{failure(err)}")
    return "\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--quick", action="store_true", help="the tiny model: the code path, not measurements"
    )
    args = parser.parse_args()
    from relay_rl.learner.device import check_device

    device = str(check_device(args.device))
    print(machine_header(f"relay device report, language: {device}{' (--quick)' if args.quick else ''}"))
    print(report(device, args.quick))


if __name__ == "__main__":
    main()
