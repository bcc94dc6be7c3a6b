"""The registry of reward constructions: `reward.kind` -> its `Construction` class. It is the one list of kinds:
config defaults and checks, the planner, the data loader and the trainer all ask it (`construction_class`). A new
built-in construction is one module (the tournaments share one) and one line here; a user's is `reward.kind='MODULE:NAME'` (`plugin`)."""

from __future__ import annotations

import dataclasses

from rrc_jax.constructions.adaptive import ActiveReward, SequentialAGRReward
from rrc_jax.constructions.agr import AGRReward
from rrc_jax.constructions.base import Construction
from rrc_jax.constructions.drm import DRMReward
from rrc_jax.constructions.irpo import IRPOReward
from rrc_jax.constructions.judged import JudgeSettings
from rrc_jax.constructions.plugin import PluginReward, is_plugin, load_plugin
from rrc_jax.constructions.pointwise import PointwiseReward
from rrc_jax.constructions.prc import PRCReward
from rrc_jax.constructions.rlvr import RLVRReward
from rrc_jax.constructions.scr import SCRReward
from rrc_jax.constructions.tournaments import (CircularReward, DoubleEliminationReward, SeededKnockoutReward,
                                               SwissReward)
from rrc_jax.errors import ConfigError
from rrc_jax.sharding import FROZEN_ROLES
from rrc_jax.settings import defaults

CONSTRUCTIONS: dict[str, type[Construction]] = {cls.kind: cls for cls in (
    DRMReward,
    PRCReward,
    SCRReward,
    AGRReward,
    PointwiseReward,
    RLVRReward,
    IRPOReward,
    SwissReward,
    DoubleEliminationReward,
    SeededKnockoutReward,
    CircularReward,
    ActiveReward,
    SequentialAGRReward,
)}


def construction_class(kind: str) -> type[Construction]:
    """The class of `reward.kind`: a registered kind, a user's `Construction` subclass, or `PluginReward` for a
    user's function or other class (a one-line `ConfigError` for anything else)."""
    if not is_plugin(kind):
        if kind not in CONSTRUCTIONS:
            raise ConfigError(f"config.reward.kind: {kind!r} is not one of {', '.join(CONSTRUCTIONS)} or MODULE:NAME")
        return CONSTRUCTIONS[kind]
    obj = load_plugin(kind)
    return obj if isinstance(obj, type) and issubclass(obj, Construction) else PluginReward


def reward_defaults() -> dict:
    """The `reward` config group's defaults: the judge's settings, a reward service's URL (`service_url`: empty, the
    judge in this process; `rrc_jax.constructions.served`) and how long a run waits for it to answer at its start
    (`service_wait_s`), and each construction's own group."""
    return {"judge": defaults(JudgeSettings), "service_url": "", "service_wait_s": 60.0,
            **{kind: dataclasses.asdict(cls.Settings()) for kind, cls in CONSTRUCTIONS.items() if cls.Settings}}


def check_reward(s) -> None:
    """The rules of the run's reward across groups (`s`: the run's `rrc_jax.config.TrainerSettings`): its roles,
    `data.format` only for a construction that scores judge questions, and its own `check`."""
    cls, kind = s.reward, s.reward_kind
    unknown = sorted(set(cls.roles(s)) - set(FROZEN_ROLES))
    if unknown:
        raise ConfigError(f"config.reward.kind={kind!r} asks for the roles {', '.join(unknown)}; a "
                          f"construction's roles are {', '.join(FROZEN_ROLES)} (the policy is always there)")
    data_format = s.prompts.data.format
    if data_format and cls.questions is None:
        raise ConfigError(f"config.data.format: {data_format!r} makes the prompts judge questions, which "
                          f"reward.kind={kind!r} does not score; leave data.format empty for a prompt "
                          "file (reward kinds that train a judge: "
                          f"{', '.join(k for k, c in CONSTRUCTIONS.items() if c.questions)} or a plug-in)")
    if s.judge.force_verdicts and "grm" in cls.roles(s) and s.inference.engine != "jax":
        raise ConfigError(f"config.reward.judge.force_verdicts: a forced verdict is read from the judge's next-token "
                          f"log-probs, which inference.engine={s.inference.engine!r} (a completions server) does not "
                          "return; use inference.engine='jax' or set force_verdicts=False")
    cls.check(s)


def make_construction(s, ctx) -> Construction:
    """The construction of the run's `reward.kind` (`s`: its `TrainerSettings`; `ctx`: its `RewardContext`)."""
    cls = s.reward
    if cls is not PluginReward:
        return cls.from_settings(s, ctx)
    obj = load_plugin(s.reward_kind)
    if isinstance(obj, type):
        obj = obj.from_settings(s, ctx) if hasattr(obj, "from_settings") else obj()
    return PluginReward(obj, s.reward_kind)


__all__ = ["CONSTRUCTIONS", "check_reward", "construction_class", "group_kinds", "make_construction",
           "reward_defaults"]


def group_kinds() -> list[str]:
    """The kinds that reward another trainer's groups (`Construction.of_groups`; `rrc_jax.integrations`)."""
    return [kind for kind, cls in CONSTRUCTIONS.items()
            if cls.of_groups.__func__ is not Construction.of_groups.__func__]
