"""Evaluation episodes: whole episodes of a policy in a vector env, scored as a person would score
them (the true game return for Atari, as training reports it), on env seeds apart from training's,
with the frames of one episode for a video. No Ray here: `relay eval` runs it in its process and
the evaluation actor runs it during training.

Episodes are spread over the N envs the way SB3's `evaluate_policy` does (env i runs
`(episodes + i) // N` of them, and what it finishes beyond that is ignored), so short episodes are
not over-counted just because they finish first.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from ..contracts.config import IN_PROCESS, EnvConfig, MultiAgentConfig
from ..contracts.segment import Fields
from ..contracts.spaces import EnvSpec
from ..policy.actor_critic import STATE, draw_noise, fields_to_torch
from ..policy.protocol import EnvPolicy
from ..rollout_workers.continuing import reported_episodes
from ..rollout_workers.envs import EnvSpecError, check_env_id, env_actions, env_seeds
from ..rollout_workers.observations import ObsReader
from ..rollout_workers.preprocess import preprocessor
from ..rollout_workers.vector_backends import make_vector_env

# Env seeds of evaluation episodes: a stream no training run uses (a fresh run is stream 0, a
# resume or a restarted worker a small one), so evaluation never replays training's episodes.
EVAL_SEED_STREAM = 1_000_003
MAX_EVAL_ENVS = 8  # envs stepped side by side; fewer when fewer episodes are asked for

# (input fields [N, ...], with "h_in" [N, S] for a recurrent policy) -> (the policy's actions
# [N, *act], the state after the step [N, S] or None)
Act = Callable[[Fields], tuple[np.ndarray, np.ndarray | None]]


@dataclass
class Frames:
    """RGB frames [H, W, 3] uint8 of the first episode env 0 finishes, for a video."""

    images: list[np.ndarray] = field(default_factory=list)
    recording: bool = True
    note: str | None = None  # why there are none (the env cannot render)
    episode_return: float | None = None  # the recorded episode's
    fps: float = 30.0


@dataclass
class EvalResult:
    """Finished episodes' returns and lengths (in the order they finished), the env steps taken
    and the seconds it took, and the frames of one episode when they were asked for."""

    returns: list[float]
    lengths: list[int]
    steps: int
    seconds: float
    frames: Frames | None = None

    def summary(self) -> dict[str, Any]:
        """mean, std (population, as SB3 reports it), min and max of the return; mean length."""
        r = np.asarray(self.returns, dtype=np.float64)
        if not len(r):  # cancelled before any episode ended
            r = np.full(1, np.nan)
        return {
            "episodes": len(self.returns),
            "return_mean": float(r.mean()),
            "return_std": float(r.std()),
            "return_min": float(r.min()),
            "return_max": float(r.max()),
            "len_mean": float(np.mean(self.lengths)) if self.lengths else float("nan"),
            "env_steps": self.steps,
            "seconds": self.seconds,
            "episodes_per_s": len(self.returns) / self.seconds if self.seconds > 0 else float("inf"),
        }


def model_act(
    model: EnvPolicy, stochastic: bool, seed: int, transform: Callable[[Tensor], Tensor] | None = None
) -> Act:
    """The policy's acting step on numpy fields: greedy, or sampled with noise from a CPU generator
    seeded with `seed`; continuous actions through `transform` (an imported policy's clip)."""
    gen = torch.Generator().manual_seed(seed)

    @torch.no_grad()
    def act(fields: Fields) -> tuple[np.ndarray, np.ndarray | None]:
        x = fields_to_torch(fields)
        noise = draw_noise(model.action, len(next(iter(x.values()))), gen) if stochastic else None
        actions, state = model.choose(x, noise)
        if transform is not None and model.action.floats:
            actions = transform(actions)
        return actions.numpy(), None if state is None else state.numpy()

    return act


def eval_env_config(ec: EnvConfig, num_envs: int, video: bool, columns: int = 1) -> EnvConfig:
    """`ec` for evaluation: `num_envs` envs, in this process (or EnvPool's threads) rather than a
    process each, with rgb_array rendering for a video (through gymnasium: EnvPool renders none).
    A multi-agent env's `columns` per copy (EnvSpec.columns) round num_envs up to whole copies."""
    num_envs = -(-num_envs // columns) * columns
    # video renders through gymnasium; a process per env would cost more than a few episodes take
    vectorization = IN_PROCESS if video or ec.vectorization == "async" else ec.vectorization
    kwargs = {**ec.kwargs, "render_mode": "rgb_array"} if video else ec.kwargs
    return ec.model_copy(update={"num_envs": num_envs, "vectorization": vectorization, "kwargs": kwargs})


def build_eval_env(
    ec: EnvConfig, ma: MultiAgentConfig | None = None
) -> tuple[gym.vector.VectorEnv, str | None]:
    """The vector env of `ec` (EnvSpecError in one line when it cannot be built); asked for
    rgb_array rendering and refusing it, the env without, and the line saying there is no video.
    `ma`: a PettingZoo env's agents and policy groups (default: every agent, one policy)."""
    # rgb_array rendering needs no display: SDL (pygame's, for the classic-control envs) would
    # otherwise look for one and print that it found none; MuJoCo's default GLFW needs one, EGL
    # renders offscreen without (the user's own MUJOCO_GL wins).
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    if not os.environ.get("DISPLAY") and "render_mode" in ec.kwargs:
        os.environ.setdefault("MUJOCO_GL", "egl")
    try:
        return _make(ec, ma), None
    except EnvSpecError:
        if "render_mode" not in ec.kwargs:
            raise
    plain = ec.model_copy(update={"kwargs": {k: v for k, v in ec.kwargs.items() if k != "render_mode"}})
    return _make(plain, ma), f"{ec.id} takes no render_mode='rgb_array': no video"


def _make(ec: EnvConfig, ma: MultiAgentConfig | None) -> gym.vector.VectorEnv:
    try:
        check_env_id(ec.id)
        return make_vector_env(ec, ma=ma)
    except EnvSpecError:
        raise
    except Exception as err:
        raise EnvSpecError(f"env {ec.id}: cannot be built ({type(err).__name__}: {err})") from None


def play(
    envs: gym.vector.VectorEnv,
    spec: EnvSpec,
    model: EnvPolicy,
    ec: EnvConfig,
    episodes: int,
    seed: int,
    stochastic: bool = False,
    video: bool = False,
    note: str | None = None,
    transform: Callable[[Tensor], Tensor] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> EvalResult:
    """`run_episodes` of `model` in `envs` (built from `ec` by `build_eval_env`, whose `note` says
    why they cannot render), the way `relay eval` and the training-time evaluator both play:
    noise seeded apart from the env seeds, the env's own episode reporting, env 0's frames at the
    game's speed when `video` is asked for and possible (else the note in `frames`)."""
    prep = preprocessor(ec.preprocess)
    result = run_episodes(
        envs,
        spec,
        model_act(model, stochastic, seed + EVAL_SEED_STREAM, transform),
        episodes,
        seed,
        model.acting_state_size,
        prep.reports_episodes,
        render_first(envs) if video and note is None else None,
        cancelled,
    )
    if result.frames is not None:
        result.frames.fps = float(envs.metadata.get("render_fps") or 30) / prep.frames_per_step
    if video and note is not None:
        result.frames = Frames(recording=False, note=note)
    return result


def episode_targets(episodes: int, num_envs: int) -> np.ndarray:
    """[N] episodes each env runs: `episodes` spread as evenly as they go (SB3's split: the last
    envs run one more). Fewer episodes than envs (a multi-agent env's columns, rounded up to whole
    copies): the first envs run one each, so env 0, the one a video films, always plays."""
    if episodes < num_envs:
        return (np.arange(num_envs) < episodes).astype(np.int64)
    return np.array([(episodes + i) // num_envs for i in range(num_envs)], dtype=np.int64)


def render_first(envs: gym.vector.VectorEnv) -> Callable[[], np.ndarray | None]:
    """A function rendering env 0 of a vector env made with render_mode="rgb_array"."""
    sub = getattr(envs, "envs", None)
    if sub is None:  # AsyncVectorEnv/EnvPool: the evaluator builds a sync env for videos
        return lambda: None
    return lambda: sub[0].render()


def run_episodes(
    envs: gym.vector.VectorEnv,
    spec: EnvSpec,
    act: Act,
    episodes: int,
    seed: int,
    state_size: int = 0,
    reports_episodes: bool = False,
    render: Callable[[], np.ndarray | None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> EvalResult:
    """Run `episodes` whole episodes on envs seeded from `seed` (EVAL_SEED_STREAM).

    `envs` is a SAME_STEP-autoreset vector env whose observations are the policy's; `act` chooses
    actions; `state_size` > 0 carries a recurrent state, zeroed where an episode (a life, for
    Atari, as in training) ends. `reports_episodes`: episodes are the ones the env reports in
    `info["episode"]` (Atari's true game), not the sampler's own count. `render` returns env 0's
    RGB frame (None when it cannot render): the frames of its first counted episode are kept.
    `cancelled` ends the episodes early (a run that stops does not wait for its evaluation).
    """
    n = envs.num_envs
    t0 = time.perf_counter()
    targets = episode_targets(episodes, n)
    counts = np.zeros(n, dtype=np.int64)
    ep_return, ep_len = np.zeros(n), np.zeros(n, dtype=np.int64)
    returns: list[float] = []
    lengths: list[int] = []
    reader = ObsReader(spec, n)
    # A seed per env (gymnasium's vector reset takes a list; its annotation says int).
    obs, info = envs.reset(seed=env_seeds(seed, 0, n, EVAL_SEED_STREAM))  # type: ignore[arg-type]
    state = np.zeros((n, state_size), dtype=np.float32) if state_size else None
    frames = _first_frame(render)
    steps = 0
    while (counts < targets).any() and not (cancelled is not None and cancelled()):
        fields = reader.read(obs, info)
        actions, after = act(fields if state is None else {**fields, STATE: state})
        obs, reward, terminated, truncated, info = envs.step(
            env_actions(spec.action, envs.single_action_space, actions)
        )
        steps += int((counts < targets).sum())
        done = terminated | truncated
        ep_return += reward
        ep_len += 1
        ended = reported_episodes(info) if reports_episodes else None
        for i in map(int, np.flatnonzero(done)):
            result = (float(ep_return[i]), int(ep_len[i])) if ended is None else ended.get(i)
            if result is not None and counts[i] < targets[i]:
                returns.append(result[0])
                lengths.append(result[1])
                counts[i] += 1
                if i == 0 and frames is not None and frames.episode_return is None:
                    frames.recording, frames.episode_return = False, result[0]
        ep_return[done], ep_len[done] = 0.0, 0
        if frames is not None and frames.recording and render is not None:
            _grab(frames, render)
        if state is not None and after is not None:
            state = np.where(done[:, None], np.float32(0.0), after)
    return EvalResult(returns, lengths, steps, time.perf_counter() - t0, frames)


def _first_frame(render: Callable[[], np.ndarray | None] | None) -> Frames | None:
    if render is None:
        return None
    frames = Frames()
    _grab(frames, render)
    return frames


# What a render that raises most likely lacks, by the env's family (MuJoCo's offscreen GL).
GL_HINT = (
    "MuJoCo renders offscreen through EGL here (MUJOCO_GL=egl): install libegl1 (Debian/Ubuntu), "
    "or set MUJOCO_GL=osmesa with libosmesa6"
)


GL_WORDS = re.compile(r"opengl|glfw|egl|osmesa|gl\w*error", re.IGNORECASE)


def _grab(frames: Frames, render: Callable[[], np.ndarray | None]) -> None:
    """One frame of env 0; a render that raises stops the recording, saying why in one line."""
    try:
        image = render()
    except Exception as err:
        why = " ".join(f"{type(err).__name__}: {err}".split())[:160]
        hint = f"; {GL_HINT}" if GL_WORDS.search(why) else ""
        frames.note, frames.recording = f"rendering failed ({why}){hint}: no video", False
        frames.images.clear()
        return
    _keep(frames, image)


def _keep(frames: Frames, image: Any) -> None:
    """Keep an RGB frame; anything else stops the recording with a note saying why."""
    arr = np.asarray(image) if image is not None else None
    if arr is None or arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3:
        got = "nothing" if arr is None else f"{arr.dtype} {tuple(arr.shape)}"
        frames.note = f"the env renders no RGB frames (render() gave {got}): no video"
        frames.recording = False
        frames.images.clear()
        return
    frames.images.append(arr.copy())
