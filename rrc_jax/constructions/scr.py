"""SCR (the RRC paper's Algorithm 1): win counting in a round robin over each GRPO group, or CARA's Kemeny order
(Eq. 19-21), or (beyond the paper) an adaptive ordering (merge sort, knockout)."""

from __future__ import annotations

import dataclasses

import numpy as np

from rrc_jax.constructions.base import RewardResult
from rrc_jax.constructions.judged import JudgeConstruction
from rrc_jax.judge.matches import knockout, merge_sort
from rrc_jax.rewards import cara_rewards, scr_diagnostics, scr_rewards
from rrc_jax.rewards.kemeny import CARA_METHODS, MAX_EXACT_GROUP
from rrc_jax.rewards.win_counts import SCR_TIES, pair_outcome
from rrc_jax.settings import field_error, one_of

ORDERINGS = ("round_robin", "merge_sort", "knockout")  # how the group is ordered (`reward.scr.ordering`)


@dataclasses.dataclass(frozen=True)
class SCRSettings:
    alpha: float = 0.1  # Eq. 16 (the paper: 0.1)
    ties: str = "zero"  # Eq. 16: a strict majority wins; 'half' gives a tie 0.5
    cara: bool = False  # Kemeny aggregation (Eq. 21)
    cara_method: str = "greedy"  # Algorithm 1's greedy, or 'exact' (m <= 16)
    ordering: str = "round_robin"  # or 'merge_sort' / 'knockout': adaptive, fewer questions (Eq. 21)

    def __post_init__(self):
        one_of("reward.scr", "ties", self.ties, SCR_TIES)
        one_of("reward.scr", "cara_method", self.cara_method, CARA_METHODS)
        one_of("reward.scr", "ordering", self.ordering, ORDERINGS)
        if self.cara and self.ordering != "round_robin":
            raise field_error("reward.scr", "cara", f"CARA aggregates a round robin's votes, and ordering="
                              f"{self.ordering!r} orders the group itself: use one or the other")
        if not self.alpha > 0:
            raise field_error("reward.scr", "alpha", f"{self.alpha} must be > 0 (the reward per win)")


class SCRReward(JudgeConstruction):
    """SCR (Algorithm 1): every pair of a group judged V times; reward = majority win count x alpha (Eq. 16), or, with
    `cara`, alpha x the position in the Kemeny-aggregated order (Eq. 21). With `ordering` 'merge_sort' or 'knockout'
    (beyond the paper) the group is ordered adaptively (a merge sort or a knockout bracket) instead of by a round
    robin (fewer questions) and rewarded by Eq. 21 on that order."""

    kind = "scr"
    Settings = SCRSettings

    def __init__(self, judge, seed: int, *, votes: int, swap: bool, alpha: float, ties: str, cara: bool,
                 cara_method: str, ordering: str = "round_robin", early_stop: bool = False, ctx=None,
                 eval_votes: int = 0):
        super().__init__(judge, seed, ctx=ctx, eval_votes=eval_votes)
        one_of("reward.scr", "ordering", ordering, ORDERINGS)
        self.votes, self.swap, self.alpha, self.ties, self.cara, self.cara_method = (
            votes, swap, alpha, ties, cara, cara_method)
        self.ordering, self.early_stop = ordering, early_stop

    @classmethod
    def questions_per_prompt(cls, s) -> int:
        """A round robin's m(m-1)/2 pairs x V (the adaptive orderings ask fewer; this is their bound's order)."""
        m = s.rollout.group_size
        return m * (m - 1) // 2 * s.judge.votes

    @classmethod
    def check(cls, s) -> None:
        own, m = s.reward_settings, s.rollout.group_size
        if own.cara and own.cara_method == "exact" and m > MAX_EXACT_GROUP:
            raise field_error("reward.scr", "cara_method", f"'exact' Kemeny needs rl.group_size <= "
                              f"{MAX_EXACT_GROUP}, got {m}")

    @classmethod
    def absolute_scale(cls, s) -> bool:
        return False  # win counts within a group

    @classmethod
    def from_settings(cls, s, ctx) -> SCRReward:
        own, j = s.reward_settings, s.judge
        return cls(**cls.judge_kwargs(s, ctx), votes=j.votes, swap=j.swap, alpha=own.alpha, ties=own.ties,
                   cara=own.cara, cara_method=own.cara_method, ordering=own.ordering, early_stop=j.early_stop)

    @classmethod
    def of_groups(cls, judge, *, votes: int, swap: bool, settings: SCRSettings):
        return lambda prompts, responses, columns: scr_result(
            judge, prompts, responses, votes=votes, swap=swap, alpha=settings.alpha, ties=settings.ties,
            cara=settings.cara, cara_method=settings.cara_method, ordering=settings.ordering)

    def construct(self, prompts, responses, prompt_index, step) -> RewardResult:
        return scr_result(self.judge, prompts, responses, votes=self.votes, swap=self.swap, alpha=self.alpha,
                          ties=self.ties, cara=self.cara, cara_method=self.cara_method, ordering=self.ordering,
                          early_stop=self.early_stop)


def scr_result(judge, prompts, responses, *, votes: int, swap: bool, alpha: float = SCRSettings.alpha,
               ties: str = SCRSettings.ties, cara: bool = False, cara_method: str = SCRSettings.cara_method,
               ordering: str = "round_robin", early_stop: bool = False) -> RewardResult:
    """SCR's rewards `[B, m]` for B `prompts` and their groups of m `responses` (`SCRReward`; also what the trainer
    integrations call, `SCRReward.of_groups`). `early_stop`: a round robin's pairs stop voting once their majority
    is decided (`Judge.pair_votes`); the rewards are full voting's, the counts of a decided pair smaller. CARA reads
    the counts (Kemeny weights) and the adaptive orderings their own duels: both vote in full."""
    if ordering != "round_robin":
        play = merge_sort if ordering == "merge_sort" else knockout
        t = play(judge, prompts, responses, votes=votes, swap=swap)
        return RewardResult((alpha * t.rewards).astype(np.float32), {"judge/comparisons": float(t.queries.mean())})
    counts = judge.round_robin(prompts, responses, votes=votes, swap=swap,
                               outcome=pair_outcome(ties) if early_stop and not cara else None)
    diag = scr_diagnostics(counts, votes=votes)
    rewards = (cara_rewards(counts, alpha=alpha, method=cara_method) if cara
               else np.asarray(scr_rewards(counts, alpha=alpha, ties=ties)))
    return RewardResult(rewards, {f"judge/{k}": float(np.mean(v)) for k, v in diag.items()})
