"""A model folder, a prompt file and a chat template are data a user downloads: each is tried here
as an attacker would write it, against the checks `relay validate` and `relay train` share.
Memory and time bombs are refused by a budget in one line naming the file and the limit; broken
weights are found from their headers before anything loads them; links are followed as the Hugging
Face cache lays folders out, to regular files only."""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path

import pytest

from relay_rl.contracts import chat_template, prompts
from relay_rl.contracts.prompts import PromptError, load_prompts
from relay_rl.policy.causal_lm import ModelFolderError, check_model_folder, load_causal_lm, load_tokenizer
from relay_rl.services.cli import main
from tests.lm_helpers import tiny_model_folder, write_jsonl

CHAT = [{"role": "user", "content": "1+2="}]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tiny_model_folder(tmp_path_factory.mktemp("lm") / "model")


def _copy(folder: Path, to: Path) -> Path:
    to.mkdir()
    for f in folder.iterdir():
        (to / f.name).write_bytes(f.read_bytes())
    return to


def _with_template(folder: Path, to: Path, template: str) -> Path:
    bad = _copy(folder, to)
    (bad / "chat_template.jinja").write_text(template)
    return bad


# ---- prompt files -----------------------------------------------------------------------------------
def test_a_100_mb_line_is_refused_by_its_length_without_reading_it(folder, tmp_path):
    path = tmp_path / "bomb.jsonl"
    with path.open("wb") as f:
        f.write(b'{"prompt": "')
        f.write(b"1" * (100 << 20))
        f.write(b'"}\n')
    peak = _peak_rss()
    start = time.monotonic()
    with pytest.raises(PromptError, match=r"bomb\.jsonl: line 1 is over 1 MiB"):
        load_prompts(path, load_tokenizer(folder), 16)
    assert time.monotonic() - start < 5
    assert _peak_rss() < peak + (64 << 20)  # it read at most a megabyte of the line


def _peak_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def test_a_small_parquet_file_declaring_millions_of_rows_is_refused_from_its_metadata(folder, tmp_path):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 5_000_000
    column = pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, np.int32)), pa.array(["1+2=" * 100]))
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"prompt": column}), path)
    assert path.stat().st_size < 1 << 20
    start = time.monotonic()
    with pytest.raises(
        PromptError, match=r"rows\.parquet: declares 5000000 rows, over the 1000000 relay reads"
    ):
        load_prompts(path, load_tokenizer(folder), 16)
    assert time.monotonic() - start < 5


def test_dictionary_values_that_expand_past_the_byte_budget_are_refused(folder, tmp_path, monkeypatch):
    """Under the row cap, one 512 KiB dictionary value repeated 4,000 times is 2 GiB of text: the
    byte budget (lowered here to 64 MiB) stops the read a batch past it."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setattr(prompts, "MAX_TOTAL_ROW_BYTES", 64 << 20)
    column = pa.DictionaryArray.from_arrays(pa.array(np.zeros(4000, np.int32)), pa.array(["1" * (512 << 10)]))
    path = tmp_path / "wide.parquet"
    pq.write_table(pa.table({"prompt": column}), path)
    with pytest.raises(PromptError, match=r"wide\.parquet: its rows hold more than 64 MiB \(at row \d+\)"):
        load_prompts(path, load_tokenizer(folder), 16)


def test_a_parquet_read_that_needs_more_memory_than_its_budget_is_refused(folder, tmp_path, monkeypatch):
    """Arrow expands values in native code, past any Python check: the address-space cap around
    the read (lowered here to 256 MiB) makes its allocation fail, and the file is refused."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setattr(prompts, "READ_MEMORY_BYTES", 256 << 20)
    monkeypatch.setattr(prompts, "PARQUET_BATCH_ROWS", 4096)
    column = pa.DictionaryArray.from_arrays(pa.array(np.zeros(4096, np.int32)), pa.array(["1" * (256 << 10)]))
    path = tmp_path / "deep.parquet"
    pq.write_table(
        pa.table({"prompt": pa.ListArray.from_arrays([0, 4096], column.dictionary_decode())}), path
    )
    with pytest.raises(PromptError, match=r"deep\.parquet: reading it needed more than"):
        load_prompts(path, load_tokenizer(folder), 16)


# ---- chat templates ---------------------------------------------------------------------------------
def test_the_renderer_matches_transformers_apply_chat_template(folder):
    tok = load_tokenizer(folder)
    chats = [CHAT, [{"role": "system", "content": "add"}, *CHAT]]
    want = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats]
    assert chat_template.render_all(tok, chats) == want


@pytest.mark.parametrize(
    ("template", "said"),
    [
        ("{{ 'x' * 200000000 }}", "the chat template rendered 200000000 characters, over the 1048576"),
        ("{{ 'x' * 20000000000 }}", "the chat template needed more than 1024 MiB of memory"),
        ("{{ raise_exception('no') }}", r"the chat template failed \(TemplateError\)"),
    ],
)
def test_template_memory_bombs_are_refused_in_one_line(folder, tmp_path, template, said):
    bad = _with_template(folder, tmp_path / "bad", template)
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "1+1="}, {"prompt": CHAT}])
    start = time.monotonic()
    with pytest.raises(PromptError, match=rf"p\.jsonl: row 2: {said}") as err:
        load_prompts(path, load_tokenizer(bad), 16)
    assert "\n" not in str(err.value)
    assert time.monotonic() - start < 30


def test_a_template_that_loops_ten_billion_times_is_stopped_at_its_time_budget(folder, tmp_path, monkeypatch):
    monkeypatch.setattr(chat_template, "RENDER_SECONDS", 3.0)
    loops = "".join("{% for i" + str(d) + " in range(100) %}" for d in range(5)) + "{% endfor %}" * 5
    bad = _with_template(folder, tmp_path / "bad", loops + "x")
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": CHAT}])
    start = time.monotonic()
    with pytest.raises(PromptError, match=r"p\.jsonl: the chat template ran past 3\.02 s rendering 1 rows"):
        load_prompts(path, load_tokenizer(bad), 16)
    assert time.monotonic() - start < 20


def test_validate_refuses_a_template_bomb_with_one_line_and_exit_2(folder, tmp_path, monkeypatch, capsys):
    bad = _with_template(folder, tmp_path / "bad", "{{ 'x' * 200000000 }}")
    write_jsonl(tmp_path / "p.jsonl", [{"prompt": CHAT}])
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        f"model: {{kind: causal_lm, path: {bad}}}\nprompts: {{train: p.jsonl, rewards: ['regex:7']}}\n"
        "learner: {device: cpu}\n"
    )
    assert main(["validate", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "row 1: the chat template rendered 200000000 characters" in err, err


# ---- weights ----------------------------------------------------------------------------------------
def _header(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _write(path: Path, header: dict, data: bytes) -> None:
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def _too_large_header(bad: Path) -> None:
    data = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + data[8:])


def _offsets_past_the_end(bad: Path) -> None:
    header, data = _header(bad / "model.safetensors")
    name = next(k for k in header if k != "__metadata__")
    begin, end = header[name]["data_offsets"]
    header[name]["data_offsets"] = [begin + len(data), end + len(data)]
    _write(bad / "model.safetensors", header, data)


def _config_sizes_changed(bad: Path) -> None:
    cfg = json.loads((bad / "config.json").read_text())
    cfg["intermediate_size"] = cfg["intermediate_size"] * 2
    (bad / "config.json").write_text(json.dumps(cfg))


def _a_tensor_missing(bad: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(bad / "model.safetensors")
    tensors.pop("model.norm.weight")
    save_file(tensors, bad / "model.safetensors", metadata={"format": "pt"})


def _index_naming_a_pickle(bad: Path) -> None:
    (bad / "model.safetensors").rename(bad / "model-00001-of-00001.bin")
    header, _ = _header(bad / "model-00001-of-00001.bin")
    weight_map = {k: "model-00001-of-00001.bin" for k in header if k != "__metadata__"}
    (bad / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _index_naming_a_file_outside(bad: Path) -> None:
    header, _ = _header(bad / "model.safetensors")
    weight_map = {k: "../model.safetensors" for k in header if k != "__metadata__"}
    (bad / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


UNREADABLE = r"model\.safetensors: not a readable safetensors file \(Error while deserializing header: "
BROKEN = [
    (_too_large_header, UNREADABLE + "header too large"),
    (_offsets_past_the_end, UNREADABLE + "invalid offset"),
    (_config_sizes_changed, r"config\.json: model\.layers\.0\.mlp\.\w+_proj\.weight is \[\d+, \d+\]"),
    (_a_tensor_missing, r"the weights lack model\.norm\.weight"),
    (_index_naming_a_pickle, r"index\.json: names 'model-00001-of-00001\.bin', not a safetensors file"),
    (_index_naming_a_file_outside, r"index\.json: names '\.\./model\.safetensors', not a file of this"),
]


@pytest.mark.parametrize(("breakage", "said"), BROKEN, ids=[b.__name__.strip("_") for b, _ in BROKEN])
def test_broken_weights_are_refused_from_their_headers(folder, tmp_path, breakage, said):
    bad = _copy(folder, tmp_path / "bad")
    breakage(bad)
    with pytest.raises(ModelFolderError, match=said) as err:
        check_model_folder(bad)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("breakage", "said"), BROKEN[:3], ids=[b.__name__.strip("_") for b, _ in BROKEN[:3]])
def test_validate_refuses_broken_weights_with_exit_2_and_train_creates_nothing(
    folder, tmp_path, monkeypatch, capsys, breakage, said
):
    bad = _copy(folder, tmp_path / "bad")
    breakage(bad)
    write_jsonl(tmp_path / "p.jsonl", [{"prompt": "1+2="}])
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        f"model: {{kind: causal_lm, path: {bad}}}\nprompts: {{train: p.jsonl, rewards: ['regex:7']}}\n"
        "learner: {device: cpu}\n"
    )
    monkeypatch.chdir(tmp_path)
    for args in (["validate", str(cfg)], ["train", str(cfg), "--run-dir", str(tmp_path / "run")]):
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith(f"relay {args[0]}: "), err
    assert not (tmp_path / "run").exists()


# ---- links ------------------------------------------------------------------------------------------
def test_a_hugging_face_cache_folder_of_links_to_blobs_loads(folder, tmp_path):
    """snapshots/<revision>/<name> -> ../../blobs/<hash>, as huggingface_hub lays a cache out."""
    blobs = tmp_path / "models--tiny" / "blobs"
    snapshot = tmp_path / "models--tiny" / "snapshots" / "0123abc"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for n, f in enumerate(sorted(folder.iterdir())):
        (blobs / f"blob{n}").write_bytes(f.read_bytes())
        (snapshot / f.name).symlink_to(Path("..", "..", "blobs", f"blob{n}"))
    check_model_folder(snapshot)
    assert load_causal_lm(snapshot) is not None


@pytest.mark.parametrize("name", ["model.safetensors", "chat_template.jinja"])
def test_a_link_to_a_device_or_a_fifo_is_refused(folder, tmp_path, name):
    zero = _copy(folder, tmp_path / "zero")
    (zero / name).unlink(missing_ok=True)
    (zero / name).symlink_to("/dev/zero")
    with pytest.raises(ModelFolderError, match=rf"{name}: not a regular file \(a link to /dev/zero\)"):
        load_tokenizer(zero)
    fifo = _copy(folder, tmp_path / "fifo")
    (fifo / name).unlink(missing_ok=True)
    os.mkfifo(fifo / name)
    with pytest.raises(ModelFolderError, match=rf"{name}: not a regular file"):
        load_tokenizer(fifo)


@pytest.mark.parametrize(("name", "cap"), [("tokenizer.json", 256), ("chat_template.jinja", 1)])
def test_a_file_transformers_reads_whole_is_refused_past_its_size(folder, tmp_path, name, cap):
    """A 300 MiB tokenizer.json (sparse: no disk) or a 2 MiB chat template: refused by size before
    transformers reads either into memory."""
    big = _copy(folder, tmp_path / "big")
    with (big / name).open("ab") as f:
        f.truncate(300 << 20 if cap > 1 else 2 << 20)
    with pytest.raises(ModelFolderError, match=rf"{name}: larger than {cap} MiB, not a"):
        load_tokenizer(big)
