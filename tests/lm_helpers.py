"""The tiny models and prompt files of benchmarks/tiny_lm.py, for the tests."""

from benchmarks.tiny_lm import CHARS, sums_rows, tiny_config, tiny_model_folder, write_jsonl

__all__ = ["CHARS", "sums_rows", "tiny_config", "tiny_model_folder", "write_jsonl"]
