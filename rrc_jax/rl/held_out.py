"""The held-out evaluation of a run: when it runs (`EvalConfig`) and what it measures (`held_out_metrics`): the
policy's greedy responses to the held-out prompts, their length, and the reward construction's held-out metrics
(`Construction.evaluate`: the toy oracle's quality, the verdicts' accuracy of judge questions, IRPO's pair
accuracy, the judged win rate against the reference policy)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from rrc_jax import distributed
from rrc_jax.data.prompts import PromptSet, prompt_tokens
from rrc_jax.errors import ConfigError
from rrc_jax.inference.sampler import Sampler, SamplingParams, response_texts


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """At step 0, every `every` steps (0: only at the start and the end) and the last; `judge_votes` votes per
    prompt for the judged win rate against the reference policy (0: none)."""

    GROUP: ClassVar[str] = "eval"
    every: int = 10
    judge_votes: int = 2

    def __post_init__(self):
        if self.every < 0 or self.judge_votes < 0:
            raise ConfigError("config.eval: every and judge_votes must be >= 0 (every 0 = only at start and end; "
                              "judge_votes 0 = no judged win rate)")

    def due(self, step: int, last: int) -> bool:
        """Whether step `step` (1-based) of a run of `last` steps is evaluated."""
        return bool(self.every and step % self.every == 0) or step == last


def held_out_metrics(sampler: Sampler, tokenizer, held_out: PromptSet, construction, greedy: SamplingParams,
                     step: int) -> dict[str, float]:
    """The held-out metrics at `step` of the policy that `sampler` samples: each host generates greedily for its
    block of the held-out prompts (whole pairs of a paired set), then every host asks the construction (it
    gathers)."""
    if not held_out.texts:
        return {}
    if held_out.paired:  # whole pairs on each host
        pairs = distributed.host_block(len(held_out.texts) // 2)
        own = np.stack([2 * pairs, 2 * pairs + 1], axis=1).reshape(-1)
    else:
        own = distributed.host_block(len(held_out.texts))
    prompts = [held_out.texts[i] for i in own]
    out = sampler.generate([prompt_tokens(tokenizer, held_out, p) for p in prompts], 1, greedy)
    texts = response_texts(tokenizer, out)
    return {"eval/response_length": float(distributed.host_gather(out.lengths).mean()),
            **construction.evaluate(held_out, own, prompts, texts, step)}
