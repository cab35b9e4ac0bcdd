"""`relay eval`: whole evaluation episodes of a trained policy (checkpoint, run folder, ONNX
export), scored the way SB3's `evaluate_policy` scores them, with a video of one episode; and the
bad inputs (unknown run, a file that names no env, a video folder that is a file, an env that
cannot render)."""

import contextlib
import io
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import imageio_ffmpeg
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from relay_rl.rollout_workers.envs import env_seeds
from relay_rl.rollout_workers.evaluation import EVAL_SEED_STREAM, episode_targets
from relay_rl.services.cli import main
from relay_rl.services.tools.load import load_policy
from tests.helpers import train_local


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("cartpole")
    assert train_local("cartpole_ppo.yaml", run, "learner.buffer_size=1024", "stop.env_steps=6000") == 0
    return run


def newest(run: Path) -> Path:
    return sorted((run / "checkpoints").glob("ckpt-*.pt"))[-1]


def eval_json(capsys, *args: str) -> dict:
    assert main(["eval", *args, "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    return json.loads(out[0])


def played_returns(
    env_id: str, episodes: int, seed: int, act: Callable[[np.ndarray], Any], new_episode: Callable[[], None]
) -> list[float]:
    """Episodes played by hand: one plain gymnasium env per evaluation env, seeded as the
    evaluation seeds it, each running its share of episodes in turn with `act(obs)`'s action
    (`new_episode()` before each), no vector env and no relay evaluation code."""
    n = min(episodes, 8)
    seeds = env_seeds(seed, 0, n, EVAL_SEED_STREAM)
    out = []
    for i, target in enumerate(episode_targets(episodes, n)):
        env = gym.make(env_id)
        obs, _ = env.reset(seed=seeds[i])
        for _ in range(target):
            new_episode()
            total, done = 0.0, False
            while not done:
                obs, reward, terminated, truncated, _ = env.step(act(obs))
                total += float(reward)
                done = terminated or truncated
            out.append(total)
            obs, _ = env.reset()
    return out


def reference_returns(ckpt: Path, episodes: int, seed: int) -> list[float]:
    """The checkpoint's greedy CartPole episodes, played by hand."""
    handle = load_policy(ckpt)

    def act(obs: np.ndarray) -> int:
        return int(handle.model.deterministic({"obs": torch.as_tensor(obs[None], dtype=torch.float32)})[0])

    return played_returns("CartPole-v1", episodes, seed, act, lambda: None)


@given(st.integers(1, 500), st.integers(1, 64))
def test_episodes_are_spread_over_the_envs_and_env_0_always_plays(episodes, envs):
    """SB3's split where every env plays; fewer episodes than envs (a multi-agent env's columns
    rounded up to whole copies) go to the first envs: env 0 is the one a video films."""
    targets = episode_targets(episodes, envs)
    assert targets.sum() == episodes and targets[0] >= 1 and targets.max() - targets.min() <= 1
    if episodes >= envs:
        assert list(targets) == [(episodes + i) // envs for i in range(envs)]


def test_deterministic_returns_match_episodes_played_by_hand(run, capsys):
    got = eval_json(capsys, str(newest(run)), "--episodes", "11", "--seed", "5")
    want = reference_returns(newest(run), 11, 5)
    assert got["episodes"] == 11 and got["deterministic"] is True
    assert got["return_mean"] == pytest.approx(np.mean(want))
    assert got["return_std"] == pytest.approx(np.std(want))
    assert got["return_min"] == min(want) and got["return_max"] == max(want)
    assert got["len_mean"] == pytest.approx(np.mean(want))  # CartPole: +1 a step


def test_a_run_folder_means_its_newest_checkpoint_and_a_seed_fixes_the_result(run, capsys):
    by_run = eval_json(capsys, str(run), "--episodes", "4", "--seed", "3")
    by_file = eval_json(capsys, str(newest(run)), "--episodes", "4", "--seed", "3")
    assert by_run["return_mean"] == by_file["return_mean"]
    a = eval_json(capsys, str(run), "--episodes", "6", "--stochastic", "--seed", "1")
    b = eval_json(capsys, str(run), "--episodes", "6", "--stochastic", "--seed", "1")
    assert a["deterministic"] is False and a["return_mean"] == b["return_mean"]


def test_text_output_is_one_line_with_mean_and_std(run, capsys):
    assert main(["eval", str(run), "--episodes", "3"]) == 0
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert "3 episodes (deterministic), return" in line and "±" in line


def ffmpeg_info(path: Path) -> str:
    done = subprocess.run(
        [imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-i", str(path)], capture_output=True, text=True
    )
    return done.stderr  # ffmpeg describes its input on stderr (and exits 1 with no output named)


def test_video_is_a_browser_playable_mp4_of_the_recorded_episode(run, tmp_path, capsys):
    videos = tmp_path / "videos"
    got = eval_json(capsys, str(run), "--episodes", "2", "--video", str(videos))
    (path,) = videos.glob("*.mp4")
    assert got["video"] == str(path)
    ret = int(path.stem.split("-return-")[1])
    assert path.stem.startswith(newest(run).stem) and got["return_min"] <= ret <= got["return_max"]
    info = ffmpeg_info(path)
    assert "Video: h264" in info and "yuv420p" in info and "600x400" in info
    assert f"return {ret}" in info  # the return in the file's metadata
    duration = next(ln for ln in info.splitlines() if "Duration" in ln).split("Duration: ")[1].split(",")[0]
    seconds = duration.split(":")[-1]  # hh:mm:ss.cc
    assert float(seconds) == pytest.approx(ret / 50, abs=0.05)  # one frame a step at CartPole's 50 fps
    again = eval_json(capsys, str(run), "--episodes", "2", "--video", str(videos))
    assert again["video"] != got["video"] and path.exists()  # a new name, never over the first


def test_onnx_export_needs_env_and_then_scores_like_its_checkpoint(run, tmp_path, capsys):
    onnx_path = tmp_path / "p.onnx"
    assert main(["export", str(newest(run)), "--out", str(onnx_path)]) == 0
    capsys.readouterr()
    assert main(["eval", str(onnx_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--env" in err
    by_onnx = eval_json(capsys, str(onnx_path), "--env", "CartPole-v1", "--episodes", "4", "--seed", "2")
    by_ckpt = eval_json(capsys, str(newest(run)), "--episodes", "4", "--seed", "2")
    assert by_onnx["return_mean"] == by_ckpt["return_mean"]


def test_a_factory_env_needs_env_gets_no_kwargs_and_cannot_render_but_still_scores(run, tmp_path, capsys):
    state = torch.load(newest(run), weights_only=True)
    marker = tmp_path / "kwargs-reached-the-factory"
    factory = "tests.services.recording_env:make"
    state["config"]["env"].update(id=factory, kwargs={"record_to": str(marker)})
    crafted = tmp_path / "crafted.pt"
    torch.save(state, crafted)
    assert main(["eval", str(crafted)]) == 2
    assert "module:factory" in capsys.readouterr().err
    videos = tmp_path / "videos"
    assert main(["eval", str(crafted), "--env", factory, "--episodes", "2", "--video", str(videos)]) == 0
    captured = capsys.readouterr()
    assert "2 episodes" in captured.out and "no video" in captured.err
    assert not marker.exists() and not videos.exists()


@pytest.mark.parametrize(
    "args, says",
    [
        (["nowhere"], "no such run folder"),
        (["{empty}"], "no valid checkpoint"),
        (["{run}", "--best"], "best.pt"),
        (["{ckpt}", "--best"], "--best takes a run folder"),
        (["{run}", "--episodes", "0"], "--episodes 0"),
        (["{run}", "--video", "{file}"], "not a folder"),
        (["{run}", "--video", "/sys/relay-videos"], "/sys is not a writable folder"),
        (["{run}", "--env", "Acrobot-v1"], "Acrobot-v1 observes"),
        (["{run}", "--env", "NoSuchEnv-v0"], "not a registered"),
        (["{run}", "--env-kwargs", "{{}}"], "--env-kwargs goes with --env"),
        (["{run}", "--env", "CartPole-v1", "--env-kwargs", "{{x"], "--env-kwargs: not JSON"),
        (["{run}", "--env", "CartPole-v1", "--env-kwargs", "[1]"], "a JSON object"),
        (
            ["{run}", "--env", "CartPole-v1", "--env-kwargs", '{{"no_such": 1}}'],
            "unexpected keyword argument",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_and_creates_nothing(run, tmp_path, capsys, args, says):
    """(Braces in `args` are doubled: each is formatted with the paths.)"""
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    before = sorted(tmp_path.rglob("*"))
    names = {
        "run": str(run),
        "ckpt": str(newest(run)),
        "empty": str(tmp_path / "empty"),
        "file": str(tmp_path / "file"),
    }
    argv = [a.format(**names) for a in args]
    assert main(["eval", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err
    assert sorted(tmp_path.rglob("*")) == before


def test_env_kwargs_typed_on_the_command_line_reach_the_env(run, capsys):
    """`--env-kwargs` builds the named env with the user's kwargs: CartPole's Sutton-Barto reward
    pays 0 a step and -1 at the fall, so every return is 0 or -1 where the default pays 1 a step."""
    plain = eval_json(capsys, str(run), "--env", "CartPole-v1", "--episodes", "4")
    typed = eval_json(
        capsys,
        str(run),
        "--env",
        "CartPole-v1",
        "--env-kwargs",
        '{"sutton_barto_reward": true}',
        "--episodes",
        "4",
    )
    assert plain["return_min"] >= 8 and plain["return_mean"] == plain["len_mean"]
    assert -1 <= typed["return_min"] <= typed["return_max"] <= 0
    assert typed["len_mean"] == plain["len_mean"]  # the same greedy episodes, paid differently


def _not_an_object(text: str) -> bool:
    try:
        return not isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return True


@given(st.one_of(st.text(max_size=40), st.just("[" * 100_000), st.just('{"a": 1}' + " " * 10_000)))
def test_any_env_kwargs_but_a_json_object_is_one_line_exit_2(run, text):
    """Whatever is typed: a JSON object within the size limit, or one line and exit 2 before any
    env or policy is loaded (deep nesting, long text, NaN and stray bytes included)."""
    if not _not_an_object(text) and len(text) <= 10_000:
        return
    proc_err = io.StringIO()
    with contextlib.redirect_stderr(proc_err):
        code = main(["eval", str(run), "--env", "CartPole-v1", f"--env-kwargs={text}"])
    assert code == 2 and proc_err.getvalue().count("\n") == 1 and "--env-kwargs" in proc_err.getvalue()


def test_a_run_trained_with_kwargs_is_told_them_not_given_them(run, tmp_path, capsys):
    """The run's env.kwargs are shown in the error when the named env does not fit without them,
    never passed: a constructor given `no_such` would raise, not report the observation."""
    state = torch.load(newest(run), weights_only=True)
    state["config"]["env"].update(id="Acrobot-v1", kwargs={"no_such": 1})
    crafted = tmp_path / "crafted.pt"
    torch.save(state, crafted)
    assert main(["eval", str(crafted), "--env", "Acrobot-v1", "--episodes", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Acrobot-v1 observes" in err, err
    assert 'trained with env.kwargs {"no_such": 1}: type any you want with --env-kwargs' in err


# Every policy kind relay trains, briefly trained, then scored: masks (Taxi's, from its info),
# Dict observations (MiniGrid), a recurrent core carried through the episode, the token
# transformer (GRPO), the Nature CNN on Atari frames (the true game's return: all lives).
KINDS = {
    "taxi_ppo": ["learner.buffer_size=1024", "stop.env_steps=2048"],
    "minigrid_doorkey_ppo": ["stop.env_steps=2048"],
    "cartpole_novel_lstm_ppo": ["stop.env_steps=2048"],
    "reverse_digits_grpo": ["learner.buffer_size=320", "stop.env_steps=640"],
    "breakout_ppo": [
        "env.num_envs=2",
        "env.vectorization=sync",
        "rollout.rollout_len=16",
        "learner.buffer_size=32",
        "learner.batch_size=32",
        "stop.env_steps=64",
    ],
}


@pytest.mark.parametrize("config", list(KINDS))
def test_every_policy_kind_is_scored(config, tmp_path, capsys):
    run = tmp_path / "run"
    assert train_local(f"{config}.yaml", run, *KINDS[config]) == 0
    capsys.readouterr()
    got = eval_json(capsys, str(run), "--episodes", "2", "--seed", "1")
    assert got["episodes"] == 2 and got["return_min"] <= got["return_mean"] <= got["return_max"]
    if config == "breakout_ppo":  # a true game: several lives, unclipped points
        assert got["len_mean"] >= 50
    again = eval_json(capsys, str(run), "--episodes", "2", "--seed", "1")
    assert again["return_mean"] == got["return_mean"]  # a seed fixes the result, whatever the kind


def test_mujoco_renders_offscreen_without_a_display(tmp_path, capsys, monkeypatch):
    """Hopper's frames through MuJoCo's offscreen renderer on this headless machine: relay picks
    EGL when nothing else is set (GLFW, MuJoCo's default, needs a display)."""
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    run = tmp_path / "hopper"
    assert train_local("hopper_ppo.yaml", run, "learner.buffer_size=2048", "stop.env_steps=2048") == 0
    capsys.readouterr()
    videos = tmp_path / "videos"
    got = eval_json(capsys, str(run), "--episodes", "1", "--video", str(videos))
    info = ffmpeg_info(Path(got["video"]))
    assert "Video: h264" in info and "480x480" in info


def test_a_render_that_raises_is_one_line_and_the_episodes_still_count(monkeypatch):
    from relay_rl.rollout_workers.envs import env_spec
    from relay_rl.rollout_workers.evaluation import run_episodes

    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1")] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    spec = env_spec(envs.single_observation_space, envs.single_action_space, None, {})

    def broken():
        raise AttributeError("'OffScreenViewer' object has no attribute 'opengl_context'")

    result = run_episodes(envs, spec, lambda f: (np.zeros(2, dtype=np.int64), None), 2, 0, render=broken)
    assert len(result.returns) == 2 and result.frames is not None and not result.frames.images
    assert "rendering failed" in result.frames.note and "libegl1" in result.frames.note


MLAGENTS_EXPORTS = Path(__file__).parent / "data" / "mlagents"


def onnxruntime_returns(export: Path, env_id: str, episodes: int, seed: int) -> list[float]:
    """The episodes `relay eval` plays, played by hand with onnxruntime on ML-Agents' own graph:
    its `deterministic_*_actions` output, all actions allowed in `action_masks`, the LSTM memory
    fed back from `recurrent_out` and zeroed when an episode starts; no relay code but the seeds."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(export), providers=["CPUExecutionProvider"])
    inputs = {i.name: i.shape for i in session.get_inputs()}
    outputs = [o.name for o in session.get_outputs()]
    action = next(name for name in outputs if name.startswith("deterministic_"))
    discrete = action == "deterministic_discrete_actions"
    memory_size = inputs["recurrent_in"][-1] if "recurrent_in" in inputs else 0
    memory: list[np.ndarray] = []

    def new_episode() -> None:
        memory[:] = [np.zeros((1, 1, memory_size), np.float32)] if memory_size else []

    def act(obs: np.ndarray) -> Any:
        feeds = {"obs_0": obs[None].astype(np.float32)}
        if "action_masks" in inputs:
            feeds["action_masks"] = np.ones((1, inputs["action_masks"][-1]), np.float32)
        if memory:
            feeds["recurrent_in"] = memory[0]
        result = dict(zip(outputs, session.run(outputs, feeds), strict=True))
        if memory:
            memory[0] = result["recurrent_out"]
        return int(result[action][0, 0]) if discrete else result[action][0]

    return played_returns(env_id, episodes, seed, act, new_episode)


@pytest.mark.parametrize(
    "name, env_id",
    [
        ("discrete_cartpole", "CartPole-v1"),  # one branch of 2, a folded normalizer
        ("continuous_plain", "Swimmer-v5"),  # 2 actions in [-1, 1] (clamp(x, -3, 3) / 3)
        ("recurrent_continuous", "Swimmer-v5"),  # an LSTM memory carried through the episode
    ],
)
@pytest.mark.parametrize("suffix", [".onnx", ".pt"])
def test_mlagents_policies_score_in_the_env_the_user_names(name, env_id, suffix, capsys):
    """Real ML-Agents 1.1.0 exports and checkpoints (tests/services/data/mlagents) in a
    gymnasium env of their shape, named with --env: relay's episodes are onnxruntime's."""
    path = MLAGENTS_EXPORTS / f"{name}{suffix}"
    got = eval_json(capsys, str(path), "--env", env_id, "--episodes", "3", "--seed", "4")
    want = onnxruntime_returns(MLAGENTS_EXPORTS / f"{name}.onnx", env_id, 3, 4)
    assert got["episodes"] == 3
    assert got["return_mean"] == pytest.approx(np.mean(want), rel=1e-5, abs=1e-5)
    assert got["return_min"] == pytest.approx(min(want), rel=1e-5, abs=1e-5)
    assert got["return_max"] == pytest.approx(max(want), rel=1e-5, abs=1e-5)


def test_an_mlagents_policy_names_no_env(capsys):
    """An ML-Agents file names no env relay may build (its Unity scene is not a gymnasium id)."""
    path = MLAGENTS_EXPORTS / "discrete_cartpole.onnx"
    assert main(["eval", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--env" in err[0]


@pytest.mark.e2e
def test_sigterm_stops_an_eval_with_video_in_bounded_time(run, tmp_path):
    """pygame's SDL took SIGTERM for itself: `relay eval --video` played every episode through one
    and exited 0. Now it stops like every command: exit 143 within seconds, nothing written."""
    import signal
    import subprocess
    import sys
    import time

    videos = tmp_path / "videos"
    argv = ["eval", str(run), "--episodes", "5000", "--video", str(videos)]
    cmd = [sys.executable, "-m", "relay_rl.services.cli", *argv]
    root = Path(__file__).parents[2]
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(8)  # past start-up: episodes are playing and frames rendering
        assert proc.poll() is None, proc.communicate()
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, err[-2000:]
    assert time.monotonic() - t0 < 30 and "relay eval: terminated" in err
    assert not list(videos.glob("*.mp4"))


@given(
    st.dictionaries(
        st.text(max_size=20),
        st.one_of(st.text(max_size=400), st.integers(), st.floats(), st.booleans(), st.none()),
        min_size=1,
        max_size=5,
    )
)
def test_the_stored_kwargs_hint_is_one_short_line_whatever_they_hold(stored):
    """The hint quotes a file's kwargs in an error line: newlines, control characters, non-ASCII and
    NaN never break it into more lines, and it never grows past its cap."""
    from types import SimpleNamespace

    from relay_rl.contracts.config import EnvConfig
    from relay_rl.services.tools.load import NamedEnv

    handle = SimpleNamespace(config=SimpleNamespace(env=EnvConfig(id="CartPole-v1", kwargs=stored)))
    hint = NamedEnv("CartPole-v1").kwargs_hint(handle)
    assert hint.startswith(" (the run was trained with env.kwargs {") and hint.isascii()
    assert "\n" not in hint and "\r" not in hint and len(hint) < 300
    assert NamedEnv("CartPole-v1", stored).kwargs_hint(handle) == ""  # typed: nothing to tell
    assert NamedEnv("Acrobot-v1").kwargs_hint(handle) == ""  # another env: the run's kwargs are not its
