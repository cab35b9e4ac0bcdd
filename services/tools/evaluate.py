"""`relay eval`: whole evaluation episodes of a policy file, scored, with a video of one of them.

The env is the one the user names with `--env` (built with only the kwargs typed with
`--env-kwargs`, as `export`/`verify` do), or
else the run's own, from the config its checkpoint carries, when that is a registered gymnasium id
(`CartPole-v1`, `ALE/Breakout-v5`): its stored settings are data for a constructor gymnasium has
registered. A `module:factory` env would run code a file names, and an ONNX or ML-Agents file
names no env relay trusts: those need `--env`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from ...contracts.config import EnvConfig
from ...rollout_workers.envs import PETTINGZOO, EnvSpecError
from ...rollout_workers.evaluation import (
    MAX_EVAL_ENVS,
    EvalResult,
    build_eval_env,
    eval_env_config,
    play,
)
from ...rollout_workers.scenes import open_scene
from ...rollout_workers.video import encode_mp4, video_stem
from ...services.runs.checkpoints import BEST_NAME, load_newest_valid
from ...services.runs.files import write_numbered
from ...services.tools.handle import PolicyHandle, PolicyLoadError
from ...services.tools.load import NamedEnv, check_env_fits, scene_policies

MAX_EPISODES = 100_000


@dataclass(frozen=True)
class EvalOptions:
    episodes: int = 10
    stochastic: bool = False  # sample actions instead of the distribution's mode
    seed: int | None = None  # default: the run's env.seed (else 0), on the evaluation seed stream
    env: NamedEnv | None = None  # --env and --env-kwargs: the env the user names
    video: bool = False  # keep the frames of one episode


def eval_env(
    handle: PolicyHandle, named: NamedEnv | None, num_envs: int, video: bool
) -> tuple[EnvConfig, NamedEnv]:
    """The env config episodes run in (see the module docstring for which env that is), and the env
    as named (the user's, or the run's own registered id with its stored settings)."""
    stored = handle.config.env if handle.config is not None else None
    if named is None:
        if stored is None:
            raise PolicyLoadError(f"{handle.source} names no env relay may build: name one with --env ENV_ID")
        if ":" in stored.id:
            kind = "a PettingZoo module" if stored.id.startswith(PETTINGZOO) else "a module:factory env"
            raise PolicyLoadError(
                f"{handle.source} was trained on {stored.id!r}, {kind}, which a file never builds: "
                "name it with --env ENV_ID"
            )
        ec, named = stored, NamedEnv(stored.id, stored.kwargs)
    else:
        ec = named.config(handle, num_envs)
    return eval_env_config(ec, num_envs, video, handle.env.columns), named


def evaluate(handle: PolicyHandle, opts: EvalOptions) -> EvalResult:
    """Run `opts.episodes` episodes of the policy; PolicyLoadError (one line) for an env it cannot
    act in."""
    if not 1 <= opts.episodes <= MAX_EPISODES:
        raise PolicyLoadError(f"--episodes {opts.episodes}: must be 1 to {MAX_EPISODES}")
    ec, named = eval_env(handle, opts.env, min(opts.episodes, MAX_EVAL_ENVS), opts.video)
    seed = opts.seed if opts.seed is not None else ec.seed
    try:
        if handle.group is None:
            envs, note = build_eval_env(ec)
        else:
            players = scene_policies(handle)
            envs, note = open_scene(ec, handle.group, players, opts.stochastic, seed)
    except EnvSpecError as err:
        raise PolicyLoadError(str(err)) from None
    try:
        info = envs.reset(seed=seed)[1]
        check_env_fits(handle, envs, named, info, acting=True)
        result = play(
            envs,
            handle.env,
            handle.model,
            ec,
            opts.episodes,
            seed,
            opts.stochastic,
            opts.video,
            note,
            handle.action_transform,
        )
    finally:
        with contextlib.suppress(Exception):
            envs.close()
    return result


def describe(result: EvalResult, source: str, deterministic: bool) -> str:
    """The lines `relay eval` prints."""
    s = result.summary()
    how = "deterministic" if deterministic else "stochastic"
    return (
        f"{source}: {s['episodes']} episodes ({how}), return {s['return_mean']:.2f} ± {s['return_std']:.2f} "
        f"(min {s['return_min']:.2f}, max {s['return_max']:.2f}), length {s['len_mean']:.1f}, "
        f"{s['env_steps']} env steps in {s['seconds']:.1f} s"
    )


def policy_file(path: Path, best: bool) -> Path:
    """The policy file `relay eval` reads: the file itself, or a run folder's newest valid
    checkpoint (`best`: its checkpoints/best.pt)."""
    if path.is_dir():
        folder = path / "checkpoints"
        if best:
            found = folder / BEST_NAME
            if not found.is_file():
                why = "train with checkpoint.keep_best=true"
                raise PolicyLoadError(f"{path}: no {folder.name}/{BEST_NAME} ({why})")
            return found
        newest = load_newest_valid(folder) if folder.is_dir() else None
        if newest is None:
            raise PolicyLoadError(f"{path}: no valid checkpoint in {folder}")
        return newest[0]
    if best:
        raise PolicyLoadError(
            f"{path}: " + ("--best takes a run folder" if path.exists() else "no such run folder")
        )
    if not path.is_file():
        raise PolicyLoadError(f"{path}: no such run folder or policy file")
    return path


def save_video(result: EvalResult, folder: Path, label: str, source: str) -> tuple[Path | None, str | None]:
    """Write the recorded episode as `<label>-return-<R>.mp4` (a new file in `folder`, never over
    one), with its source and return in the file's metadata: (the path, None), or (None, why not)."""
    frames = result.frames
    if frames is None or not frames.images or frames.episode_return is None:
        return None, frames.note if frames is not None and frames.note else "no episode was recorded"
    data = encode_mp4(
        frames.images, frames.fps, {"title": source, "comment": f"return {frames.episode_return:g}"}
    )
    return write_numbered(folder, video_stem(label, frames.episode_return), ".mp4", data), None
