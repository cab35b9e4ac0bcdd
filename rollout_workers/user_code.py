"""Code the user names on the command line: a `module:factory` env (env.id) and a `module:fn`
agent-to-group mapping (multi_agent.policy_mapping). Their top-level modules may come from the
user's working folder, after everything installed; nothing read from a run directory reaches here
unless the user names it again (see services/driver/run.py's resume)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from typing import Any

from ..contracts.config import RelayConfig, is_code_reward

PETTINGZOO = "pettingzoo:"  # env ids naming a PettingZoo env's module


class UserCodeError(ValueError):
    """A `module:fn` that cannot be imported or is not callable (one line)."""


def one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:300]}" if text else type(err).__name__


class _EnvModuleFinder(importlib.abc.MetaPathFinder):
    """Finds one top-level module (a `module:factory` env's) in one folder, and nothing else.

    It sits at the end of sys.meta_path, so it is asked only after every installed package and
    the standard library said no: the folder can never shadow a library."""

    def __init__(self, top: str, folder: str) -> None:
        self.top, self.folder = top, folder

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.top:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [self.folder])


def allow_env_module(env_id: str, folder: str) -> None:
    """Let the top-level module of a `module:factory` env id (one the user named) be imported from
    `folder` (the user's working folder), after everything installed. Nothing else in `folder`
    is importable through this; ids without ':' change nothing. A `pettingzoo:<module>` id's
    module is the one named after the prefix (a package of the user's own, like mpe2)."""
    if env_id.startswith(PETTINGZOO):
        add_finder(env_id[len(PETTINGZOO) :].split(".")[0], folder)
    elif ":" in env_id:
        add_finder(_top_module(env_id), folder)


def allow_user_code(cfg: RelayConfig, folder: str) -> None:
    """`allow_env_module` for the config's env and, where it has them, its agent-to-group mapping
    and its reward functions (`module:fn` entries of prompts.rewards)."""
    allow_env_module(cfg.env.id, folder)
    if cfg.multi_agent.policy_mapping is not None:
        add_finder(_top_module(cfg.multi_agent.policy_mapping), folder)
    for spec in cfg.prompts.rewards:
        if is_code_reward(spec):
            add_finder(_top_module(spec), folder)


def _top_module(spec: str) -> str:
    """The top-level module of `module:attr` ("pkg" of "pkg.sub:fn")."""
    return spec.partition(":")[0].split(".")[0]


def add_finder(top: str, folder: str) -> None:
    if not any(isinstance(f, _EnvModuleFinder) and (f.top, f.folder) == (top, folder) for f in sys.meta_path):
        sys.meta_path.append(_EnvModuleFinder(top, folder))


def module_folders() -> list[tuple[str, str]]:
    """(top-level module, folder) of every finder added, to carry into subprocesses."""
    return [(f.top, f.folder) for f in sys.meta_path if isinstance(f, _EnvModuleFinder)]


def import_named(spec: str, label: str) -> tuple[Any, str]:
    """(the module, the attribute name) of `module:attr`; UserCodeError starting with `label` where
    the module cannot be imported."""
    module_name, _, attr = spec.partition(":")
    try:
        return importlib.import_module(module_name), attr
    except Exception as err:  # ImportError, SyntaxError, or whatever the module raises on import
        raise UserCodeError(f"{label}: cannot import module {module_name!r} ({one_line(err)})") from None


def import_callable(spec: str, setting: str) -> Callable[..., Any]:
    """The callable `module:fn` names; UserCodeError naming `setting` where it cannot be had."""
    module, attr = import_named(spec, f"{setting}={spec}")
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise UserCodeError(f"{setting}={spec}: {module.__name__} has no callable {attr!r}")
    return fn
