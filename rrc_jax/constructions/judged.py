"""What the constructions that ask the GRM share: the judge's settings (`reward.judge`), its construction from the
run's roles, the per-step reseeding, its counters as `judge/*` metrics, its judgments when traced, and the held-out
win rate against the reference policy."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import numpy as np

from rrc_jax import distributed
from rrc_jax.constructions.base import Construction, JudgeLoad, RewardResult, step_seed
from rrc_jax.inference.factory import role_sampler
from rrc_jax.judge import Judge, JudgeConfig
from rrc_jax.models.decoder_config import KV_DTYPES
from rrc_jax.models.lora import WEIGHT_QTYPES
from rrc_jax.settings import field_error, one_of


@dataclasses.dataclass(frozen=True)
class JudgeSettings(JudgeConfig):
    """How the GRM is asked (`reward.judge`: the judge rewards and the held-out win rate): a `JudgeConfig` with the
    trainer's defaults (the toy world's judge), and how many questions a pair gets and a model call takes. The
    judge's seed is the run's (`make_judge`)."""

    GROUP: ClassVar[str] = "reward.judge"
    template: str = "toy_pairwise_cot"  # a built-in name or a .json / .yaml template file
    max_new_tokens: int = 24
    temperature: float = 1.0  # the judge samples its reasoning: judgments vary, as a real GRM's do
    max_batch: int = 256  # judge questions per model call
    # and their cache slots, own tokens plus decoding room (256 rows of 3,584): a reasoning judge's long questions
    # and answers run in fewer rows a call
    max_batch_tokens: int = 7 << 17
    votes: int = 2  # V judgments per pair (voting@V)
    swap: bool = True  # alternate the A/B order across votes (beyond the paper: position bias)
    early_stop: bool = False  # ask votes in rounds, stop a pair once its majority is decided (same rewards)
    # decode in lanes that take the next waiting question when a judgment ends, not in chunks that wait for their
    # longest (rrc_jax.inference.lanes; the same judgments; one process)
    continuous: bool = False
    # the judgments' expected length, for the planner's decode with continuous batching (0: max_new_tokens); a run
    # logs its measured mean as judge/mean_judgment_tokens
    expected_tokens: int = 0
    # the judge's rows and cache slots a call from the memory its chips leave it (rrc_jax.plan.judge_rows), where
    # the devices report their memory (TPU, GPU); elsewhere max_batch and max_batch_tokens
    fill_memory: bool = False
    # the frozen judge's weights: "" (models.dtype), "int8" (qwix, one scale per output channel) or "nf4"
    weight_qtype: str = ""
    # the judge's KV cache: "" (models.dtype) or "float8_e4m3fn" (a byte a value: twice the slots, half the reads)
    kv_dtype: str = ""

    def __post_init__(self):
        if self.votes < 1:
            raise field_error("reward.judge", "votes", f"{self.votes} must be >= 1")
        if self.votes > 1 and self.temperature == 0 and not self.swap:
            raise field_error("reward.judge", "votes", "greedy judging (judge.temperature=0) without swap gives V "
                              "identical votes; set reward.judge.temperature > 0 or reward.judge.swap=True or "
                              "reward.judge.votes=1")
        if self.max_batch < 1:
            raise field_error("reward.judge", "max_batch", f"{self.max_batch} must be >= 1")
        if not 0 <= self.expected_tokens <= self.max_new_tokens:
            raise field_error("reward.judge", "expected_tokens", f"{self.expected_tokens} must be in [0, "
                              f"max_new_tokens={self.max_new_tokens}] (0: max_new_tokens)")
        one_of("reward.judge", "weight_qtype", self.weight_qtype, WEIGHT_QTYPES)
        one_of("reward.judge", "kv_dtype", self.kv_dtype, KV_DTYPES)
        if self.max_batch_tokens < 1:
            raise field_error("reward.judge", "max_batch_tokens", f"{self.max_batch_tokens} must be >= 1")
        super().__post_init__()  # the sampling fields



def make_judge(s, roles) -> Judge:
    """The GRM of `roles` as a `Judge` asking per the run's `s.judge` (`reward.judge`), seeded from `s.seed`."""
    sampler = role_sampler(roles, "grm", engine=s.inference, max_batch=s.judge.max_batch,
                           max_batch_tokens=s.judge.max_batch_tokens, continuous=s.judge.continuous)
    return Judge(sampler, roles.tokenizer("grm"), dataclasses.replace(s.judge, seed=s.seed))


def judge_metrics(judge: Judge) -> dict[str, float]:
    """The `judge/*` metrics of what `judge` did since its last `reset_metrics` (a step's, or a reward call's);
    with early-stopped voting, the votes not asked and an estimate of the judge tokens they would have cost (at
    the mean of the votes asked); where the judge decoded in this process, its row-steps and their ratio to the
    tokens decoded."""
    s = judge.summary()
    skipped = {}
    if s["vote_rounds"]:
        per_vote = s["judge_tokens"] / s["questions"] if s["questions"] else 0.0
        skipped = {"judge/vote_rounds": s["vote_rounds"], "judge/votes_skipped": s["votes_skipped"],
                   "judge/tokens_saved_estimate": s["votes_skipped"] * per_vote}
    forced = {"judge/forced_verdicts": s["forced_verdicts"]} if judge.config.force_verdicts else {}
    # decode waste, where this process decoded: row-steps run per judgment token (1.0: none; each chunk decodes
    # until its longest judgment ends, its shorter and padding rows idle)
    decode = {"judge/decode_row_steps": s["decode_row_steps"],
              "judge/row_steps_per_token": s["decode_row_steps"] / s["decoded_tokens"]} if s["decoded_tokens"] and \
        s["decode_row_steps"] else {}
    # the judgments' mean length, what the planner's reward.judge.expected_tokens estimates
    mean = {"judge/mean_judgment_tokens": s["judge_tokens"] / s["questions"]} if s["questions"] else {}
    return {**skipped, **forced, **decode, **mean, "judge/questions": s["questions"], "judge/tokens": s["judge_tokens"],
            "judge/abstain_rate": s["abstain_rate"], "judge/position_consistency": s["position_consistency"],
            "judge/prefill_tokens": s["prefill_tokens"], "judge/prefill_tokens_saved": s["prefill_tokens_saved"],
            "judge/too_long": s["too_long"],
            **{f"judge/{k}": s[k] for k in judge.sampler.stats.failures()}}


class JudgeConstruction(Construction):
    """A construction that asks the GRM. Subclasses implement `construct`; `__call__` reseeds the judge from the
    step (exact resume), records its judgments when traced and adds its counters as `judge/*` metrics. With a
    context and `eval_votes` > 0, `evaluate` adds the judged win rate against the reference policy."""

    def __init__(self, judge: Judge, seed: int, *, ctx=None, eval_votes: int = 0):
        self.judge, self.seed, self.ctx, self.eval_votes = judge, seed, ctx, eval_votes
        self._eval_references: list[str] | None = None

    @classmethod
    def roles(cls, s) -> frozenset[str]:
        return frozenset({"grm", "reference"} if s.eval.judge_votes > 0 else {"grm"})

    @classmethod
    def judge_load(cls, s) -> JudgeLoad:
        """Pairs asked V times each, in both orders with swap: 2 different questions a pair (1 with one vote)."""
        q, j = cls.questions_per_prompt(s), s.judge
        orders = min(j.votes, 2) if j.swap else 1
        return JudgeLoad(q, q * j.max_new_tokens, cls.firsts_per_prompt(s), q // j.votes * orders)

    @classmethod
    def firsts_per_prompt(cls, s) -> int:
        """The texts a prompt's questions show first: its group's responses."""
        return s.rollout.group_size

    @classmethod
    def questions_per_prompt(cls, s) -> int:
        raise NotImplementedError

    @classmethod
    def judge_kwargs(cls, s, ctx) -> dict:
        """The `JudgeConstruction` arguments of a run (`s`: its settings)."""
        return dict(judge=ctx.judge(), seed=s.seed, ctx=ctx, eval_votes=s.eval.judge_votes)

    def __call__(self, prompts, responses, prompt_index, step, *, trace=False, inputs=None) -> RewardResult:
        self.judge.reset_metrics()
        self.judge.reseed(step_seed(self.seed, step))
        self.judge.trace = [] if trace else None
        try:
            result = super().__call__(prompts, responses, prompt_index, step, inputs=inputs)
        finally:
            judgments, self.judge.trace = self.judge.trace or [], None
        return dataclasses.replace(result, metrics={**result.metrics, **self.judge_metrics()}, judgments=judgments)

    def judge_metrics(self) -> dict[str, float]:
        return judge_metrics(self.judge)

    def evaluate(self, held_out, index, prompts, texts, step) -> dict[str, float]:
        """The oracle's quality and, with `eval_votes`, the judged win rate of the greedy `texts` against the
        reference policy's greedy responses (`eval_votes` votes per prompt, A/B swapped, ties half; null when every
        vote abstained) and, from a served judge, its requests and failures (`eval/judge_requests`, ...: the
        `judge/*` counters of the evaluation, summed over hosts)."""
        metrics = super().evaluate(held_out, index, prompts, texts, step)
        v = self.eval_votes
        if self.ctx is None or not v:
            return metrics
        if self._eval_references is None:
            self._eval_references = self.ctx.greedy_texts(self.ctx.reference(), prompts, held_out)
        self.judge.reseed(step_seed(self.seed, step, stream=1))
        self.judge.reset_metrics()  # (the step's were read)
        pv = self.judge.compare(prompts, texts, self._eval_references, votes=v, swap=True)
        failures = self.judge.sampler.stats.failures()
        if failures:
            totals = distributed.host_concat(np.asarray([list(failures.values())], np.float64)).sum(axis=0)
            metrics.update({f"eval/judge_{k}": float(n) for k, n in zip(failures, totals)})
        wins, losses = distributed.host_gather(pv.wins), distributed.host_gather(pv.losses)
        decided = wins + losses > 0  # no rate from nothing: NaN (null) when every vote abstained
        metrics["eval/win_rate_vs_reference"] = (float(np.mean((wins + 0.5 * (v - wins - losses)) / v))
                                                 if decided.any() else math.nan)
        metrics["eval/decided_win_rate_vs_reference"] = (float(np.mean(wins[decided] / (wins + losses)[decided]))
                                                         if decided.any() else math.nan)
        return metrics
