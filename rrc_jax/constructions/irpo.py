"""IRPO (its Section 3): the policy is a pointwise judge, rewarded by its scores of a preference's chosen group
against the rejected group's (intergroup, Eq. 5-6), plus the format reward."""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np

from rrc_jax import distributed
from rrc_jax.constructions.base import Construction, RewardResult, quality_metrics
from rrc_jax.constructions.rlvr import require_questions
from rrc_jax.errors import ConfigError
from rrc_jax.judge.templates import JudgeTemplate, get_template
from rrc_jax.judge.verdicts import parse_score
from rrc_jax.rewards import auc_rewards, format_reward, preference_strength, rule_rewards
from rrc_jax.settings import field_error, one_of

RULES = ("median", "mean", "interval", "auc", "strength")


@dataclasses.dataclass(frozen=True)
class IRPOSettings:
    # the intergroup reward of a pointwise judge's scores: 'median' (IRPO's default), 'mean', 'interval' (95% CI
    # bounds), 'auc' or 'strength' (Eq. 5-6); plus the format reward (-0.5)
    rule: str = "median"

    def __post_init__(self):
        one_of("reward.irpo", "rule", self.rule, RULES)


def chosen_scored_higher(scores) -> np.ndarray:
    """Per pair of a paired set's scores `[2P]` (chosen, rejected, chosen, ...; NaN where none): 1 when the chosen
    response scores higher, 0 when lower, 0.5 on a tie or a missing score. `[P]` float."""
    s = np.asarray(scores, np.float64).reshape(-1, 2)
    return np.where(np.isnan(s).any(axis=1) | (s[:, 0] == s[:, 1]), 0.5, (s[:, 0] > s[:, 1]).astype(np.float64))


def parsed_scores(texts) -> np.ndarray:
    """The score of each judgment `[N]` float64 (NaN where none parses)."""
    return np.array([math.nan if (x := parse_score(t)) is None else x for t in texts], np.float64)


class IRPOReward(Construction):
    """Each step holds whole pairs of questions (a preference's chosen response, then its rejected one:
    `PromptSet.paired`); each of the G scores of the chosen group is rewarded against the rejected group's scores
    and vice versa (`reward.irpo.rule`: `rrc_jax.rewards.irpo`), plus the format reward (-0.5 for a judgment
    without a parseable score, or without its `<critique>` block when the template asks for one). Group advantages
    stay within each group. Held out: the share of pairs whose chosen response the greedy judgment scores higher."""

    kind = "irpo"
    Settings = IRPOSettings
    questions = "pointwise"

    def __init__(self, rule: str, template: JudgeTemplate | str):
        one_of("reward.irpo", "rule", rule, RULES)
        self.rule = rule
        self.critique = "<critique>" in get_template(template).item

    @classmethod
    def absolute_scale(cls, s) -> bool:
        return False  # scores against the paired group's

    @classmethod
    def check(cls, s) -> None:
        require_questions(cls.kind, s)
        if s.rollout.prompts_per_step % 2:
            raise field_error("rl", "prompts_per_step", f"{s.rollout.prompts_per_step}: IRPO asks about a "
                              "preference's chosen and rejected responses in the same step, so it must be even")

    @classmethod
    def from_settings(cls, s, ctx) -> IRPOReward:
        if not ctx.train.paired:
            raise ConfigError("reward.kind='irpo' needs pointwise judge questions in pairs: set data.format")
        return cls(s.reward_settings.rule, s.judge.template)

    def intergroup(self, s_c, s_r) -> tuple[np.ndarray, np.ndarray]:
        """(r_c, r_r) `[P, G]` of the chosen and rejected groups' scores."""
        if self.rule == "auc":
            r = auc_rewards(s_c, s_r)
        elif self.rule == "strength":
            r = preference_strength(s_c, s_r)
        else:
            r = rule_rewards(s_c, s_r, self.rule)
        return tuple(np.asarray(x, np.float32) for x in r)

    def construct(self, prompts, responses, prompt_index, step) -> RewardResult:
        b, g = len(prompts), len(responses[0])
        index = np.asarray(prompt_index)
        if b % 2 or (index[0::2] % 2).any() or (index[1::2] != index[0::2] + 1).any():
            raise ValueError("irpo: the step's prompts must be whole pairs (2k, 2k + 1) of a paired prompt set")
        scores = np.stack([parsed_scores(group) for group in responses]).astype(np.float32)
        ok = np.array([[parse_score(t) is not None and (not self.critique or "</critique>" in t) for t in group]
                       for group in responses])
        r_c, r_r = self.intergroup(scores[0::2], scores[1::2])
        rewards = np.empty((b, g), np.float32)
        rewards[0::2], rewards[1::2] = r_c, r_r
        rewards += np.asarray(format_reward(ok))
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a group with no score at all
            means, spread = np.nanmean(scores, axis=1), np.nanstd(scores, axis=1)
        return RewardResult(rewards, {
            "reward/pair_accuracy": float(chosen_scored_higher(means).mean()) if b else math.nan,
            "reward/score_std": float(np.nanmean(spread)) if np.isfinite(spread).any() else math.nan,
            "reward/format_ok": float(ok.mean()) if ok.size else math.nan})

    def evaluate(self, held_out, index, prompts, texts, step) -> dict[str, float]:
        """The greedy judgments' pair accuracy (`chosen_scored_higher`) as `eval/oracle_quality` (`index` holds whole
        pairs on each host)."""
        return quality_metrics(distributed.host_gather(chosen_scored_higher(parsed_scores(texts))))
