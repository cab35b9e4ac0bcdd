"""The tiny models and prompt files of benchmarks/tiny_lm.py, for the tests."""

from pathlib import Path

from benchmarks.tiny_lm import CHARS, sums_rows, tiny_config, tiny_model_folder, write_jsonl

__all__ = ["CHARS", "sevens_run", "sums_rows", "tiny_config", "tiny_model_folder", "write_jsonl"]


def sevens_run(root: Path, checkpoint_interval: int = 5) -> Path:
    """A folder with a tiny model, one-digit sums and `run.yaml`: a local language run whose
    reward is a 7 anywhere in the completion (the untrained model writes one in ~1/8 of them;
    trained, in most), 8,000 completion tokens. Returns `root`."""
    tiny_model_folder(root / "model")
    write_jsonl(root / "sums.jsonl", sums_rows())
    (root / "run.yaml").write_text(
        "model: {kind: causal_lm, path: model}\n"
        "prompts: {train: sums.jsonl, rewards: ['regex:7'], batch_size: 4, max_prompt_tokens: 8}\n"
        "generation: {max_new_tokens: 6}\n"
        "learner: {group_size: 8, lr: 0.003, device: cpu}\n"
        "rollout: {num_workers: 0}\n"
        "stop: {env_steps: 8000}\n"
        f"checkpoint: {{interval: {checkpoint_interval}}}\n"
        "metrics: {progress: none}\n"
    )
    return root
