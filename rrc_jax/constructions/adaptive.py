"""Adaptive comparison schedules (beyond the paper): fewer judge questions than SCR's round robin or AGR's anchors,
each schedule's rounds chosen from the verdicts of the rounds before (`rrc_jax.rewards.adaptive`, whose docstring
gives the rules and what is exact).

* `active` (SCR's scale, alpha per win): at most `budget` x m(m - 1) / 2 pairs a group, asked in rounds of the most
  uncertain pairs under a Bradley-Terry fit; the reward is the win count over every pair, a pair not asked half a
  win. With a `tolerance` a pair predicted with probability >= 1 - tolerance scores its favourite's win, and a group
  stops before its budget once every pair not asked is so predicted; `judge/tolerance_stops` is the share of groups
  it stopped.
* `agr_sequential` (AGR's scale, alpha per anchor beaten): each response meets its prompt's anchors (`reward.agr`'s
  store) `first` then `step` a round, and stops once the posterior standard deviation of its wins against the anchors
  it has not met is <= `tolerance` anchors; the reward is the anchors beaten plus that posterior's mean. At most
  m x n comparisons a group; `judge/tolerance_stops` is the share of responses stopped before their last anchor.

Neither asks about two copies of one text (half a win each). Each comparison is asked `reward.judge.votes` times
and decided by its majority, stopped once decided with `reward.judge.early_stop` (exact: `Judge.pair_votes`).
`judge/comparisons` is the comparisons a group asked.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from rrc_jax.constructions.agr import AGRReward, AGRSettings
from rrc_jax.constructions.base import RewardResult
from rrc_jax.constructions.judged import JudgeConstruction
from rrc_jax.judge.matches import play
from rrc_jax.rewards.adaptive import ActiveRoundRobin, SequentialAnchors, budget_pairs, copy_classes
from rrc_jax.rewards.win_counts import SCR_TIES
from rrc_jax.settings import at_least, field_error, one_of


@dataclasses.dataclass(frozen=True)
class ActiveSettings:
    alpha: float = 0.1  # the reward per win (SCR's Eq. 16)
    ties: str = "zero"  # SCR's rule for a tied comparison
    budget: float = 0.5  # the most pairs a group asks, a fraction of the round robin's m(m - 1) / 2
    tolerance: float = 0.0  # stop a group once every pair not asked is predicted this surely (0: its budget only)

    def __post_init__(self):
        one_of("reward.active", "ties", self.ties, SCR_TIES)
        if not self.alpha > 0:
            raise field_error("reward.active", "alpha", f"{self.alpha} must be > 0 (the reward per win)")
        if not 0 < self.budget <= 1:
            raise field_error("reward.active", "budget", f"{self.budget} must be in (0, 1] (a fraction of the round "
                              "robin's pairs)")
        if not 0 <= self.tolerance < 0.5:
            raise field_error("reward.active", "tolerance", f"{self.tolerance} must be in [0, 0.5) (a pair's "
                              "predicted probability of its less likely outcome; 0: off)")


@dataclasses.dataclass(frozen=True)
class SequentialAGRSettings(AGRSettings):
    tolerance: float = 1.0  # stop a response once its wins against the anchors left have a posterior sd <= this
    first: int = 2  # anchors a response meets in the first round
    step: int = 2  # and in each later round

    GROUP: ClassVar[str] = "reward.agr_sequential"

    def __post_init__(self):
        super().__post_init__()
        if self.tolerance < 0:
            raise field_error(self.GROUP, "tolerance", f"{self.tolerance} must be >= 0 (anchors; 0: "
                              "every anchor, AGR's reward)")
        at_least(self.GROUP, "first", self.first, 1)
        at_least(self.GROUP, "step", self.step, 1)


def adaptive_metrics(duels: np.ndarray, stopped: list[float]) -> dict[str, float]:
    """`judge/comparisons` (a group's, mean) and `judge/tolerance_stops` (the share its tolerance stopped: `stopped`,
    each group's) of the duels `[B]` each group played."""
    return {"judge/comparisons": float(duels.mean()) if len(duels) else float("nan"),
            "judge/tolerance_stops": float(np.mean(stopped)) if stopped else float("nan")}


def active_result(judge, prompts, responses, *, votes: int, swap: bool, alpha: float = ActiveSettings.alpha,
                  ties: str = ActiveSettings.ties, budget: float = ActiveSettings.budget,
                  tolerance: float = ActiveSettings.tolerance, early_stop: bool = False) -> RewardResult:
    """`active`'s rewards `[B, m]` for B `prompts` and their groups of m `responses` (`ActiveReward`; also another
    trainer's groups, `ActiveReward.of_groups`)."""
    rules = [ActiveRoundRobin(len(group), budget, ties=ties, tolerance=tolerance, copies=copy_classes(group))
             for group in responses]
    duels = play(judge, prompts, responses, rules, votes=votes, swap=swap, early_stop=early_stop)
    m = len(responses[0]) if responses else 0
    rewards = np.stack([r.rewards(alpha) for r in rules]) if rules else np.zeros((0, m), np.float32)
    return RewardResult(rewards, adaptive_metrics(duels, [float(r.stopped) for r in rules]))


class ActiveReward(JudgeConstruction):
    """Uncertainty-driven rounds completed by a Bradley-Terry fit, on SCR's scale (module docstring)."""

    kind = "active"
    Settings = ActiveSettings

    def __init__(self, judge, seed: int, *, votes: int, swap: bool, alpha: float, ties: str, budget: float,
                 tolerance: float, early_stop: bool = False, ctx=None, eval_votes: int = 0):
        super().__init__(judge, seed, ctx=ctx, eval_votes=eval_votes)
        self.kwargs = dict(votes=votes, swap=swap, alpha=alpha, ties=ties, budget=budget, tolerance=tolerance,
                           early_stop=early_stop)

    @classmethod
    def questions_per_prompt(cls, s) -> int:
        """The budget's pairs x V: the most a group asks."""
        return budget_pairs(s.rollout.group_size, s.reward_settings.budget) * s.judge.votes

    @classmethod
    def absolute_scale(cls, s) -> bool:
        return False  # win counts within a group

    @classmethod
    def from_settings(cls, s, ctx) -> ActiveReward:
        j = s.judge
        return cls(**cls.judge_kwargs(s, ctx), votes=j.votes, swap=j.swap, early_stop=j.early_stop,
                   **dataclasses.asdict(s.reward_settings))

    @classmethod
    def of_groups(cls, judge, *, votes: int, swap: bool, settings: ActiveSettings):
        return lambda prompts, responses, columns: active_result(judge, prompts, responses, votes=votes, swap=swap,
                                                                 **dataclasses.asdict(settings))

    def construct(self, prompts, responses, prompt_index, step) -> RewardResult:
        return active_result(self.judge, prompts, responses, **self.kwargs)


def sequential_result(judge, prompts, responses, anchors, *, votes: int, swap: bool,
                      alpha: float = AGRSettings.alpha, ties: str = AGRSettings.ties,
                      tolerance: float = SequentialAGRSettings.tolerance, first: int = SequentialAGRSettings.first,
                      step: int = SequentialAGRSettings.step, early_stop: bool = False) -> RewardResult:
    """`agr_sequential`'s rewards `[B, m]` for B `prompts`, their groups of m `responses` and each prompt's n
    `anchors` (`SequentialAGRReward`; also another trainer's groups). A comparison shows the response first in vote
    0 when `b + i + k` is even and its judgments are traced with `i` and `anchor`, as `Judge.vs_anchors` does."""
    m = len(responses[0]) if responses else 0
    n = len(anchors[0]) if anchors else 0
    rules = [SequentialAnchors(m, n, ties=ties, tolerance=tolerance, first=first, step=step,
                               same=[[r == x for x in a] for r in group]) for group, a in zip(responses, anchors)]
    texts = [list(group) + list(a) for group, a in zip(responses, anchors)]
    duels = play(judge, prompts, texts, rules, votes=votes, swap=swap, early_stop=early_stop,
                 order=lambda b, i, j: (b + i + j - m) % 2, tag=lambda i, j: {"i": i, "anchor": j - m})
    rewards = np.stack([r.rewards(alpha) for r in rules]) if rules else np.zeros((0, m), np.float32)
    return RewardResult(rewards, adaptive_metrics(duels, [float(r.stopped.mean()) for r in rules]),
                        notes=[{"anchors": list(a)} for a in anchors])


class SequentialAGRReward(AGRReward):
    """AGR's anchors met in order, each response stopped by its tolerance (module docstring). Its config group
    `reward.agr_sequential` holds AGR's fields (the anchors, alpha, ties) and the stop's."""

    kind = "agr_sequential"
    Settings = SequentialAGRSettings

    def __init__(self, judge, seed: int, *, tolerance: float, first: int, step: int, **kwargs):
        super().__init__(judge, seed, **kwargs)
        self.stop = dict(tolerance=tolerance, first=first, step=step)

    @classmethod
    def extra_kwargs(cls, s) -> dict:
        own = s.reward_settings
        return dict(tolerance=own.tolerance, first=own.first, step=own.step)

    @classmethod
    def of_groups(cls, judge, *, votes: int, swap: bool, settings: SequentialAGRSettings):
        return lambda prompts, responses, columns: sequential_result(
            judge, prompts, responses, columns["anchors"], votes=votes, swap=swap, alpha=settings.alpha,
            ties=settings.ties, tolerance=settings.tolerance, first=settings.first, step=settings.step)

    def construct(self, prompts, responses, prompt_index, step, *, anchors) -> RewardResult:
        return sequential_result(self.judge, prompts, responses, anchors, votes=self.votes, swap=self.swap,
                                 alpha=self.alpha, ties=self.ties, early_stop=self.early_stop, **self.stop)
