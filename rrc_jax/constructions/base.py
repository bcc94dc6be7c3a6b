"""What every reward construction is: a `Construction` that owns its kind, and the `RewardResult` it returns.

A construction declares, at class level, everything the rest of the package asks about a reward kind, so that no
other module lists kinds (docs/design.md, "Reward constructions"). Its hooks read the run's settings `s`, parsed
once by `rrc_jax.config.validate` (a `TrainerSettings`: `s.rollout`, `s.judge`, `s.eval`, `s.reward_settings`,
...), never the config itself:

* `kind` and `Settings`: its name in `reward.kind` and the frozen dataclass of its config group `reward.<kind>`,
  whose defaults are the config's and whose `__post_init__` validates the fields (parsed: `s.reward_settings`);
* `roles(s)`: the models it loads beyond the policy (of `rrc_jax.sharding.FROZEN_ROLES`);
* `judge_load(s)`: the judge questions and judge tokens per prompt of a step (the planner's inputs);
* `questions`: which judge questions its prompts are when `data.format` is set (None: it takes plain prompts);
* `check(s)`: the rules across groups when it is the run's reward;
* `absolute_scale(s)`: whether its rewards keep one scale across steps (the study's reading of reward/mean);
  `baseline`: whether it is one of the RRC paper's baselines (PRC, DRM);
* `of_groups(judge, ...)` and `columns`: how another trainer's groups are rewarded with it
  (`rrc_jax.integrations.groups.GroupRewards`), from the texts and the per-prompt `columns` it reads; None when its
  rewards need this trainer (a policy sampler, a DRM, a store of anchors); `per_response`: whether a response's
  reward depends on its group (False) or on it alone (AGR's anchors beaten, PRC's P(A) against o_ref).

An instance is called once per step and returns a `RewardResult`; `evaluate` gives its held-out metrics. It is
built by `from_settings` from the run's settings and its `RewardContext` (`rrc_jax.constructions.context`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar, NamedTuple

import numpy as np

from rrc_jax import distributed
from rrc_jax.data.prompts import PromptSet
from rrc_jax.errors import ConfigError
from rrc_jax.judge.judge import check_groups



@dataclasses.dataclass(frozen=True)
class RewardResult:
    """What a construction returns for one step's B prompts and their groups of m responses.

    rewards: `[B, m]` float32. metrics: scalars logged as they are (`judge/*`, `reward/*`, its own names).
    judgments: with `trace=True`, every judgment behind the rewards, each with `prompt` (its index b) and the
      response indices it concerns (`rrc_jax.rl.samples`). notes: `[B]` (or empty) dicts merged into each prompt's
      sample record (what its responses were compared against: PRC's reference, AGR's anchors).
    """

    rewards: np.ndarray
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    judgments: list[dict] = dataclasses.field(default_factory=list)
    notes: list[dict] = dataclasses.field(default_factory=list)


# How another trainer's groups are rewarded (`Construction.of_groups`): `(prompts [B], responses [B][m], columns)` ->
# a `RewardResult` of `[B, m]` rewards, `columns` holding each prompt's `Construction.columns` (`{name: [B] values}`).
GroupReward = Callable[[Sequence[str], Sequence[Sequence[str]], Mapping[str, Sequence]], "RewardResult"]


class JudgeLoad(NamedTuple):
    """Judge work per prompt of a step: `questions` asked, at most `tokens` generated to answer them, and how much
    of their text the judge's prefix tree (`rrc_jax.inference.question_tree`) prefills once: `firsts` texts shown
    first (0: none shared, as a pointwise judge's), `distinct` different questions (the rest are votes asked again).
    """

    questions: int
    tokens: int
    firsts: int = 0
    distinct: int = 0

    @property
    def leaves(self) -> int:
        """Different questions (`distinct`, or every question when not given)."""
        return self.distinct or self.questions


def group_sizes(prompts: Sequence[str], responses: Sequence[Sequence[str]]) -> tuple[int, int]:
    """(B, m) of B prompts and their B groups of m responses."""
    if len(prompts) != len(responses):
        raise ValueError(f"rewards need one group of responses per prompt; got {len(prompts)} prompts and "
                         f"{len(responses)} groups")
    return len(prompts), check_groups(responses, "rewards")


def quality_metrics(q: np.ndarray) -> dict[str, float]:
    """`eval/oracle_quality` and its standard error from every host's per-response quality `[N]`."""
    se = float(q.std(ddof=1) / np.sqrt(len(q))) if len(q) > 1 else 0.0
    return {"eval/oracle_quality": float(q.mean()), "eval/oracle_quality_se": se}


def step_seed(seed: int, step: int, stream: int = 0) -> int:
    """A seed for random stream `stream` of step `step` (0: rewards, 1: evaluation): a resumed run draws what an
    uninterrupted one does."""
    return int(np.random.SeedSequence([seed, step, stream]).generate_state(1)[0])


class Construction:
    """A reward construction (module docstring). Subclasses set the class attributes they need and implement
    `construct`; a user's construction subclasses this too and is named `reward.kind='MODULE:NAME'`."""

    kind: ClassVar[str] = ""
    Settings: ClassVar[type | None] = None  # the frozen dataclass of config group `reward.<kind>`
    questions: ClassVar[str | None] = None  # 'pairwise' | 'pointwise': the judge questions it trains on
    baseline: ClassVar[bool] = False  # one of the RRC paper's baselines (the study plots them together)
    columns: ClassVar[tuple[str, ...]] = ()  # what `of_groups` reads per prompt besides the texts
    # whether a response's reward depends on it and its prompt's columns alone, not on the rest of its group (a
    # reward service then judges each rollout as it arrives)
    per_response: ClassVar[bool] = False

    @classmethod
    def roles(cls, s) -> frozenset[str]:
        """The models it needs beyond the policy (`FROZEN_ROLES`), its held-out evaluation's included."""
        return frozenset()

    @classmethod
    def judge_load(cls, s) -> JudgeLoad:
        return JudgeLoad(0, 0)

    @classmethod
    def check(cls, s) -> None:
        """A `ConfigError` for a setting elsewhere in `s` that contradicts this reward."""

    @classmethod
    def absolute_scale(cls, s) -> bool | None:
        """Whether the rewards keep one scale across steps, so that reward/mean rising means the reward model rates
        the policy higher (None: unknown)."""
        return None

    @classmethod
    def preflight(cls, s) -> None:
        """What it checks outside this process before any model loads (a reward service answering with the run's
        recipe: `rrc_jax.constructions.served`); a one-line `ConfigError` when it fails. Default: nothing."""

    @classmethod
    def from_settings(cls, s, ctx) -> Construction:
        """The construction of a run (`s`: its settings; `ctx`: its `RewardContext`)."""
        return cls()

    @classmethod
    def of_groups(cls, judge, *, votes: int, swap: bool, settings) -> GroupReward | None:
        """Its rewards of another trainer's groups (module docstring), asking `judge` `votes` times per pair (A/B
        swapped across votes with `swap`), with `settings` (its `Settings`); None: it rewards in this trainer only."""
        return None

    def prepare(self, prompts: Sequence[str], prompt_index: np.ndarray, step: int) -> dict[str, list]:
        """What its rewards of step `step` read beside the responses that the policy or the construction's own
        state gives (AGR's anchors, PRC's o_ref): per-prompt JSON values `[B]` by `construct`'s keyword names.
        The trainer calls it where the step's rollouts are sampled, so that rewards judged later
        (`rl.max_staleness > 0`, `rrc_jax.rl.pipeline`) read what their rollouts' own moment gave, and a checkpoint
        keeps it with them. Default: nothing."""
        return {}

    def construct(self, prompts: Sequence[str], responses: Sequence[Sequence[str]], prompt_index: np.ndarray,
                  step: int) -> RewardResult:
        raise NotImplementedError

    def __call__(self, prompts: Sequence[str], responses: Sequence[Sequence[str]], prompt_index: np.ndarray,
                 step: int, *, trace: bool = False, inputs: dict[str, list] | None = None) -> RewardResult:
        """Rewards `[B, m]` of B prompts (`prompt_index [B]` into the training `PromptSet`) and their groups of m
        responses at trainer step `step` (1-based); with `trace`, the judgments behind them. `inputs`: what
        `prepare` gave for them (None: prepared now)."""
        b, m = group_sizes(prompts, responses)
        inputs = self.prepare(prompts, prompt_index, step) if inputs is None else inputs
        result = self.construct(prompts, responses, prompt_index, step, **inputs)
        try:
            rewards = np.asarray(result.rewards, np.float32)
            got = f"shape {rewards.shape}"
        except (TypeError, ValueError):  # ragged rows, or not numbers
            rewards, got = None, f"a {type(result.rewards).__name__} that is no array of numbers"
        if rewards is None or rewards.shape != (b, m):
            wrong = f"returned rewards of {got}; it must return [B, m] = {(b, m)} (B prompts, m responses each)"
            if self.plugin_kind():  # the user's mistake, not a bug of rrc-jax's
                raise ConfigError(f"config.reward.kind={self.plugin_kind()!r}: the plug-in {wrong}")
            raise ValueError(f"reward {self.kind or type(self).__name__} {wrong}")
        return dataclasses.replace(result, rewards=rewards)

    def plugin_kind(self) -> str:
        """`reward.kind`'s MODULE:NAME of a user's construction (its class's, defined outside rrc_jax), "" for one
        of rrc-jax's: what a user's construction returns wrong is a one-line `ConfigError` naming it."""
        cls = type(self)
        return "" if cls.__module__.partition(".")[0] == "rrc_jax" else f"{cls.__module__}:{cls.__qualname__}"

    def evaluate(self, held_out: PromptSet, index: np.ndarray, prompts: Sequence[str], texts: Sequence[str],
                 step: int) -> dict[str, float]:
        """Held-out metrics of the policy's greedy `texts [N]` to this host's held-out `prompts` (`index` into
        `held_out`): the oracle's quality where the prompt set has one. Every host calls it (it gathers)."""
        if held_out.oracle is None:
            return {}
        q = np.array([held_out.oracle(int(i), t) for i, t in zip(index, texts)], np.float64)
        return quality_metrics(distributed.host_gather(q))
