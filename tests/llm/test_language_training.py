"""Language runs end to end: `relay train` on a tiny random-init Llama from a local folder,
`relay resume`, `relay export --format hf` loaded back by transformers, bad inputs refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from relay_rl.services.cli import main
from relay_rl.services.runs.metric_keys import catalog
from tests.lm_helpers import sevens_run, sums_rows, tiny_model_folder, write_jsonl


def _lines(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return sevens_run(tmp_path_factory.mktemp("lmrun"))


def test_a_language_run_learns_resumes_evaluates_and_exports(workdir, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    run = workdir / "runs" / "sevens"
    assert main(["train", "run.yaml", "--run-dir", str(run)]) == 0
    lines = _lines(run)
    assert len(lines) >= 40
    first = sum(x["reward_mean"] for x in lines[:5]) / 5
    last = sum(x["reward_mean"] for x in lines[-5:]) / 5
    assert last > first + 0.4, (first, last)  # completions with a 7 go from ~1/8 to most
    assert [x["completions"] for x in lines[:3]] == [32, 64, 96]  # cumulative: 4 prompts x 8
    assert lines[-1]["env_steps"] >= 8000 and lines[-1]["reward_faults"] == 0
    assert {"kl_ref", "value_loss"}.isdisjoint(lines[-1])  # kl_coef 0 loads no reference; no critic
    assert set(lines[-1]) <= set(catalog().keys) and lines[-1]["reward_0_mean"] == lines[-1]["reward_mean"]
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 * len(lines) and samples[-1]["iteration"] == len(lines)

    assert main(["resume", str(run), "--set", "stop.env_steps=9000"]) == 0
    more = _lines(run)
    assert more[len(lines)]["iteration"] == lines[-1]["iteration"] + 1
    assert more[len(lines)]["completions"] == lines[-1]["completions"] + 32

    capsys.readouterr()
    assert main(["eval", str(run), "--episodes", "12", "--json"]) == 0
    scored = json.loads(capsys.readouterr().out)
    assert scored["episodes"] == 12 and scored["return_mean"] > first  # greedy completions with a 7
    assert main(["eval", str(run), "--reward", "regex:^$", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["return_mean"] == 0.0  # no completion is empty
    assert main(["eval", str(run), "--video", str(workdir / "v")]) == 2

    out = workdir / "exported"
    assert main(["export", str(run), "--format", "hf", "--out", str(out)]) == 0
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(out))
    tok = AutoTokenizer.from_pretrained(str(out))
    newest = sorted((run / "checkpoints").glob("ckpt-*.pt"))[-1]
    saved = torch.load(newest, weights_only=True)["learner"]["model"]
    for name, value in model.state_dict().items():
        assert torch.equal(value, saved["model." + name]), name
    ids = tok(["3+4="], return_tensors="pt").input_ids
    with torch.no_grad():
        sample = model.generate(ids, max_new_tokens=6, do_sample=True, pad_token_id=tok.pad_token_id)
    assert "7" in tok.decode(sample[0, ids.shape[1] :])
    assert main(["export", str(run), "--format", "hf", "--out", str(out)]) == 2  # never replaced


def test_evaluations_on_eval_prompts_keep_the_best_model(workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    write_jsonl(workdir / "eval.jsonl", sums_rows()[:12])
    run = workdir / "runs" / "evaluated"
    sets = [
        "prompts.eval=eval.jsonl",
        "eval.every_iterations=1",  # the first evaluations see the untrained model's greedy answers
        "learner.lr=0.001",  # slower than the fixture's: greedy answers flip within a few rounds
        "eval.episodes=12",
        "checkpoint.keep_best=true",
    ]
    args = ["train", "run.yaml", "--run-dir", str(run), "--set", "stop.env_steps=6000"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 0
    scored = [x for x in _lines(run) if "eval_return_mean" in x]
    assert len(scored) >= 10 and all(x["eval_episodes"] == 12 for x in scored)
    assert scored[-1]["eval_return_mean"] > scored[0]["eval_return_mean"]  # greedy answers with a 7
    best = torch.load(run / "checkpoints" / "best.pt", weights_only=True)["learner"]
    assert best["eval"]["return_mean"] == max(x["eval_return_mean"] for x in scored)
    assert main(["export", str(run), "--best", "--format", "hf", "--out", str(workdir / "best-hf")]) == 0
    assert (workdir / "best-hf" / "model.safetensors").is_file()


def test_a_stop_during_an_evaluation_cuts_it_short(workdir, monkeypatch):
    """A language run's evaluation runs between rounds in the driver's loop: a Ctrl-C during one
    stops it there (before, the loop held signals around it, and the stop waited for every eval
    completion), and the run still ends with a final checkpoint that counts every line."""
    import signal

    from relay_rl.learner.lm.learner import LanguageLearner
    from relay_rl.services.runs.checkpoints import load_newest_valid

    monkeypatch.chdir(workdir)
    write_jsonl(workdir / "eval.jsonl", sums_rows()[:4])
    plain, finished = LanguageLearner.evaluate, []

    def stopped(self, limit, greedy):
        signal.raise_signal(signal.SIGINT)
        finished.append(1)  # not reached when the stop is not held
        return plain(self, limit, greedy)

    monkeypatch.setattr(LanguageLearner, "evaluate", stopped)
    run = workdir / "runs" / "cut"
    sets = ["prompts.eval=eval.jsonl", "eval.every_iterations=2", "eval.episodes=4"]
    args = ["train", "run.yaml", "--run-dir", str(run)]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 130
    assert finished == []
    assert [x["iteration"] for x in _lines(run)] == [1, 2]
    _, ckpt = load_newest_valid(run / "checkpoints")
    assert ckpt.counters.iteration == 2 == ckpt.learner["version"]


@pytest.mark.parametrize(
    ("sets", "said"),
    [
        (["prompts.train=missing.jsonl"], "missing.jsonl: no such file"),
        (["model.path=nowhere"], "nowhere: not a folder"),
        (["prompts.max_prompt_tokens=3"], "over prompts.max_prompt_tokens=3"),
        (["prompts.rewards=[nope]"], "'nope' is not a reward"),
        (["prompts.rewards=[nomodule_here:fn]"], "cannot import module 'nomodule_here'"),
        (["generation.compile=true", "CXX=/nowhere/g++"], "inductor needs a C++ compiler on this host"),
        (["learner.compile=true", "CXX=/nowhere/g++"], "learner.compile: inductor needs a C++ compiler"),
        (["generation.backend=vllm"], "needs the vllm package on the learner's host"),  # not installable here
        (["generation.backend=vllm", "generation.compile=true"], "vllm captures its own graphs"),
        (["generation.backend=vllm", "generation.placement=workers"], "set generation.placement=learner"),
        (["generation.backend=vllm", "generation.noise=cpu"], "draws its own noise on the device"),
    ],
)
def test_bad_language_inputs_exit_2_with_one_line_and_nothing_created(
    workdir, monkeypatch, capsys, sets, said
):
    import torch._inductor.config as inductor_config

    monkeypatch.chdir(workdir)
    # Inductor reads CXX when it is imported: a host without a compiler, as inductor sees it.
    cxx = [s[4:] for s in sets if s.startswith("CXX=")]
    patch = {"cpp.cxx": (None, cxx[0])} if cxx else {}
    run = workdir / "runs" / "refused"
    args = ["train", "run.yaml", "--run-dir", str(run)]
    for s in sets:
        args += [] if s.startswith("CXX=") else ["--set", s]
    with inductor_config.patch(patch):
        assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and len(err.splitlines()) == 1, err
    assert not run.exists()


def test_remote_code_folder_is_refused_at_train(workdir, monkeypatch, capsys, tmp_path):
    bad = tiny_model_folder(tmp_path / "bad")
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "auto_map": {"AutoModelForCausalLM": "x.Y"}}))
    monkeypatch.chdir(workdir)
    assert main(["train", "run.yaml", "--set", f"model.path={bad}", "--run-dir", str(tmp_path / "r")]) == 2
    assert "remote code" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_all_equal_groups_are_dropped_and_refilled(workdir, monkeypatch):
    """learner.lm.drop_equal_groups + refill_rounds: a rare reward leaves most groups all equal;
    extra generations replace them, every batch keeps its groups, and each is counted."""
    monkeypatch.chdir(workdir)
    run = workdir / "runs" / "refill"
    sets = [
        "prompts.rewards=[regex:^9]",
        "learner.group_size=2",
        "learner.lm.drop_equal_groups=true",
        "learner.lm.refill_rounds=3",
        "stop.env_steps=1500",
    ]
    args = ["train", "run.yaml", "--run-dir", str(run)]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 0
    lines = _lines(run)
    refills = [x["refill_rounds"] for x in lines]
    assert max(refills) >= 1 and all(0 <= r <= 3 for r in refills)
    # 4 prompts x 2 members per generation; a refilled iteration generated more
    done = [4 * 2 * (1 + r) for r in refills]
    assert [x["completions"] for x in lines] == [sum(done[: i + 1]) for i in range(len(done))]
    assert [x["weights_version"] for x in lines] == list(range(1, len(lines) + 1))


def test_lora_trains_only_adapters_with_the_base_as_reference_and_exports_merged(workdir, monkeypatch):
    """model.lora: peft adapters train, the frozen base (adapters off) is the KL reference, the
    export is a plain folder with the adapters merged in."""
    monkeypatch.chdir(workdir)
    run = workdir / "runs" / "lora"
    sets = ["model.lora.r=8", "learner.kl_coef=0.05", "learner.lr=0.02", "stop.env_steps=3000"]
    args = ["train", "run.yaml", "--run-dir", str(run)]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 0
    lines = _lines(run)
    assert lines[0]["kl_ref"] == 0 and lines[-1]["kl_ref"] > 0  # the adapters moved off the base
    newest = sorted((run / "checkpoints").glob("ckpt-*.pt"))[-1]
    saved = torch.load(newest, weights_only=True)["learner"]["model"]
    lora_b = [v for k, v in saved.items() if "lora_B" in k]
    assert lora_b and all(v.abs().sum() > 0 for v in lora_b)  # zero at the start, trained since
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(workdir / "model")).state_dict()
    frozen = {k: v for k, v in saved.items() if "lora_" not in k and k.endswith("embed_tokens.weight")}
    assert frozen and all(torch.equal(v, base["model.embed_tokens.weight"]) for v in frozen.values())
    out = workdir / "lora-hf"
    assert main(["export", str(run), "--format", "hf", "--out", str(out)]) == 0
    merged = AutoModelForCausalLM.from_pretrained(str(out)).state_dict()
    assert merged.keys() == base.keys()  # no adapter left: a plain model
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(merged[q], base[q])  # the adapters' update is in the weights


def test_a_stop_during_a_local_update_waits_for_it_and_counts_its_round(workdir, monkeypatch):
    """Local mode updates in the driver's thread: a Ctrl-C after one of the update's optimizer
    steps used to leave the final checkpoint with weights past iteration k's under k. Now the
    update finishes and its round is counted: the checkpoint equals the one an uninterrupted run
    wrote at that iteration, bit for bit (a seed fixes a local run)."""
    from relay_rl.learner.lm.learner import LanguageLearner
    from relay_rl.services.runs.checkpoints import list_checkpoints, load_checkpoint
    from tests.helpers import interrupt_during_update

    monkeypatch.chdir(workdir)
    every = ["--set", "checkpoint.interval=3", "--set", "checkpoint.keep=10"]
    whole = workdir / "runs" / "whole"
    # A round generates at most 4 prompts x 8 x 6 tokens: past 576 it has run at least 4 rounds.
    assert main(["train", "run.yaml", "--run-dir", str(whole), "--set", "stop.env_steps=577", *every]) == 0

    interrupt_during_update(monkeypatch, LanguageLearner, "train", update=3)
    cut = workdir / "runs" / "cut-update"
    assert main(["train", "run.yaml", "--run-dir", str(cut), *every]) == 130
    assert [x["iteration"] for x in _lines(cut)] == [1, 2, 3]
    theirs = load_checkpoint(list_checkpoints(cut / "checkpoints")[-1])
    ours = load_checkpoint(whole / "checkpoints" / "ckpt-00000003.pt")
    assert theirs.counters.iteration == ours.counters.iteration == theirs.learner["version"] == 3
    for name, tensor in ours.learner["model"].items():
        assert torch.equal(theirs.learner["model"][name], tensor), name


def test_a_language_checkpoint_is_a_language_runs_and_says_so(workdir, monkeypatch, capsys):
    """A language run's checkpoint records its family and no env; ONNX export of it and a
    resume by an env config are one line each, naming what would work."""
    from relay_rl.services.runs.checkpoints import load_newest_valid

    monkeypatch.chdir(workdir)
    run = workdir / "runs" / "family"
    assert main(["train", "run.yaml", "--run-dir", str(run), "--set", "stop.iterations=2"]) == 0
    path, ckpt = load_newest_valid(run / "checkpoints")
    assert ckpt.family == "language" and ckpt.env is None
    capsys.readouterr()
    assert main(["export", str(path), "--format", "onnx", "--out", str(workdir / "x.onnx")]) == 2
    err = capsys.readouterr().err.strip()
    assert "a language run's checkpoint exports as --format hf" in err and len(err.splitlines()) == 1
    assert not (workdir / "x.onnx").exists()
    (run / "config.yaml").write_text(
        (run / "config.yaml").read_text().replace("kind: causal_lm", "kind: mlp")
    )
    assert main(["resume", str(run)]) == 2  # its language sections: no env config's
    assert "learner.lm: runs of model.kind=mlp have no such section" in capsys.readouterr().err
    from relay_rl.contracts.config import load_config
    from relay_rl.services.driver.families import check_resumable
    from relay_rl.services.runs.checkpoints import ResumeError

    with pytest.raises(ResumeError, match="was trained by a language run"):
        check_resumable(load_config(None), None, ckpt, path.name)
