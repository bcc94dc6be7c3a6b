"""Reward functions: the seam between the trainer and every reward construction.

A `RewardFn` is called once per step with the step's prompts and their sampled responses and returns the rewards
`[B, m]` and its own metrics. The trainer knows nothing else about it. Each built-in kind is one class that owns
its state (its judge, anchors, cached references, its own tokenizer) and reads its own config subgroup:

| kind  | class        | reward                                                        | config            |
| ----- | ------------ | ------------------------------------------------------------- | ----------------- |
| `drm` | `DRMReward`  | the DRM's value head on prompt + response (Eq. 1)             | `reward.drm`      |
| `prc` | `PRCReward`  | the judge's P(A) against a greedy reference response (Eq. 5)  | `reward.prc`      |
| `scr` | `SCRReward`  | win counts of a round robin (Eq. 16), or CARA (Eq. 21)         | `reward.scr`      |
| `agr` | `AGRReward`  | anchors beaten (Eq. 22, Algorithm 2)                          | `reward.agr`      |
| `pointwise` | `PointwiseReward` | a pointwise GRM's mean score over its votes (IRPO's judge)  | `reward.judge`    |
| `rlvr`| `RLVRReward` | +1 for the judge question's correct verdict, else -1 (RM-R1 Eq. 8) | `data.format` |
| `irpo`| `IRPOReward` | a pointwise score against the paired group's (IRPO intergroup) + format | `reward.irpo` |

The judge kinds share `reward.judge` (template, votes, swap, sampling); while the trainer traces a step
(`Judge.trace`), their judgments are recorded with the response indices they concern, and `sample_notes[b]` holds
what prompt b's responses were compared against (PRC's reference, AGR's anchors). A user's reward plugs in without editing
the package: `reward.kind = "MODULE:NAME"` imports NAME from MODULE (on `PYTHONPATH`). NAME may be

- a plain function `f(prompts: list[str], responses: list[list[str]])` returning rewards `[B, m]` (array-like) or
  `(rewards, metrics)`;
- a function with the full `RewardFn` signature `(prompts, responses, prompt_index, step)`;
- a class: constructed as `NAME.from_config(config, context)` when it has that classmethod, else `NAME()`.

Built-in kinds are found in `REWARD_FNS` (`register` adds one).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Protocol

import jax
import numpy as np
from etils import epath
from flax import nnx

from rrc_jax import distributed
from rrc_jax.checkpoint import steps_on_disk
from rrc_jax.config import TOURNAMENTS, is_plugin
from rrc_jax.data.batches import pad_sequences, round_up
from rrc_jax.data.prompts import PromptSet, prompt_tokens
from rrc_jax.errors import ConfigError
from rrc_jax.inference.factory import make_sampler
from rrc_jax.inference.sampler import Sampler, SamplingParams, response_texts
from rrc_jax.judge import Judge, JudgeConfig
from rrc_jax.judge.judge import check_groups
from rrc_jax.judge.tournaments import knockout, merge_sort
from rrc_jax.judge.prompts import JudgeTemplate, get_template
from rrc_jax.judge.verdicts import parse_score
from rrc_jax.models import Decoder
from rrc_jax.rewards import (agr_diagnostics, agr_rewards, auc_rewards, cara_rewards, format_reward, prc_rewards,
                             preference_strength, rule_rewards, scr_diagnostics, scr_rewards)
from rrc_jax.rl.anchors import AnchorStore, prune_refreshed, refresh_step, refreshed_path
from rrc_jax.rl.roles import Roles
from rrc_jax.rm.examples import scored_ids
from rrc_jax.sharding import host_row_multiple, host_rows, mesh_of, put_rows


PRC_BINS = 10  # `prc/p_bin{k}`: the share of a step's P(A) in [k / 10, (k + 1) / 10)


class RewardFn(Protocol):
    """`reward_fn(prompts [B], responses [B][m], prompt_index [B], step) -> (rewards [B, m], metrics)`.

    `prompt_index` indexes the training `PromptSet` (for cached per-prompt state such as anchors); `step` is the
    trainer's step (1-based), for anything drawn at random or refreshed on a schedule."""

    def __call__(self, prompts: Sequence[str], responses: Sequence[Sequence[str]], prompt_index: np.ndarray,
                 step: int) -> tuple[np.ndarray, dict[str, float]]: ...


def step_seed(seed: int, step: int, stream: int = 0) -> int:
    """A seed for random stream `stream` of step `step` (0: rewards, 1: evaluation): a resumed run draws what an
    uninterrupted one does."""
    return int(np.random.SeedSequence([seed, step, stream]).generate_state(1)[0])


def rollout_params(rl) -> SamplingParams:
    """How the policy samples rollouts (and AGR anchors): `rl.temperature`, `rl.top_p`, `rl.max_new_tokens`."""
    return SamplingParams(rl.temperature, 0, rl.top_p, max_new_tokens=rl.max_new_tokens)


def rollout_batch(rl) -> int:
    """Rows per model call of the policy's and the reference's samplers: a step's rollouts, at least 256."""
    return max(256, rl.prompts_per_step * rl.group_size)


class RewardContext:
    """What a reward construction may use. The policy sampler holds the model being trained; the reference and the
    judge are built on first use (a run that never asks for them never loads them)."""

    def __init__(self, config, roles: Roles, policy: Sampler, tokenizer, train: PromptSet):
        self.config, self.roles, self.policy, self.tokenizer, self.train = config, roles, policy, tokenizer, train
        self.rollout_params = rollout_params(config.rl)
        self.greedy_params = SamplingParams(0.0, max_new_tokens=config.rl.max_new_tokens)
        self._reference: Sampler | None = None
        self._judge: Judge | None = None

    def reference(self) -> Sampler:
        """A sampler of the frozen reference policy (`models.reference`, by default the initial policy)."""
        if self._reference is None:
            self._reference = make_sampler(self.roles.model("reference"), self.roles.tokenizer("reference"),
                                           engine=self.config.inference.engine,
                                           max_batch=rollout_batch(self.config.rl))
        return self._reference

    @property
    def has_judge(self) -> bool:
        return self._judge is not None

    def judge(self) -> Judge:
        """The GRM as a judge (`reward.judge`), shared by the reward and the judged evaluation."""
        if self._judge is None:
            j = self.config.reward.judge
            grm, tok = self.roles.model("grm"), self.roles.tokenizer("grm")
            sampler = make_sampler(grm, tok, engine=self.config.inference.engine, max_batch=j.max_batch)
            self._judge = Judge(sampler, tok, JudgeConfig(
                template=j.template, max_new_tokens=j.max_new_tokens, temperature=j.temperature,
                seed=self.config.seed))
        return self._judge

    def greedy_texts(self, sampler: Sampler, prompts: Sequence[str], prompt_set: PromptSet | None = None
                     ) -> list[str]:
        """The greedy response of `sampler`'s model to each of `prompts` (texts of `prompt_set`, default the
        training prompts), rendered as the policy sees them (`prompt_tokens`)."""
        ids = [prompt_tokens(self.tokenizer, prompt_set or self.train, p) for p in prompts]
        return response_texts(self.tokenizer, sampler.generate(ids, 1, self.greedy_params))


REWARD_FNS: dict[str, type] = {}


def register(kind: str) -> Callable[[type], type]:
    """Class decorator: make a RewardFn class (with `from_config(config, context)`) the reward of `kind`."""
    def add(cls: type) -> type:
        REWARD_FNS[kind] = cls
        return cls
    return add


def _group_sizes(prompts, responses) -> tuple[int, int]:
    """(B, m) of B prompts and their B groups of m responses."""
    if len(prompts) != len(responses):
        raise ValueError(f"rewards need one group of responses per prompt; got {len(prompts)} prompts and "
                         f"{len(responses)} groups")
    return len(prompts), check_groups(responses, "rewards")


# ------------------------------------------------------------------------------------------------------------
# DRM (Eq. 1)
# ------------------------------------------------------------------------------------------------------------

@jax.jit
def _values(graphdef, state, ids, mask):
    return nnx.merge(graphdef, state).values(ids, mask)


@register("drm")
class DRMReward:
    """The discriminative reward model's score of `prompt + response`, rendered with the DRM's *own* tokenizer and
    chat template (`rrc_jax.rm.examples.scored_ids`): a DRM need not share the policy's vocabulary."""

    def __init__(self, model: Decoder, tokenizer, max_batch: int = 256):
        if not model.cfg.value_head:
            raise ConfigError("the DRM has no value head (score.weight); give a reward model trained with Eq. 1")
        self.model, self.tokenizer, self.max_batch = model, tokenizer, max_batch

    @classmethod
    def from_config(cls, config, ctx: RewardContext) -> DRMReward:
        return cls(ctx.roles.model("drm"), ctx.roles.tokenizer("drm"), config.reward.drm.max_batch)

    def scores(self, prompts: Sequence[str], responses: Sequence[str]) -> np.ndarray:
        """Value-head scores `[K]` float32 of K (prompt, response) pairs."""
        rows = [scored_ids(self.tokenizer, p, o) for p, o in zip(prompts, responses)]
        pad = self.model.cfg.pad_token_id or 0
        mesh = mesh_of(self.model)
        graphdef, state = nnx.split(self.model)
        out = np.zeros(len(rows), np.float32)
        per_host = max(1, self.max_batch // jax.process_count())
        for chunk, n, t in distributed.agreed_chunks([len(r) for r in rows], per_host):  # collective on hosts
            n = round_up(n, host_row_multiple(mesh))
            ids, mask = put_rows(pad_sequences([rows[i] for i in chunk] + [[pad]] * (n - len(chunk)), t, pad,
                                               "right"), mesh)
            out[chunk] = host_rows(_values(graphdef, state, ids, mask), mesh)[:len(chunk)]
        return out

    def __call__(self, prompts, responses, prompt_index, step):
        b, m = _group_sizes(prompts, responses)
        return self.scores([p for p in prompts for _ in range(m)], [o for g in responses for o in g]).reshape(b, m), {}


# ------------------------------------------------------------------------------------------------------------
# The judge kinds
# ------------------------------------------------------------------------------------------------------------

class JudgeReward:
    """Common to the rewards that ask the GRM: the judge is reseeded from the step (exact resume) and its counters
    are reported as `judge/*` metrics of every call."""

    def __init__(self, judge: Judge, seed: int):
        self.judge, self.seed = judge, seed
        self.sample_notes: list[dict] = []  # per prompt of the last call: what its responses were compared against

    def start(self, step: int) -> None:
        self.judge.reset_metrics()
        self.judge.reseed(step_seed(self.seed, step))

    def judge_metrics(self) -> dict[str, float]:
        s = self.judge.summary()
        return {"judge/questions": s["questions"], "judge/tokens": s["judge_tokens"],
                "judge/abstain_rate": s["abstain_rate"], "judge/position_consistency": s["position_consistency"],
                "judge/prefill_tokens_saved": s["prefill_tokens_saved"], "judge/too_long": s["too_long"]}


@register("prc")
class PRCReward(JudgeReward):
    """PRC (Eq. 5): `r(x, o) = P(A)` with o shown as A against the reference response o_ref as B.

    `reference='current'` (default, as in the RRC paper's section 2.3): o_ref is the greedy response of the policy being
    trained, regenerated each step. `reference='initial'`: the frozen reference policy's greedy response,
    generated once per prompt and cached. `think=False` reads P(A) directly after the judge template's
    direct-verdict variant (PRC "removing thinking")."""

    def __init__(self, judge: Judge, seed: int, *, think: bool, reference: str, ctx: RewardContext):
        super().__init__(judge, seed)
        if reference not in ("current", "initial"):
            raise ConfigError(f"config.reward.prc.reference: {reference!r}; use 'current' or 'initial'")
        self.think, self.reference, self.ctx = think, reference, ctx
        # the template P(A) is read after: a ConfigError now, not at step 1, when there is no direct variant
        self.template = judge.template if think else judge.direct_template
        self._initial: dict[int, str] = {}

    @classmethod
    def from_config(cls, config, ctx: RewardContext) -> PRCReward:
        p = config.reward.prc
        return cls(ctx.judge(), config.seed, think=p.think, reference=p.reference, ctx=ctx)

    def references(self, prompts: Sequence[str], prompt_index: np.ndarray) -> list[str]:
        """o_ref `[B]` of the step's prompts."""
        if self.reference == "current":
            return self.ctx.greedy_texts(self.ctx.policy, prompts)
        todo = sorted({int(i) for i in prompt_index} - self._initial.keys())
        if todo:
            texts = self.ctx.greedy_texts(self.ctx.reference(), [self.ctx.train.texts[i] for i in todo])
            self._initial.update(zip(todo, texts))
        return [self._initial[int(i)] for i in prompt_index]

    def __call__(self, prompts, responses, prompt_index, step):
        b, m = _group_sizes(prompts, responses)
        refs = self.references(prompts, prompt_index)
        self.start(step)
        self.sample_notes = [{"reference": r} for r in refs]
        p_a = self.judge.preference_prob([p for p in prompts for _ in range(m)], [o for g in responses for o in g],
                                         [r for r in refs for _ in range(m)], think=self.think,
                                         tags=[{"prompt": q // m, "i": q % m} for q in range(b * m)])
        metrics = {"reward/prc_saturation": float(np.mean((p_a <= 0.1) | (p_a >= 0.9))), **self.judge_metrics()}
        hist = np.histogram(p_a, bins=PRC_BINS, range=(0.0, 1.0))[0] / max(p_a.size, 1)  # Table 6's buckets, finer
        metrics.update({f"prc/p_bin{k}": float(h) for k, h in enumerate(hist)})
        return np.asarray(prc_rewards(p_a.reshape(b, m))), metrics


@register("scr")
class SCRReward(JudgeReward):
    """SCR (Algorithm 1): every pair of a group judged V times; reward = majority win count x alpha (Eq. 16), or,
    with `cara`, alpha x the position in the Kemeny-aggregated order (Eq. 21). With `tournament` 'merge_sort' or
    'knockout' (beyond the paper) the group is ordered by an adaptive tournament instead of a round robin (fewer
    questions) and rewarded by Eq. 21 on that order."""

    def __init__(self, judge: Judge, seed: int, *, votes: int, swap: bool, alpha: float, ties: str, cara: bool,
                 cara_method: str, tournament: str = "round_robin"):
        super().__init__(judge, seed)
        if tournament not in TOURNAMENTS:
            raise ConfigError(f"config.reward.scr.tournament: {tournament!r}; use {', '.join(TOURNAMENTS)}")
        self.votes, self.swap, self.alpha, self.ties, self.cara, self.cara_method = (
            votes, swap, alpha, ties, cara, cara_method)
        self.tournament = tournament

    @classmethod
    def from_config(cls, config, ctx: RewardContext) -> SCRReward:
        s, j = config.reward.scr, config.reward.judge
        return cls(ctx.judge(), config.seed, votes=j.votes, swap=j.swap, alpha=s.alpha, ties=s.ties, cara=s.cara,
                   cara_method=s.cara_method, tournament=s.tournament)

    def __call__(self, prompts, responses, prompt_index, step):
        _group_sizes(prompts, responses)
        self.start(step)
        if self.tournament != "round_robin":
            play = merge_sort if self.tournament == "merge_sort" else knockout
            t = play(self.judge, prompts, responses, votes=self.votes, swap=self.swap)
            return (self.alpha * t.rewards).astype(np.float32), {"judge/comparisons": float(t.queries.mean()),
                                                                 **self.judge_metrics()}
        counts = self.judge.round_robin(prompts, responses, votes=self.votes, swap=self.swap)
        diag = scr_diagnostics(counts, votes=self.votes)
        metrics = {f"judge/{k}": float(np.mean(v)) for k, v in diag.items()}
        rewards = (cara_rewards(counts, alpha=self.alpha, method=self.cara_method) if self.cara
                   else np.asarray(scr_rewards(counts, alpha=self.alpha, ties=self.ties)))
        return rewards, {**metrics, **self.judge_metrics()}


@register("agr")
class AGRReward(JudgeReward):
    """AGR (Algorithm 2): each response judged V times against each of its prompt's n anchors; reward = anchors
    beaten by majority x alpha (Eq. 22). Anchors come from the reference policy, generated once into
    `anchors_path` (`rrc_jax.rl.anchors`); with `refresh_every = k > 0` they are regenerated from the current policy
    before steps k + 1, 2k + 1, ... (beyond the paper) into versioned files under `refreshed_dir`, so that the
    anchors of any step are those of its refresh (`refresh_step`), also in a resumed run."""

    def __init__(self, judge: Judge, seed: int, *, store: AnchorStore, votes: int, swap: bool, alpha: float,
                 ties: str, refresh_every: int, ctx: RewardContext, refreshed_dir: str | epath.Path = "",
                 checkpoints: str | epath.Path = ""):
        super().__init__(judge, seed)
        self.store, self.votes, self.swap, self.alpha, self.ties = store, votes, swap, alpha, ties
        self.refresh_every, self.ctx = refresh_every, ctx
        self.refreshed_dir = epath.Path(refreshed_dir or store.path.parent / "anchors_refreshed")
        self.checkpoints = epath.Path(checkpoints) if checkpoints else None
        if not distributed.main_value(store.path.is_file()):  # every host decides as process 0 sees the file
            store.generate(ctx.reference(), seed)  # the reference is loaded only when anchors must be made
        store.load()
        self.version = 0  # the refresh step whose anchors the store holds (0: the reference's)

    @classmethod
    def from_config(cls, config, ctx: RewardContext) -> AGRReward:
        a, j = config.reward.agr, config.reward.judge
        workdir = epath.Path(config.workdir).expanduser()
        return cls(ctx.judge(), config.seed, store=anchor_store(config, ctx.train, ctx.tokenizer), votes=j.votes,
                   swap=j.swap, alpha=a.alpha, ties=a.ties, refresh_every=a.refresh_every, ctx=ctx,
                   refreshed_dir=workdir / "anchors_refreshed", checkpoints=workdir / "checkpoints")

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
        """Delete the refreshed anchors that neither this step nor a resume from a checkpoint on disk uses."""
        steps = steps_on_disk(self.checkpoints) if self.checkpoints is not None else []
        prune_refreshed(self.refreshed_dir, {current} | {refresh_step(c + 1, self.refresh_every) for c in steps})

    def __call__(self, prompts, responses, prompt_index, step):
        _group_sizes(prompts, responses)
        self.use_anchors(step)
        self.start(step)
        anchors = self.store[prompt_index]
        self.sample_notes = [{"anchors": list(a)} for a in anchors]
        wins, losses = self.judge.vs_anchors(prompts, responses, anchors, votes=self.votes, swap=self.swap)
        diag = agr_diagnostics(wins, losses, votes=self.votes)
        metrics = {f"judge/{k}": float(np.mean(v)) for k, v in diag.items()}
        rewards = np.asarray(agr_rewards(wins, losses, alpha=self.alpha, ties=self.ties))
        return rewards, {**metrics, **self.judge_metrics()}


@register("pointwise")
class PointwiseReward(JudgeReward):
    """A pointwise GRM's score as the reward (how IRPO uses its judge): each response scored V times with the
    pointwise `reward.judge.template` (`Judge.score`), the reward the mean of its parsed scores. A response with no
    parsed score (every vote abstained) gets its group's mean reward, so it moves no advantage; its abstentions
    are counted in `judge/abstain_rate`."""

    def __init__(self, judge: Judge, seed: int, *, votes: int):
        super().__init__(judge, seed)
        if judge.template.kind != "pointwise":
            raise ConfigError(f"reward.kind='pointwise' needs a pointwise reward.judge.template, got "
                              f"{judge.template.name!r} ({judge.template.kind}); e.g. irpo_pointwise or toy_pointwise")
        self.votes = votes

    @classmethod
    def from_config(cls, config, ctx: RewardContext) -> PointwiseReward:
        return cls(ctx.judge(), config.seed, votes=config.reward.judge.votes)

    def __call__(self, prompts, responses, prompt_index, step):
        b, m = _group_sizes(prompts, responses)
        self.start(step)
        v = self.votes
        scores = self.judge.score(prompts, [[o for o in g for _ in range(v)] for g in responses],
                                  template=self.judge.template,
                                  tags=[{"i": q % (m * v) // v, "vote": q % v} for q in range(b * m * v)]
                                  ).reshape(b, m, v)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a response, or a group, with no score at all
            rewards = np.nanmean(scores, axis=2)
            rewards = np.where(np.isnan(rewards), np.nanmean(rewards, axis=1, keepdims=True), rewards)
        unscored = np.isnan(rewards)  # whole groups without a score: no signal
        return np.nan_to_num(rewards).astype(np.float32), {"reward/unscored_groups": float(unscored.all(1).sum()),
                                                           **self.judge_metrics()}


@register("rlvr")
class RLVRReward:
    """RLVR (RM-R1 Eq. 8): the policy is a judge; each prompt is a judge question whose correct verdict is known
    (`data.format`, `rrc_jax.data.prompts.judge_questions`), and a judgment earns +1 when its verdict is correct,
    -1 otherwise (a wrong verdict or none)."""

    def __init__(self, train: PromptSet):
        if train.oracle is None or not train.rendered:
            raise ConfigError("reward.kind='rlvr' needs judge questions as prompts: set data.format (helpsteer3, "
                              "rmbench, judgebench or pairs)")
        self.correct = train.oracle

    @classmethod
    def from_config(cls, config, ctx: RewardContext) -> RLVRReward:
        return cls(ctx.train)

    def __call__(self, prompts, responses, prompt_index, step):
        _group_sizes(prompts, responses)
        right = np.asarray([[self.correct(int(i), r) for r in group] for i, group in zip(prompt_index, responses)],
                           np.float32).reshape(len(prompts), -1)
        return 2.0 * right - 1.0, {"reward/verdict_accuracy": float(right.mean()) if right.size else float("nan")}


def pair_correct(scores) -> np.ndarray:
    """Per pair of a paired set's scores `[2P]` (chosen, rejected, chosen, ...; NaN where none): 1 when the chosen
    response scores higher, 0 when lower, 0.5 on a tie or a missing score. `[P]` float."""
    s = np.asarray(scores, np.float64).reshape(-1, 2)
    return np.where(np.isnan(s).any(axis=1) | (s[:, 0] == s[:, 1]), 0.5, (s[:, 0] > s[:, 1]).astype(np.float64))


@register("irpo")
class IRPOReward:
    """IRPO (its Section 3): the policy is a pointwise judge. Each step holds whole pairs of questions (a
    preference's chosen response, then its rejected one: `PromptSet.paired`); each of the G scores of the chosen
    group is rewarded against the rejected group's scores and vice versa (`reward.irpo.rule`:
    `rrc_jax.rewards.irpo`), plus the format reward (-0.5 for a judgment without a parseable score, or without its
    `<critique>` block when the template asks for one). Group advantages stay within each group."""

    RULES = ("median", "mean", "interval", "auc", "strength")

    def __init__(self, rule: str, template: JudgeTemplate | str):
        if rule not in self.RULES:
            raise ConfigError(f"config.reward.irpo.rule: {rule!r}; use {', '.join(self.RULES)}")
        self.rule = rule
        self.critique = "<critique>" in get_template(template).item

    @classmethod
    def from_config(cls, config, ctx: RewardContext) -> IRPOReward:
        if not ctx.train.paired:
            raise ConfigError("reward.kind='irpo' needs pointwise judge questions in pairs: set data.format")
        return cls(config.reward.irpo.rule, config.reward.judge.template)

    def intergroup(self, s_c, s_r) -> tuple[np.ndarray, np.ndarray]:
        """(r_c, r_r) `[P, G]` of the chosen and rejected groups' scores."""
        if self.rule == "auc":
            r = auc_rewards(s_c, s_r)
        elif self.rule == "strength":
            r = preference_strength(s_c, s_r)
        else:
            r = rule_rewards(s_c, s_r, self.rule)
        return tuple(np.asarray(x, np.float32) for x in r)

    def __call__(self, prompts, responses, prompt_index, step):
        b, g = _group_sizes(prompts, responses)
        index = np.asarray(prompt_index)
        if b % 2 or (index[0::2] % 2).any() or (index[1::2] != index[0::2] + 1).any():
            raise ValueError("irpo: the step's prompts must be whole pairs (2k, 2k + 1) of a paired prompt set")
        scores = np.array([[math.nan if (x := parse_score(t)) is None else x for t in group] for group in responses],
                          np.float32)
        ok = np.array([[parse_score(t) is not None and (not self.critique or "</critique>" in t) for t in group]
                       for group in responses])
        r_c, r_r = self.intergroup(scores[0::2], scores[1::2])
        rewards = np.empty((b, g), np.float32)
        rewards[0::2], rewards[1::2] = r_c, r_r
        rewards += np.asarray(format_reward(ok))
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a group with no score at all
            means, spread = np.nanmean(scores, axis=1), np.nanstd(scores, axis=1)
        return rewards, {"reward/pair_accuracy": float(pair_correct(means).mean()) if b else math.nan,
                         "reward/score_std": float(np.nanmean(spread)) if np.isfinite(spread).any() else math.nan,
                         "reward/format_ok": float(ok.mean()) if ok.size else math.nan}


def anchor_store(config, train: PromptSet, tokenizer) -> AnchorStore:
    """The AGR anchors of a trainer config for its training prompts: `reward.agr.anchors_path` (default
    `workdir/anchors.jsonl`), sampled like the rollouts."""
    a = config.reward.agr
    path = a.anchors_path or epath.Path(config.workdir).expanduser() / "anchors.jsonl"
    return AnchorStore(path, train, a.n_anchors, tokenizer, rollout_params(config.rl))


# ------------------------------------------------------------------------------------------------------------
# A user's reward: MODULE:NAME
# ------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class FunctionReward:
    """A plain function `f(prompts, responses) -> rewards [B, m]` (or `(rewards, metrics)`) as a RewardFn."""

    function: Callable
    name: str

    def __call__(self, prompts, responses, prompt_index, step):
        b, m = _group_sizes(prompts, responses)
        out = self.function(list(prompts), [list(g) for g in responses])
        rewards, metrics = out if isinstance(out, tuple) else (out, {})
        rewards = np.asarray(rewards, np.float32)
        if rewards.shape != (b, m):
            raise ValueError(f"reward {self.name} returned shape {rewards.shape}; it must return [B, m] = {(b, m)} "
                             "rewards, one per response")
        return rewards, dict(metrics)


def load_plugin(kind: str):
    """The object named by `MODULE:NAME` (a one-line `ConfigError` when it cannot be imported)."""
    module, _, name = kind.partition(":")
    try:
        obj = importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"config.reward.kind={kind!r}: cannot import {module!r} ({e}); put it on PYTHONPATH") from None
    for part in name.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"config.reward.kind={kind!r}: module {module!r} has no {name!r}")
        obj = getattr(obj, part)
    return obj


def make_reward_fn(config, ctx: RewardContext) -> RewardFn:
    """The RewardFn of `config.reward.kind`: a registered kind, or a user's `MODULE:NAME` (module docstring)."""
    kind = config.reward.kind
    if not is_plugin(kind):
        if kind not in REWARD_FNS:
            raise ConfigError(f"config.reward.kind: {kind!r} is not one of {', '.join(REWARD_FNS)} or MODULE:NAME")
        return REWARD_FNS[kind].from_config(config, ctx)
    obj = load_plugin(kind)
    if isinstance(obj, type):
        return obj.from_config(config, ctx) if hasattr(obj, "from_config") else obj()
    if not callable(obj):
        raise ConfigError(f"config.reward.kind={kind!r} names a {type(obj).__name__}, not a function or class")
    try:
        n_args = len(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        n_args = 4
    return obj if n_args >= 4 else FunctionReward(obj, kind)
