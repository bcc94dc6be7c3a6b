"""A user's reward, `reward.kind='MODULE:NAME'`: NAME imported from MODULE (on `PYTHONPATH`). NAME may be

- a `Construction` subclass: used as a built-in one is (it declares its roles, judge load, checks; it returns a
  `RewardResult` with its metrics, judgments and notes);
- a plain function `f(prompts: list[str], responses: list[list[str]])` returning rewards `[B, m]` (array-like) or
  `(rewards, metrics)`;
- a function with the full signature `(prompts, responses, prompt_index, step)`, returning the same;
- any other class: constructed as `NAME.from_settings(settings, context)` when it has that classmethod (the run's
  `rrc_jax.config.TrainerSettings` and its `RewardContext`), else `NAME()`,
  and called as such a function.

Anything but a `Construction` subclass loads no model beyond the policy and gets the base class's evaluation. Rewards
that are not `[B, m]` numbers, from any of them, stop the run with one line naming the plug-in (a `ConfigError`,
`Construction.__call__`).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping

from rrc_jax.constructions.base import Construction, RewardResult
from rrc_jax.errors import ConfigError


def is_plugin(kind: str) -> bool:
    """A `reward.kind` of the form MODULE:NAME names a user's reward."""
    return ":" in kind


def load_plugin(kind: str):
    """The object named by `MODULE:NAME` (a one-line `ConfigError` when it cannot be imported)."""
    module, _, name = kind.partition(":")
    try:
        obj = importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"config.reward.kind={kind!r}: cannot import {module!r} ({e}); put it on PYTHONPATH") from None
    for part in name.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"config.reward.kind={kind!r}: module {module!r} has no {name!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"config.reward.kind={kind!r} names a {type(obj).__name__}, not a function or class")
    return obj


class PluginReward(Construction):
    """A user's function (or an instance of a user's class) called as `f(prompts, responses)` or `f(prompts,
    responses, prompt_index, step)` (module docstring), as a construction. With `data.format` its prompts are
    pairwise judge questions, as RLVR's; without, plain prompts."""

    questions = "pairwise"

    def __init__(self, function, name: str):
        self.function, self.kind = function, name
        try:
            self.full = len(inspect.signature(function).parameters) >= 4
        except (TypeError, ValueError):
            self.full = True

    def plugin_kind(self) -> str:
        return self.kind  # MODULE:NAME as given

    def construct(self, prompts, responses, prompt_index, step) -> RewardResult:
        args = (prompts, responses, prompt_index, step) if self.full else (list(prompts), [list(g) for g in responses])
        out = self.function(*args)
        if isinstance(out, RewardResult):
            return out
        paired = isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], Mapping)
        rewards, metrics = out if paired else (out, {})
        return RewardResult(rewards, dict(metrics))  # (its shape and numbers checked by `Construction.__call__`)
