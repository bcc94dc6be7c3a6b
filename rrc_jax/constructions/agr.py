"""AGR (the RRC paper's Algorithm 2): each response judged against its prompt's reference anchors; the reward counts
the anchors it beats (Eq. 22)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
from etils import epath

from rrc_jax import distributed
from rrc_jax.checkpoint import steps_on_disk
from rrc_jax.constructions.base import RewardResult
from rrc_jax.constructions.judged import JudgeConstruction
from rrc_jax.data.prompts import PromptSet
from rrc_jax.errors import ConfigError
from rrc_jax.rewards import agr_diagnostics, agr_rewards
from rrc_jax.rewards.win_counts import AGR_TIES, pair_outcome
from rrc_jax.rl.anchor_store import AnchorStore, prune_refreshed, refresh_step, refreshed_path
from rrc_jax.settings import field_error, one_of


@dataclasses.dataclass(frozen=True)
class AGRSettings:
    alpha: float = 0.1  # Eq. 22
    ties: str = "win"  # Algorithm 2 line 10: c_ik >= c_ki counts as a win
    n_anchors: int = 8  # n (the paper's main table: 8)
    anchors_path: str = ""  # default workdir/anchors.jsonl
    refresh_every: int = 0  # > 0: regenerate anchors from the current policy every k steps (beyond the paper)

    GROUP: ClassVar[str] = "reward.agr"  # the config group (a variant of AGR's has its own)

    def __post_init__(self):
        one_of(self.GROUP, "ties", self.ties, AGR_TIES)
        if not self.alpha > 0:
            raise field_error(self.GROUP, "alpha", f"{self.alpha} must be > 0 (the reward per win)")
        if self.n_anchors < 1:
            raise field_error(self.GROUP, "n_anchors", f"{self.n_anchors} must be >= 1")
        if self.refresh_every < 0:
            raise field_error(self.GROUP, "refresh_every", "must be >= 0 (0 = never)")


def anchor_store(s, train: PromptSet, tokenizer) -> AnchorStore:
    """The AGR anchors of a run (`s`: its settings) for its training prompts: `reward.agr.anchors_path` (default
    `workdir/anchors.jsonl`; an AGR variant's own group, `AGRSettings` with more fields, when it is the run's
    reward), sampled like the rollouts (`s.rollout`)."""
    a = s.reward_settings if isinstance(s.reward_settings, AGRSettings) else s.constructions["agr"]
    path = a.anchors_path or epath.Path(s.workdir).expanduser() / "anchors.jsonl"
    return AnchorStore(path, train, a.n_anchors, tokenizer, s.rollout.params)


class AGRReward(JudgeConstruction):
    """AGR (Algorithm 2): each response judged V times against each of its prompt's n anchors; reward = anchors
    beaten by majority x alpha (Eq. 22). Anchors come from the reference policy, generated once into
    `anchors_path` (`rrc_jax.rl.anchor_store`); with `refresh_every = k > 0` they are regenerated from the current policy
    before steps k + 1, 2k + 1, ... (beyond the paper) into versioned files under `refreshed_dir`, so that the
    anchors of any step are those of its refresh (`refresh_step`), also in a resumed run."""

    kind = "agr"
    Settings = AGRSettings
    columns = ("anchors",)  # another trainer's groups: each prompt's n anchors come with it
    per_response = True  # Eq. 22: a response's wins against its prompt's anchors

    def __init__(self, judge, seed: int, *, store: AnchorStore, votes: int, swap: bool, alpha: float,
                 ties: str, refresh_every: int, ctx, refreshed_dir: str | epath.Path = "",
                 checkpoints: str | epath.Path = "", eval_votes: int = 0, early_stop: bool = False,
                 ahead: int = 0):
        super().__init__(judge, seed, ctx=ctx, eval_votes=eval_votes)
        self.store, self.votes, self.swap, self.alpha, self.ties = store, votes, swap, alpha, ties
        self.early_stop = early_stop
        self.refresh_every, self.ahead = refresh_every, ahead  # ahead: rl.max_staleness, batches prepared early
        self.refreshed_dir = epath.Path(refreshed_dir or store.path.parent / "anchors_refreshed")
        self.checkpoints = epath.Path(checkpoints) if checkpoints else None
        if not distributed.main_value(store.path.is_file()):  # every host decides as process 0 sees the file
            store.generate(ctx.reference(), seed)  # the reference is loaded only when anchors must be made
        store.load()
        self.version = 0  # the refresh step whose anchors the store holds (0: the reference's)

    @classmethod
    def roles(cls, s) -> frozenset[str]:
        return super().roles(s) | {"reference"}  # the anchors are the reference's samples

    @classmethod
    def questions_per_prompt(cls, s) -> int:
        return s.rollout.group_size * s.reward_settings.n_anchors * s.judge.votes

    @classmethod
    def firsts_per_prompt(cls, s) -> int:
        """The responses, and with swap the anchors too."""
        return s.rollout.group_size + (s.reward_settings.n_anchors if s.judge.swap else 0)

    @classmethod
    def absolute_scale(cls, s) -> bool:
        return s.reward_settings.refresh_every == 0  # fixed anchors

    @classmethod
    def from_settings(cls, s, ctx) -> AGRReward:
        a, j = s.reward_settings, s.judge
        workdir = epath.Path(s.workdir).expanduser()
        return cls(**cls.judge_kwargs(s, ctx), store=anchor_store(s, ctx.train, ctx.tokenizer), votes=j.votes,
                   swap=j.swap, alpha=a.alpha, ties=a.ties, refresh_every=a.refresh_every,
                   refreshed_dir=workdir / "anchors_refreshed", checkpoints=workdir / "checkpoints",
                   early_stop=j.early_stop, ahead=s.pipeline.max_staleness, **cls.extra_kwargs(s))

    @classmethod
    def extra_kwargs(cls, s) -> dict:
        """What a variant of AGR needs beyond AGR's arguments (its own settings)."""
        return {}

    @classmethod
    def of_groups(cls, judge, *, votes: int, swap: bool, settings: AGRSettings):
        return lambda prompts, responses, columns: agr_result(judge, prompts, responses, columns["anchors"],
                                                              votes=votes, swap=swap, alpha=settings.alpha,
                                                              ties=settings.ties)

    def use_anchors(self, step: int) -> None:
        """Hold the anchors step `step` judges against: the reference's, or those refreshed at `refresh_step`
        (sampled from the current policy now when that is this step, read from their file when it is an earlier
        one, as after a resume)."""
        version = refresh_step(step, self.refresh_every)
        if version == self.version:
            return
        if version == 0:
            self.store.load()
        elif version == step:
            self.store.generate(self.ctx.policy, seed=step, path=refreshed_path(self.refreshed_dir, step))
            self._prune(step)
        else:
            path = refreshed_path(self.refreshed_dir, version)
            if not distributed.main_value(path.is_file()):
                raise ConfigError(f"{path} is missing: step {step} judges against the anchors refreshed before step "
                                  f"{version}, which a resumed run reads back; restore the file, or start the run over "
                                  "in another workdir")
            self.store.load(path)
        self.version = version

    def _prune(self, current: int) -> None:
        """Delete the refreshed anchors that neither this step nor a resume from a checkpoint on disk uses (a resume
        from step c prepares batch c + 1, or with `ahead` batches in flight, c + 1 + ahead)."""
        steps = steps_on_disk(self.checkpoints) if self.checkpoints is not None else []
        prune_refreshed(self.refreshed_dir, {current} | {refresh_step(c + 1 + j, self.refresh_every) for c in steps
                                                         for j in range(self.ahead + 1)})

    def prepare(self, prompts, prompt_index, step) -> dict[str, list]:
        self.use_anchors(step)
        return {"anchors": self.store[prompt_index]}

    def construct(self, prompts, responses, prompt_index, step, *, anchors) -> RewardResult:
        return agr_result(self.judge, prompts, responses, anchors, votes=self.votes,
                          swap=self.swap, alpha=self.alpha, ties=self.ties, early_stop=self.early_stop)


def agr_result(judge, prompts, responses, anchors, *, votes: int, swap: bool, alpha: float = AGRSettings.alpha,
               ties: str = AGRSettings.ties, early_stop: bool = False) -> RewardResult:
    """AGR's rewards `[B, m]` for B `prompts`, their groups of m `responses` and each prompt's n `anchors` (`AGRReward`;
    also what the trainer integrations call, `AGRReward.of_groups`). `early_stop`: a pair stops voting once its
    outcome under `ties` is decided (`Judge.pair_votes`); the rewards are full voting's."""
    wins, losses = judge.vs_anchors(prompts, responses, anchors, votes=votes, swap=swap,
                                    outcome=pair_outcome(ties, "agr") if early_stop else None)
    diag = agr_diagnostics(wins, losses, votes=votes)
    return RewardResult(np.asarray(agr_rewards(wins, losses, alpha=alpha, ties=ties)),
                        {f"judge/{k}": float(np.mean(v)) for k, v in diag.items()},
                        notes=[{"anchors": list(a)} for a in anchors])
