"""Reward constructions: the objects that turn a step's groups of responses into rewards, one module per kind
(`registry.CONSTRUCTIONS`), each owning its kind (`base.Construction`). The math they use is in `rrc_jax.rewards`."""

from rrc_jax.constructions.base import Construction, JudgeLoad, RewardResult, step_seed
from rrc_jax.constructions.context import RewardContext
from rrc_jax.constructions.judged import JudgeConstruction, JudgeSettings
from rrc_jax.constructions.registry import (CONSTRUCTIONS, check_reward, construction_class, group_kinds,
                                            make_construction, reward_defaults)

__all__ = ["CONSTRUCTIONS", "Construction", "JudgeConstruction", "JudgeLoad", "JudgeSettings", "RewardContext",
           "RewardResult", "check_reward", "construction_class", "group_kinds", "make_construction", "reward_defaults",
           "step_seed"]
