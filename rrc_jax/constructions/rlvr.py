"""RLVR (RM-R1's Eq. 8): the policy is a judge, rewarded +1 for a judge question's correct verdict, else -1."""

from __future__ import annotations

import numpy as np

from rrc_jax.constructions.base import Construction, RewardResult
from rrc_jax.errors import ConfigError


def require_questions(kind: str, s) -> None:
    """A `ConfigError` unless `data.format` makes the prompts judge questions (the constructions that train a
    judge; `s`: the run's settings)."""
    if not s.prompts.data.format:
        raise ConfigError(f"config.data.format: reward.kind={kind!r} trains a judge on preference questions: set "
                          "data.format (helpsteer3, rmbench, judgebench or pairs; with data.path='toy', pairs)")


class RLVRReward(Construction):
    """Each prompt is a judge question whose correct verdict is known (`data.format`,
    `rrc_jax.data.prompts.judge_questions`); a judgment earns +1 when its verdict is correct, -1 otherwise (a wrong
    verdict or none). Held out, the oracle's quality is the verdicts' accuracy."""

    kind = "rlvr"
    questions = "pairwise"

    def __init__(self, train):
        if train.oracle is None or not train.rendered:
            raise ConfigError("reward.kind='rlvr' needs judge questions as prompts: set data.format (helpsteer3, "
                              "rmbench, judgebench or pairs)")
        self.correct = train.oracle

    @classmethod
    def absolute_scale(cls, s) -> bool:
        return True  # correct or not, whatever the group

    @classmethod
    def check(cls, s) -> None:
        require_questions(cls.kind, s)

    @classmethod
    def from_settings(cls, s, ctx) -> RLVRReward:
        return cls(ctx.train)

    def construct(self, prompts, responses, prompt_index, step) -> RewardResult:
        right = np.asarray([[self.correct(int(i), r) for r in group] for i, group in zip(prompt_index, responses)],
                           np.float32).reshape(len(prompts), -1)
        return RewardResult(2.0 * right - 1.0,
                            {"reward/verdict_accuracy": float(right.mean()) if right.size else float("nan")})
