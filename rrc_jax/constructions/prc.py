"""PRC (the RRC paper's Eq. 5): the judge's probability that a response beats a reference response, as the reward."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from rrc_jax.constructions.base import JudgeLoad, RewardResult
from rrc_jax.constructions.judged import JudgeConstruction
from rrc_jax.errors import ConfigError
from rrc_jax.rewards import prc_rewards
from rrc_jax.settings import one_of

PRC_BINS = 10  # `prc/p_bin{k}`: the share of a step's P(A) in [k / 10, (k + 1) / 10)
REFERENCES = ("current", "initial")


@dataclasses.dataclass(frozen=True)
class PRCSettings:
    think: bool = True  # the judge reasons before the verdict; False: its direct-verdict template
    reference: str = "current"  # o_ref: the current policy's greedy response (RRC paper 2.3), or 'initial'

    def __post_init__(self):
        one_of("reward.prc", "reference", self.reference, REFERENCES)


class PRCReward(JudgeConstruction):
    """PRC (Eq. 5): `r(x, o) = P(A)` with o shown as A against the reference response o_ref as B.

    `reference='current'` (default, as in the RRC paper's section 2.3): o_ref is the greedy response of the policy
    being trained, regenerated each step. `reference='initial'`: the frozen reference policy's greedy response,
    generated once per prompt and cached. `think=False` reads P(A) directly after the judge template's
    direct-verdict variant (PRC "removing thinking")."""

    kind = "prc"
    Settings = PRCSettings
    baseline = True
    columns = ("reference",)  # another trainer's groups: each prompt's o_ref comes with it
    per_response = True  # Eq. 5: a response's P(A) against its prompt's o_ref

    def __init__(self, judge, seed: int, *, think: bool, reference: str, ctx, eval_votes: int = 0):
        super().__init__(judge, seed, ctx=ctx, eval_votes=eval_votes)
        one_of("reward.prc", "reference", reference, REFERENCES)
        self.think, self.reference = think, reference
        # the template P(A) is read after: a ConfigError now, not at step 1, when there is no direct variant
        self.template = judge.template if think else judge.direct_template
        self._initial: dict[int, str] = {}

    @classmethod
    def roles(cls, s) -> frozenset[str]:
        initial = s.reward_settings.reference == "initial"
        return super().roles(s) | ({"reference"} if initial else set())

    @classmethod
    def questions_per_prompt(cls, s) -> int:
        return s.rollout.group_size

    @classmethod
    def judge_load(cls, s) -> JudgeLoad:
        q = cls.questions_per_prompt(s)  # without thinking, one read of P(A) per question
        return JudgeLoad(q, q * (s.judge.max_new_tokens if s.reward_settings.think else 1), q, q)

    @classmethod
    def check(cls, s) -> None:
        if s.inference.engine != "jax":  # only the judge leaves the process; P(A) is a read of its logits
            raise ConfigError(f"config.inference.engine: {s.inference.engine!r} cannot give PRC's P(A): it "
                              "reads the log-probs of the verdict tokens, which a completions server does not return; "
                              "use inference.engine='jax' (the judge in this process) with reward.kind='prc'")

    @classmethod
    def absolute_scale(cls, s) -> bool:
        return s.reward_settings.reference == "initial"

    @classmethod
    def from_settings(cls, s, ctx) -> PRCReward:
        own = s.reward_settings
        return cls(**cls.judge_kwargs(s, ctx), think=own.think, reference=own.reference)

    @classmethod
    def of_groups(cls, judge, *, votes: int, swap: bool, settings: PRCSettings):
        return lambda prompts, responses, columns: prc_result(judge, prompts, responses, columns["reference"],
                                                              think=settings.think)

    def references(self, prompts: Sequence[str], prompt_index: np.ndarray) -> list[str]:
        """o_ref `[B]` of the step's prompts."""
        if self.reference == "current":
            return self.ctx.greedy_texts(self.ctx.policy, prompts)
        todo = sorted({int(i) for i in prompt_index} - self._initial.keys())
        if todo:
            texts = self.ctx.greedy_texts(self.ctx.reference(), [self.ctx.train.texts[i] for i in todo])
            self._initial.update(zip(todo, texts))
        return [self._initial[int(i)] for i in prompt_index]

    def prepare(self, prompts, prompt_index, step) -> dict[str, list]:
        return {"references": self.references(prompts, prompt_index)}

    def construct(self, prompts, responses, prompt_index, step, *, references) -> RewardResult:
        return prc_result(self.judge, prompts, responses, references, think=self.think)


def prc_result(judge, prompts, responses, references, *, think: bool = PRCSettings.think) -> RewardResult:
    """PRC's rewards `[B, m]`: P(A) of each response shown as A against its prompt's reference response o_ref
    (`references [B]`) as B (`PRCReward`; also what the trainer integrations call, `PRCReward.of_groups`)."""
    b, m = len(prompts), len(responses[0])
    p_a = judge.preference_prob([p for p in prompts for _ in range(m)], [o for g in responses for o in g],
                                [r for r in references for _ in range(m)], think=think,
                                tags=[{"prompt": q // m, "i": q % m} for q in range(b * m)])
    metrics = {"reward/prc_saturation": float(np.mean((p_a <= 0.1) | (p_a >= 0.9)))}
    hist = np.histogram(p_a, bins=PRC_BINS, range=(0.0, 1.0))[0] / max(p_a.size, 1)  # Table 6's buckets, finer
    metrics.update({f"prc/p_bin{k}": float(h) for k, h in enumerate(hist)})
    return RewardResult(np.asarray(prc_rewards(p_a.reshape(b, m))), metrics,
                        notes=[{"reference": r} for r in references])
