"""Tournament rewards (beyond the paper): each group judged in a tournament instead of a round robin, rewarded by
its standing (`rrc_jax.rewards.tournament_rules`, whose docstring gives each format's rules).

The four formats trade judge questions for fidelity: `circular` asks m per group, `seeded_knockout` m - 1 (after a
cheap seeding signal), `swiss` R floor(m / 2), `double_elimination` 2m - 2 (or 2m - 1), against SCR's m(m - 1) / 2.
Each reward is the standing's rank reward, alpha (m - 1 - position) with tied positions averaged (`rank_rewards`):
one scale for every format, SCR's, whatever the number of duels a response played. Each duel is asked
`reward.judge.votes` times, A/B swapped across votes with `reward.judge.swap` (stopped once its majority is decided
with `reward.judge.early_stop`), and decided by the majority (a split or an abstention is a tie: half a point in
Swiss and circular, the first listed, the better seed, advances in the elimination formats). The questions and
judge tokens are counted as every judge construction counts them, and `judge/comparisons` is the duels per group.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from rrc_jax.constructions.base import RewardResult
from rrc_jax.constructions.drm import DRMReward
from rrc_jax.constructions.judged import JudgeConstruction
from rrc_jax.judge.matches import play
from rrc_jax.rewards.tournament_rules import Circular, DoubleElimination, SeededKnockout, Swiss, rank_rewards
from rrc_jax.settings import at_least, field_error, one_of

SEEDINGS = ("drm", "index")  # seeded_knockout's first signal: the DRM's scores, or none (the sampling order)


@dataclasses.dataclass(frozen=True)
class TournamentSettings:
    alpha: float = 0.1  # the reward per position (SCR's and AGR's alpha)

    def __post_init__(self):
        if not self.alpha > 0:
            raise field_error(f"reward.{self.kind}", "alpha", f"{self.alpha} must be > 0 (the reward per position)")

    kind = "tournament"


@dataclasses.dataclass(frozen=True)
class CircularSettings(TournamentSettings):
    kind = "circular"


@dataclasses.dataclass(frozen=True)
class DoubleEliminationSettings(TournamentSettings):
    kind = "double_elimination"


@dataclasses.dataclass(frozen=True)
class SwissSettings(TournamentSettings):
    rounds: int = 3  # R; at most m / 2 (ArenaRL's Swiss: about log2 m)

    kind = "swiss"

    def __post_init__(self):
        super().__post_init__()
        at_least("reward.swiss", "rounds", self.rounds, 1)


@dataclasses.dataclass(frozen=True)
class SeededKnockoutSettings(TournamentSettings):
    seed_by: str = "drm"  # `SEEDINGS`: the DRM's score of each response (one forward pass), or the sampling order

    kind = "seeded_knockout"

    def __post_init__(self):
        super().__post_init__()
        one_of("reward.seeded_knockout", "seed_by", self.seed_by, SEEDINGS)


class TournamentReward(JudgeConstruction):
    """A group's tournament (`rules`) judged by the GRM, its standing turned into rank rewards (module docstring)."""

    def __init__(self, judge, seed: int, *, votes: int, swap: bool, alpha: float, ctx=None, eval_votes: int = 0,
                 early_stop: bool = False):
        super().__init__(judge, seed, ctx=ctx, eval_votes=eval_votes)
        self.votes, self.swap, self.alpha, self.early_stop = votes, swap, alpha, early_stop

    @classmethod
    def absolute_scale(cls, s) -> bool:
        return False  # positions within a group

    @classmethod
    def duels(cls, s) -> int:
        """Duels per group (the closed form; the most for double elimination)."""
        raise NotImplementedError

    @classmethod
    def questions_per_prompt(cls, s) -> int:
        return cls.duels(s) * s.judge.votes

    @classmethod
    def from_settings(cls, s, ctx) -> TournamentReward:
        j = s.judge
        return cls(**cls.judge_kwargs(s, ctx), votes=j.votes, swap=j.swap, early_stop=j.early_stop,
                   **cls.extra_kwargs(s, ctx), **dataclasses.asdict(s.reward_settings))

    @classmethod
    def extra_kwargs(cls, s, ctx) -> dict:
        """What a format needs beyond the judge and its settings."""
        return {}

    @classmethod
    def of_groups(cls, judge, *, votes: int, swap: bool, settings: TournamentSettings):
        if getattr(settings, "seed_by", None) == "drm":  # seeded by this trainer's DRM
            return None
        reward = cls(judge, 0, votes=votes, swap=swap, **dataclasses.asdict(settings))
        return lambda prompts, responses, columns: reward.construct(prompts, responses, None, 0)

    def rules(self, prompts, responses) -> list:
        """One rule object per group."""
        raise NotImplementedError

    def construct(self, prompts, responses, prompt_index, step) -> RewardResult:
        rules = self.rules(prompts, responses)
        duels = play(self.judge, prompts, responses, rules, votes=self.votes, swap=self.swap,
                     early_stop=self.early_stop)
        rewards = np.stack([rank_rewards(r.standing(), self.alpha) for r in rules]) if rules else \
            np.zeros((0, len(responses[0]) if responses else 0), np.float32)
        return RewardResult(rewards, {"judge/comparisons": float(duels.mean()) if len(duels) else math.nan})


class CircularReward(TournamentReward):
    """Each response against the next (NeMo Gym's `circular`): m duels per group."""

    kind = "circular"
    Settings = CircularSettings

    @classmethod
    def duels(cls, s) -> int:
        m = s.rollout.group_size
        return m if m > 2 else 1

    def rules(self, prompts, responses) -> list:
        return [Circular(len(group)) for group in responses]


class SwissReward(TournamentReward):
    """R Swiss rounds (ArenaRL): each response meets R opponents of its current score, none twice."""

    kind = "swiss"
    Settings = SwissSettings

    def __init__(self, judge, seed: int, *, rounds: int, **kwargs):
        super().__init__(judge, seed, **kwargs)
        self.rounds = rounds

    @classmethod
    def duels(cls, s) -> int:
        return s.reward_settings.rounds * (s.rollout.group_size // 2)

    @classmethod
    def check(cls, s) -> None:
        m, rounds = s.rollout.group_size, s.reward_settings.rounds
        if rounds > m // 2:
            raise field_error("reward.swiss", "rounds", f"{rounds}: at most rl.group_size / 2 = {m // 2} rounds "
                              "(then every round pairs each response with a new opponent)")

    def rules(self, prompts, responses) -> list:
        return [Swiss(len(group), self.rounds) for group in responses]


class DoubleEliminationReward(TournamentReward):
    """Double elimination with a final and its reset: 2m - 2 or 2m - 1 duels per group."""

    kind = "double_elimination"
    Settings = DoubleEliminationSettings

    @classmethod
    def duels(cls, s) -> int:
        return 2 * s.rollout.group_size - 1

    def rules(self, prompts, responses) -> list:
        return [DoubleElimination(len(group)) for group in responses]


class SeededKnockoutReward(TournamentReward):
    """Single elimination in the standard seeded bracket (ArenaRL), seeded by the DRM's scores: m - 1 duels per
    group, plus one DRM forward pass per response."""

    kind = "seeded_knockout"
    Settings = SeededKnockoutSettings

    def __init__(self, judge, seed: int, *, seed_by: str, seeder: DRMReward | None = None, **kwargs):
        super().__init__(judge, seed, **kwargs)
        self.seed_by, self.seeder = seed_by, seeder

    @classmethod
    def roles(cls, s) -> frozenset[str]:
        return super().roles(s) | ({"drm"} if s.reward_settings.seed_by == "drm" else set())

    @classmethod
    def duels(cls, s) -> int:
        return s.rollout.group_size - 1

    @classmethod
    def extra_kwargs(cls, s, ctx) -> dict:
        return {"seeder": DRMReward.from_settings(s, ctx) if s.reward_settings.seed_by == "drm" else None}

    def rules(self, prompts, responses) -> list:
        m = len(responses[0]) if responses else 0
        if self.seeder is None:
            seeds = np.tile(-np.arange(m, dtype=np.float64), (len(responses), 1))  # the sampling order
        else:
            seeds = self.seeder.scores([p for p in prompts for _ in range(m)],
                                       [o for group in responses for o in group]).reshape(len(responses), m)
        return [SeededKnockout(m, s) for s in seeds]
