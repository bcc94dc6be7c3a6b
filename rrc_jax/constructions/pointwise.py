"""A pointwise GRM's mean score as the reward (how IRPO uses its judge)."""

from __future__ import annotations

import warnings

import numpy as np

from rrc_jax.constructions.base import JudgeLoad, RewardResult
from rrc_jax.constructions.judged import JudgeConstruction
from rrc_jax.errors import ConfigError


class PointwiseReward(JudgeConstruction):
    """Each response scored V times with the pointwise `reward.judge.template` (`Judge.score`), the reward the mean
    of its parsed scores. A response with no parsed score (every vote abstained) gets its group's mean reward, so it
    moves no advantage; its abstentions are counted in `judge/abstain_rate`."""

    kind = "pointwise"

    def __init__(self, judge, seed: int, *, votes: int, ctx=None, eval_votes: int = 0):
        super().__init__(judge, seed, ctx=ctx, eval_votes=eval_votes)
        if judge.template.kind != "pointwise":
            raise ConfigError(f"reward.kind='pointwise' needs a pointwise reward.judge.template, got "
                              f"{judge.template.name!r} ({judge.template.kind}); e.g. irpo_pointwise or toy_pointwise")
        self.votes = votes

    @classmethod
    def roles(cls, s) -> frozenset[str]:
        return frozenset({"grm"})  # no judged win rate (`check`)

    @classmethod
    def questions_per_prompt(cls, s) -> int:
        return s.rollout.group_size * s.judge.votes

    @classmethod
    def judge_load(cls, s) -> JudgeLoad:
        q, m = cls.questions_per_prompt(s), s.rollout.group_size  # one question a response, asked V times
        return JudgeLoad(q, q * s.judge.max_new_tokens, 0, m)

    @classmethod
    def check(cls, s) -> None:
        if s.eval.judge_votes:
            raise ConfigError(f"config.eval.judge_votes: {s.eval.judge_votes}: the judged win rate asks pairwise "
                              "questions, which a pointwise judge does not answer; set 0 (configs/pointwise.py does)")

    @classmethod
    def absolute_scale(cls, s) -> bool:
        return True

    @classmethod
    def from_settings(cls, s, ctx) -> PointwiseReward:
        return cls(**cls.judge_kwargs(s, ctx), votes=s.judge.votes)

    def construct(self, prompts, responses, prompt_index, step) -> RewardResult:
        b, m, v = len(prompts), len(responses[0]), self.votes
        scores = self.judge.score(prompts, [[o for o in g for _ in range(v)] for g in responses],
                                  template=self.judge.template,
                                  tags=[{"i": q % (m * v) // v, "vote": q % v} for q in range(b * m * v)]
                                  ).reshape(b, m, v)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a response, or a group, with no score at all
            rewards = np.nanmean(scores, axis=2)
            rewards = np.where(np.isnan(rewards), np.nanmean(rewards, axis=1, keepdims=True), rewards)
        unscored = np.isnan(rewards)  # whole groups without a score: no signal
        return RewardResult(np.nan_to_num(rewards).astype(np.float32),
                            {"reward/unscored_groups": float(unscored.all(1).sum())})
