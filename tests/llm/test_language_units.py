"""The language run's parts with a real tiny transformers model (random init, a tokenizer written
in tests/lm_helpers.py): model folders as data, prompts, rewards, generation, chunked log-probs,
the GRPO token objective."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relay_rl.contracts.config import ConfigError, RelayConfig, code_settings, load_config
from relay_rl.contracts.prompts import PromptError, PromptOrder, load_prompts, pad_left
from relay_rl.learner.lm import tokens as lm_tokens
from relay_rl.learner.lm.estimators import RoundRewards, grpo
from relay_rl.learner.lm.policy_losses import TokenBatch, clip
from relay_rl.policy.causal_lm import (
    CausalLMPolicy,
    ModelFolderError,
    check_model_folder,
    load_causal_lm,
    load_tokenizer,
)
from relay_rl.rollout_workers.lm.rewards import final_number, resolve_reward, score_batch
from tests.lm_helpers import tiny_model_folder, write_jsonl


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tiny_model_folder(tmp_path_factory.mktemp("lm") / "model")


@pytest.fixture(scope="module")
def policy(folder) -> CausalLMPolicy:
    tok = load_tokenizer(folder)
    return CausalLMPolicy(load_causal_lm(folder), tok.pad_token_id, [tok.eos_token_id]).eval()


# ---- the model folder is data -------------------------------------------------------------------
def test_remote_code_is_refused_before_transformers_reads_the_folder(folder, tmp_path):
    bad = tmp_path / "bad"
    tiny_model_folder(bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "evil.Model"}
    (bad / "config.json").write_text(json.dumps(cfg))
    (bad / "evil.py").write_text("raise SystemExit('ran code')\n")
    with pytest.raises(ModelFolderError, match="remote code"):
        load_causal_lm(bad)
    tok_cfg = tmp_path / "tok"
    tiny_model_folder(tok_cfg)
    data = json.loads((tok_cfg / "tokenizer_config.json").read_text())
    data["auto_map"] = {"AutoTokenizer": ["evil.Tok", None]}
    (tok_cfg / "tokenizer_config.json").write_text(json.dumps(data))
    with pytest.raises(ModelFolderError, match="remote code"):
        load_tokenizer(tok_cfg)


def test_pickled_weights_are_never_loaded(tmp_path):
    pickled = tmp_path / "pickled"
    tiny_model_folder(pickled)
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    with pytest.raises(ModelFolderError, match=r"pytorch_model\.bin is pickled"):
        check_model_folder(pickled)


@pytest.mark.parametrize("junk", ["{", "[]", json.dumps({"model_type": "no-such-arch"})])
def test_a_broken_config_is_one_line(tmp_path, junk):
    bad = tmp_path / "m"
    tiny_model_folder(bad)
    (bad / "config.json").write_text(junk)
    with pytest.raises(ModelFolderError) as err:
        check_model_folder(bad)
    assert "\n" not in str(err.value)


# ---- prompts --------------------------------------------------------------------------------------
def test_prompts_text_and_chat_with_columns(folder, tmp_path):
    tok = load_tokenizer(folder)
    path = write_jsonl(
        tmp_path / "p.jsonl",
        [
            {"prompt": "1+1=", "answer": "2"},
            {"prompt": [{"role": "user", "content": "2+2="}], "answer": "4"},
        ],
    )
    ps = load_prompts(path, tok, 64)
    assert ps.columns == {"answer": ["2", "4"]}
    assert tok.decode(ps.token_ids[1]) == "user: 2+2=\nassistant: "  # the chat template was applied


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        ([], "no rows"),
        ([{"question": "x"}], "no 'prompt' column"),
        ([{"prompt": "1+1="}, {"prompt": "2", "answer": 1}], "row 2 has columns"),
        ([{"prompt": "9" * 40}], "row 1 is 40 tokens, over prompts.max_prompt_tokens=16"),
        ([{"prompt": [{"role": "user"}]}], "no 'prompt' column"),
        ([{"prompt": "1+1=", "completions": "2"}], "column 'completions' is the name rewards receive"),
    ],
)
def test_bad_prompt_files_are_one_line(folder, tmp_path, rows, match):
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    with pytest.raises(PromptError, match=match):
        load_prompts(path, load_tokenizer(folder), 16)


def test_parquet_prompts(folder, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": ["1+2=", "3+4="], "answer": ["3", "7"]}), tmp_path / "p.parquet")
    ps = load_prompts(tmp_path / "p.parquet", load_tokenizer(folder), 16)
    assert ps.prompts == ["1+2=", "3+4="] and ps.columns["answer"] == ["3", "7"]


@given(size=st.integers(1, 30), batch=st.integers(1, 12), seed=st.integers(0, 5))
@settings(max_examples=40, deadline=None)
def test_prompt_order_visits_every_row_once_per_epoch_and_resumes(size, batch, seed):
    order = PromptOrder(size, batch, seed, shuffle=True)
    seen = [i for _ in range(size) for i in order.next()]  # size * batch rows: `batch` epochs
    for e in range(batch):
        assert sorted(seen[e * size : (e + 1) * size]) == list(range(size))
    again = PromptOrder(size, batch, seed, shuffle=True)
    again.load_state_dict(order.state_dict())
    assert again.next() == order.next()


def test_pad_left_takes_the_smallest_bucket_that_fits():
    ids, mask = pad_left([[5, 6, 7], [8]], [4, 8, 16], pad_id=0)
    assert ids.tolist() == [[0, 5, 6, 7], [0, 0, 0, 8]] and mask.sum() == 4
    assert pad_left([[1] * 5], [4, 8, 16], 0)[0].shape == (1, 8)


# ---- rewards --------------------------------------------------------------------------------------
def test_registry_rewards():
    assert final_number("so 3 + 4 = 7\n#### 1,024") == 1024.0
    assert final_number("no digits") is None
    nm = resolve_reward("numeric_match")
    assert nm(["q"] * 3, ["it is 7", "#### 8", "x"], answer=["#### 7", "7", "1"]) == [1.0, 0.0, 0.0]
    assert resolve_reward("exact_match")(["q"], [" 4 "], answer=["4"]) == [1.0]
    assert resolve_reward("regex:^<a>.*</a>$")(["q", "q"], ["<a>x</a>", "x"]) == [1.0, 0.0]
    assert resolve_reward("length_at_most:3")(["q", "q"], ["abc", "abcd"]) == [1.0, 0.0]
    chat = [[{"role": "assistant", "content": "7"}]]
    assert nm(["q"], chat, answer=["7"]) == [1.0]  # TRL's conversational completions
    with pytest.raises(ValueError, match="not a reward"):
        resolve_reward("no_such_reward")
    with pytest.raises(ValueError, match="not a regular expression"):
        resolve_reward("regex:(")


def test_every_reward_fault_is_counted_and_leaves_no_reward():
    def ok(prompts, completions, **_):
        return [1.0] * len(completions)

    def nan_second(prompts, completions, **_):
        return [0.5, math.nan, None]

    def short(prompts, completions, **_):
        return [1.0]

    def boom(prompts, completions, **_):
        raise RuntimeError("reward server down")

    rewards, faults, notes, per = score_batch([ok, nan_second], [1.0, 2.0], ["p"] * 3, ["a", "b", "c"], {})
    assert rewards == [2.0, None, 1.0]  # None: that function does not apply to the third (TRL)
    assert per == [[1.0, 1.0, 1.0], [0.5, None, None]]
    assert faults["nonfinite"] == 1 and notes == ["reward nan_second returned nan"]
    rewards, faults, _, _ = score_batch([ok, short], [1.0, 1.0], ["p"] * 3, ["a", "b", "c"], {})
    assert rewards == [None, None, None] and faults["length"] == 3
    rewards, faults, notes, _ = score_batch([boom], [1.0], ["p"] * 2, ["a", "b"], {})
    assert rewards == [None, None] and faults["raised"] == 2 and "reward server down" in notes[0]


def test_trl_reward_function_runs_unchanged():
    """TRL's own accuracy-style reward signature: fn(prompts, completions, **kwargs)."""
    from trl.rewards import think_format_reward as fn

    chat = [
        [{"role": "assistant", "content": "<think>\nhm\n</think>\n7"}],
        [{"role": "assistant", "content": "7"}],
    ]
    rewards, faults, _, _ = score_batch([fn], [1.0], ["p", "p"], chat, {"answer": ["7", "7"]})
    assert rewards == [1.0, 0.0] and not any(faults.values())


def test_user_reward_functions_are_code_settings():
    cfg = RelayConfig.model_validate(
        {
            "model": {"kind": "causal_lm", "path": "m"},
            "prompts": {"train": "p.jsonl", "rewards": ["regex:a:b", "mymod:score"]},
        }
    )
    assert code_settings(cfg) == [("prompts.rewards", "[regex:a:b,mymod:score]")]
    cfg2 = cfg.model_copy(update={"prompts": cfg.prompts.model_copy(update={"rewards": ["regex:x:y"]})})
    assert code_settings(cfg2) == []


# ---- config ---------------------------------------------------------------------------------------
def test_language_defaults_and_rules(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: {kind: causal_lm, path: m}\nprompts: {train: p.jsonl, rewards: [exact_match]}\n")
    cfg = load_config(path)
    assert (cfg.learner.algo, cfg.learner.lr, cfg.learner.epochs, cfg.learner.group_size) == (
        "grpo",
        1e-6,
        1,
        8,
    )
    assert load_config(path, ["learner.lr=0.01"]).learner.lr == 0.01  # the user's setting wins
    for bad, match in [
        ("prompts.train=null", "needs prompts.train"),
        ("learner.group_size=1", "group_size >= 2"),
        ("prompts.reward_weights=[1,2]", "2 weights for 1 rewards"),
        ("generation.max_staleness=1", "needs generation.placement=workers"),
        ("generation.max_staleness=2", "less than or equal to 1"),
    ]:
        with pytest.raises(ConfigError, match=match):
            load_config(path, [bad])
    from relay_rl.services.driver.preflight import check_config

    with pytest.raises(
        ConfigError, match=r"learner\.algo='ppo' is not an advantage estimator of a language run"
    ):
        check_config(load_config(path, ["learner.algo=ppo"]))


def test_sharded_language_learner_rules(tmp_path):
    """learner.num_learners > 1 for a causal LM: fsdp (auto), whole groups per rank, Ray; what is
    not built with it yet (vLLM) is refused in one line naming the setting, as is fsdp for an env
    policy."""
    path = tmp_path / "c.yaml"
    path.write_text(
        "model: {kind: causal_lm, path: m}\n"
        "prompts: {train: p.jsonl, rewards: [exact_match], batch_size: 4}\n"
        "rollout: {num_workers: 1}\nlearner: {num_learners: 2}\n"
    )
    assert load_config(path).learner.parallel == "auto"
    assert load_config(path, ["learner.parallel=fsdp"]).learner.num_learners == 2
    assert load_config(path, ["generation.placement=workers"]).learner.num_learners == 2
    for bad, match in [
        ("learner.parallel=ddp", "a causal LM is sharded"),
        ("prompts.batch_size=3", r"prompts.batch_size=3 must be a multiple of learner.num_learners=2"),
        ("rollout.num_workers=0", "ranks are Ray actors"),
        ("generation.backend=vllm", "generation.backend=vllm with learner.num_learners=2 .* not built yet"),
    ]:
        with pytest.raises(ConfigError, match=match):
            load_config(path, [bad])
    # compiled decoding and updates, refills and float16 are a sharded learner's too
    sets = ["generation.compile=true", "learner.compile=true"]
    sets += ["learner.use_amp=true", "learner.amp_dtype=float16"]
    assert load_config(path, sets).learner.num_learners == 2
    refills = ["learner.lm.drop_equal_groups=true", "learner.lm.refill_rounds=2"]
    assert load_config(path, refills).learner.num_learners == 2
    with pytest.raises(ConfigError, match=r"learner\.parallel=fsdp shards causal LMs"):
        load_config("configs/cartpole_ppo.yaml", ["learner.parallel=fsdp"])


def test_validate_prints_the_memory_estimate_and_refuses_a_run_that_cannot_fit(folder, tmp_path, capsys):
    """relay validate states the learner's memory per device; with the device's memory known
    (learner.device_memory_gb) a run above it is one line naming the knobs, exit 2."""
    from relay_rl.services.cli import main

    write_jsonl(tmp_path / "p.jsonl", [{"prompt": "1+1="}])
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"model: {{kind: causal_lm, path: {folder}}}\n"
        f"prompts: {{train: {tmp_path / 'p.jsonl'}, rewards: [exact_match], max_prompt_tokens: 8}}\n"
        "learner: {device: cpu}\nstop: {iterations: 1}\n"
    )
    assert main(["validate", str(cfg)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("# learner memory (estimate): peak "))
    assert "weights" in line and "optimizer" in line and line.endswith("on each of 1 learner device")
    assert main(["validate", str(cfg), "--set", "learner.device_memory_gb=0.000001"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "learner.num_learners" in err[0] and "more than its" in err[0]


def test_a_language_config_of_before_the_estimators_keeps_loading(tmp_path):
    """learner.grpo held the whole language update until the estimators and losses got their own
    sections: such a config loads with each key in the section that owns it now, and means the
    same; a key set both ways is one line naming both."""
    from relay_rl.learner.lm.settings import lm_settings
    from relay_rl.services.runs.config_sections import resolve_sections

    path = tmp_path / "old.yaml"
    path.write_text(
        "model: {kind: causal_lm, path: m}\nprompts: {train: p.jsonl, rewards: [exact_match]}\n"
        "learner: {grpo: {loss_agg: seq_mean, clip_ratio_high: 0.28, scale_rewards: none, "
        "drop_equal_groups: true, refill_rounds: 2}}\n"
    )
    cfg = load_config(path)
    resolve_sections(cfg)
    assert lm_settings(cfg).loss_agg == "seq_mean" and lm_settings(cfg).refill_rounds == 2
    assert cfg.learner.entry_data("clip") == {"clip_ratio_high": 0.28}
    assert cfg.learner.entry_data("grpo") == {"scale_rewards": "none"}
    with pytest.raises(ConfigError, match=r"learner\.grpo\.loss_agg is learner\.lm\.loss_agg now"):
        load_config(path, ["learner.lm.loss_agg=token_mean"])


def test_a_language_run_is_named_by_its_model_and_sized_with_its_generators(tmp_path):
    """The model kind names the run's source (the model folder, not env.id); generators beside
    the reward actors count in the CPUs a local Ray starts with, only with placement=workers."""
    from relay_rl.rollout_workers.lm.generator import generator_count
    from relay_rl.services.driver.families import backend_class
    from relay_rl.services.runs.run_dir import default_run_name

    path = tmp_path / "lm.yaml"
    path.write_text(
        "model: {kind: causal_lm, path: models/Qwen2.5-0.5B}\n"
        "prompts: {train: p.jsonl, rewards: [exact_match]}\n"
    )
    cfg = load_config(path, ["rollout.num_workers=3"])
    assert default_run_name(cfg).startswith("Qwen2.5-0.5B-grpo-")
    assert default_run_name(load_config(None)).startswith("CartPole-v1-ppo-")
    on_workers = load_config(path, ["rollout.num_workers=3", "generation.placement=workers"])
    env_run = load_config(None, ["rollout.num_workers=3"])
    assert [generator_count(c) for c in (cfg, on_workers, env_run)] == [0, 3, 0]
    assert [backend_class(c).actors_per_worker(c) for c in (cfg, on_workers, env_run)] == [1, 2, 1]


# ---- generation and log-probs --------------------------------------------------------------------
def test_generation_log_probs_are_the_full_forward_pass_log_probs(policy, folder):
    tok = load_tokenizer(folder)
    ids, mask = pad_left([tok("12+3=")["input_ids"], tok("7")["input_ids"]], [8, 16], tok.pad_token_id)
    ids_t, mask_t = torch.from_numpy(ids), torch.from_numpy(mask)
    g = torch.Generator().manual_seed(3)
    out = policy.generate(ids_t, mask_t, 12, temperature=0.7, top_k=0, generator=g)
    assert out.tokens.shape == (2, 12) and out.mask.shape == (2, 12)
    with torch.no_grad():
        logp, ent = policy.completion_logp(ids_t, mask_t, out.tokens, out.mask, 0.7, chunk=5)
    assert torch.allclose(logp * out.mask, out.logp, atol=1e-5)
    assert ent is not None and bool((ent >= 0).all())
    again = policy.generate(ids_t, mask_t, 12, 0.7, 0, torch.Generator().manual_seed(3))
    assert torch.equal(again.tokens, out.tokens)  # a seed fixes the completions


def test_eos_ends_a_completion_under_the_mask(folder):
    tok = load_tokenizer(folder)
    model = load_causal_lm(folder)
    with torch.no_grad():  # make EOS the likeliest token by far
        model.get_output_embeddings().weight[tok.eos_token_id] *= 0
        model.lm_head.bias = None
    pol = CausalLMPolicy(model, tok.pad_token_id, [tok.eos_token_id, 5]).eval()
    ids = torch.tensor([[tok.pad_token_id, 4, 5]])
    out = pol.generate(ids, (ids != tok.pad_token_id).long(), 6, 1.0, 0, torch.Generator().manual_seed(0))
    ended_at = int(out.mask[0].sum())
    assert out.tokens[0, ended_at - 1].item() in (tok.eos_token_id, 5) or ended_at == 6
    assert bool((out.tokens[0, ended_at:] == tok.pad_token_id).all())
    assert bool((out.logp[0, ended_at:] == 0).all())


def test_chunked_log_probs_and_their_gradients_equal_the_full_logits_reference(policy, folder):
    """The fast path (hidden states once, the head chunk by chunk, recomputed in backward) against
    the plain one (the model's full [B, T, V] logits)."""
    tok = load_tokenizer(folder)
    ids, mask = pad_left([tok("1+2=")["input_ids"], tok("33+44=")["input_ids"]], [8], tok.pad_token_id)
    ids_t, mask_t = torch.from_numpy(ids), torch.from_numpy(mask)
    comp = torch.randint(3, 40, (2, 9), generator=torch.Generator().manual_seed(1))
    cmask = torch.ones(2, 9)
    cmask[1, 6:] = 0

    def reference() -> torch.Tensor:
        full = torch.cat([ids_t, comp], 1)
        attn = torch.cat([mask_t, cmask.long()], 1)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        logits = policy.model(input_ids=full, attention_mask=attn, position_ids=pos).logits[:, 7:-1].float()
        return torch.log_softmax(logits / 0.9, -1).gather(-1, comp.unsqueeze(-1)).squeeze(-1)

    grads = []
    for fn in (lambda: policy.completion_logp(ids_t, mask_t, comp, cmask, 0.9, chunk=4)[0], reference):
        policy.zero_grad()
        lp = fn()
        (lp * cmask).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in policy.parameters() if p.grad is not None]))
        grads.append(lp.detach())
    assert torch.allclose(grads[1] * cmask, grads[3] * cmask, atol=1e-5)
    assert torch.allclose(grads[0], grads[2], atol=1e-5)


# ---- the objective --------------------------------------------------------------------------------
def test_token_weights_make_micro_batches_add_up_to_the_batch_loss():
    g = torch.Generator().manual_seed(0)
    mask = (torch.rand(6, 5, generator=g) > 0.3).float()
    per_token = torch.randn(6, 5, generator=g)
    rows = torch.tensor([True, True, False, True, True, True])
    for agg in ("token_mean", "seq_mean", "dr_grpo"):
        w = lm_tokens.token_weights(mask, rows, agg, 5)
        whole = (per_token * w).sum()
        parts = sum((per_token[s] * w[s]).sum() for s in (slice(0, 2), slice(2, 5), slice(5, 6)))
        assert torch.allclose(whole, parts)
    m = mask * rows.unsqueeze(-1)
    assert torch.allclose(
        (per_token * lm_tokens.token_weights(mask, rows, "token_mean", 5)).sum(),
        (per_token * m).sum() / m.sum(),
    )
    seq = ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1))[rows].mean()
    assert torch.allclose((per_token * lm_tokens.token_weights(mask, rows, "seq_mean", 5)).sum(), seq)


def test_group_advantages_scaling_and_faulted_members():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0])
    valid = torch.tensor([True, True, True, False, True, True, True, True])
    r = RoundRewards(rewards, valid, torch.ones(8), 4, 1e-6)

    def adv(scale):
        return grpo.group_relative(r, grpo.GrpoEstimatorSettings(scale_rewards=scale))[0]

    group, std = adv("group"), lm_tokens.group_std(rewards, valid, 4)
    assert group[3] == 0 and bool((group[4:] == 0).all())  # a faulted member; an all-equal group
    assert torch.allclose(group[:3].sum(), torch.tensor(0.0), atol=1e-6) and std[1] == 0
    none = adv("none")
    assert torch.allclose(none[:3], torch.tensor([2 / 3, -1 / 3, -1 / 3]))
    batch = adv("batch")
    assert torch.allclose(batch[:3] / none[:3], (batch[0] / none[0]).expand(3))


def test_clip_higher_and_kl_estimators():
    logp, old = torch.log(torch.tensor([[1.5, 0.5]])), torch.zeros(1, 2)
    settings = clip.ClipSettings(clip_ratio_high=0.28)

    def loss_of(advantage):
        return clip.clipped(TokenBatch(logp, old, torch.tensor([advantage]), torch.ones(1, 2), 0.2), settings)

    loss, low, high = loss_of(1.0)
    assert torch.allclose(loss, -torch.tensor([[1.28, 0.5]])) and high.tolist() == [[1.0, 0.0]]
    assert low.tolist() == [[0.0, 0.0]]  # a positive advantage is never clipped below
    loss, low, high = loss_of(-1.0)
    assert torch.allclose(loss, torch.tensor([[1.5, 0.8]])) and low.tolist() == [[0.0, 1.0]]
    a, b = torch.tensor([-1.0, -2.0]), torch.tensor([-1.0, -1.5])
    for est in ("k1", "k2", "k3"):
        kl = lm_tokens.kl_per_token(a, b, est)
        assert kl[0] == 0
    assert lm_tokens.kl_per_token(a, b, "k3")[1] > 0
    w = lm_tokens.truncated_is_weight(
        torch.tensor([[0.0, 0.0]]), torch.tensor([[-5.0, 0.0]]), torch.ones(1, 2), "token", 2.0
    )
    assert w.tolist() == [[2.0, 1.0]]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_two_grpo_steps_change_every_trained_parameter(arch, tmp_path, monkeypatch):
    """Every architecture the tests build: generation, rewards given by hand, two updates; every
    parameter moves (none is cut off from the loss, tied embeddings included)."""
    from relay_rl.learner.lm.learner import LanguageLearner

    tiny_model_folder(tmp_path / "m", arch)
    write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"{i}+{i}="} for i in range(8)])
    monkeypatch.chdir(tmp_path)
    cfg = RelayConfig.model_validate(
        {
            "model": {"kind": "causal_lm", "path": "m"},
            "prompts": {"train": "p.jsonl", "rewards": ["regex:7"], "batch_size": 2, "max_prompt_tokens": 8},
            "generation": {"max_new_tokens": 5},
            "learner": {"group_size": 4, "lr": 0.01, "device": "cpu", "kl_coef": 0.1, "epochs": 2},
        }
    )
    learner = LanguageLearner(cfg)
    before = {n: p.detach().clone() for n, p in learner.policy.named_parameters()}
    for _ in range(2):
        learner.generate_round()
        metrics = learner.train([1.0, 0.0, 0.5, None, 0.0, 1.0, 1.0, 0.25])
    assert metrics["kl_ref"] > 0 and metrics["weights_version"] == 2
    still = [n for n, p in learner.policy.named_parameters() if torch.equal(before[n], p.detach())]
    assert still == []


def test_the_export_check_catches_a_folder_that_generates_otherwise(policy, folder, tmp_path):
    from relay_rl.services.tools.export_hf import greedy_mismatch

    same = tmp_path / "same"
    policy.save_pretrained(same)
    assert greedy_mismatch(policy, same) is None
    # Random tied-embedding models greedily repeat the last prompt token whatever their seed: a
    # sign flip of the final norm (logits -> -logits) makes a folder that must disagree.
    from transformers import AutoModelForCausalLM

    other = AutoModelForCausalLM.from_pretrained(str(same))
    with torch.no_grad():
        other.base_model.norm.weight.neg_()
    other.save_pretrained(str(tmp_path / "other"))
    assert "greedy token 0 of prompt 0" in (greedy_mismatch(policy, tmp_path / "other") or "")


def test_weights_on_the_wire_are_one_bf16_buffer_tied_weights_once(policy):
    """The packed_bf16 wire: every tensor back in place (bf16-rounded), the tied head sent once,
    a reused buffer gives the same bytes; weights of another model are refused."""
    from relay_rl.policy.weight_wires import WIRES, load_weights, unwire_weights, wire_weights

    state = policy.state_dict()
    packed = wire_weights(state)
    assert set(packed.index) | set(packed.alias) == set(state)
    assert packed.alias == {"model.lm_head.weight": "model.model.embed_tokens.weight"}
    distinct = sum(v.numel() for k, v in state.items() if k not in packed.alias)
    assert packed.nbytes == 2 * distinct  # bf16
    again = wire_weights(state, packed.data.copy())
    assert (again.data == packed.data).all()
    back = unwire_weights(packed)
    for k, v in state.items():
        assert torch.equal(back[k], v.to(torch.bfloat16).float()), k
    target = copy.deepcopy(policy)
    with torch.no_grad():
        for p in target.parameters():
            p.zero_()
    wire = WIRES["packed_bf16"]
    load_weights(target, wire.unpack(packed))
    assert all(torch.equal(target.state_dict()[k], back[k]) for k in state)
    with pytest.raises(ValueError, match="do not fit"):
        load_weights(torch.nn.Linear(2, 2), wire.unpack(packed))


def test_a_round_keeps_groups_with_signal_and_fills_with_all_equal_ones_on_the_last_try():
    from relay_rl.rollout_workers.lm.rounds import groups_to_keep, has_signal

    rewards = [1.0, 0.0, 1.0, 1.0, None, 1.0, 0.0, 1.0]  # groups of 2: signal, equal, one scored, signal
    assert [has_signal(rewards[k : k + 2]) for k in range(0, 8, 2)] == [True, False, False, True]
    assert groups_to_keep(rewards, 2, wanted=3, last=False) == [0, 3]
    assert groups_to_keep(rewards, 2, wanted=3, last=True) == [0, 3, 1]
    assert groups_to_keep(rewards, 2, wanted=1, last=True) == [0]


def test_progress_lines_speak_the_familys_words(tmp_path):
    """A language run's progress lines count tokens and score rewards; an env run's, env steps
    and returns."""
    import io

    from relay_rl.services.driver.progress import Progress

    path = tmp_path / "c.yaml"
    path.write_text("model: {kind: causal_lm, path: m}\nprompts: {train: p.jsonl, rewards: [exact_match]}\n")
    line = {
        "iteration": 3,
        "env_steps": 1200,
        "episode_return_mean": 0.5,
        "env_steps_per_s": 40.0,
        "wall_s": 30.0,
    }
    said = {}
    for name, cfg in (
        ("language", load_config(path, ["metrics.progress=lines"])),
        ("env", load_config(None)),
    ):
        stream = io.StringIO()
        progress = Progress(
            cfg.model_copy(update={"metrics": cfg.metrics.model_copy(update={"progress": "lines"})}), stream
        )
        progress.update(line)
        progress.close("wall_s")
        said[name] = stream.getvalue()
    assert "tokens      1200  reward     0.5  tokens/s" in said["language"]
    assert "1,200 tokens, reward 0.5" in said["language"]
    assert (
        "steps      1200  return     0.5  steps/s" in said["env"]
        and "1,200 env steps, return 0.5" in said["env"]
    )


def test_a_language_run_is_seeded_by_prompts_seed_and_configs_before_it_by_env_seed(tmp_path, monkeypatch):
    """#59: a language run's seed is its own (prompts.seed), not the env's; a config written before
    it, which set env.seed, draws the same prompts and completions as prompts.seed does now."""
    from relay_rl.learner.lm.learner import LanguageLearner

    tiny_model_folder(tmp_path / "m")
    write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"{i}+{i}="} for i in range(8)])
    monkeypatch.chdir(tmp_path)

    def round_of(prompts: dict | None = None, env: dict | None = None) -> tuple[list, list]:
        cfg = RelayConfig.model_validate(
            {
                "model": {"kind": "causal_lm", "path": "m"},
                "prompts": {
                    "train": "p.jsonl",
                    "rewards": ["regex:7"],
                    "batch_size": 2,
                    **(prompts or {}),
                },
                "generation": {"max_new_tokens": 4},
                "learner": {"group_size": 2, "device": "cpu"},
                "env": env or {},
            }
        )
        gen = LanguageLearner(cfg).generate_round()
        return list(gen["prompts"]), [list(map(int, ids)) for ids in gen["completion_ids"]]

    ours = round_of(prompts={"seed": 11})
    assert round_of(env={"seed": 11}) == ours  # what such a config drew before prompts.seed
    assert round_of(prompts={"seed": 11}, env={"seed": 3}) == ours  # env.seed is not a language seed
    assert round_of(prompts={"seed": 12}) != ours
