"""The rollout: how the policy samples a step's groups (`RolloutConfig`, the `rl` fields it reads; `sample_groups`)
and the training batch it makes of them (`Groups.batch`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import ClassVar

import jax
import numpy as np

from rrc_jax import distributed
from rrc_jax.models.batches import completion_batch, length_bucket
from rrc_jax.data.prompts import PromptSet, prompt_tokens
from rrc_jax.inference.sampler import Sampler, SamplingParams, response_texts
from rrc_jax.settings import at_least, field_error


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """B prompts a step, m responses each, sampled at `temperature` / `top_p` up to `max_new_tokens`."""

    GROUP: ClassVar[str] = "rl"
    group_size: int = 8  # m responses per prompt (the paper's m = 8)
    prompts_per_step: int = 16  # B prompts per step (the paper: 128)
    max_new_tokens: int = 12  # also Dr.GRPO's constant (loss_aggregation='seq_mean_token_sum_norm')
    temperature: float = 1.0  # rollouts, and every log-probability of the loss
    top_p: float = 1.0
    # Sample from the learner's float32 master weights instead of a rollout copy in the inference layout
    # (`mesh.inference`, the compute dtype, refreshed after every update): no copy's memory, but every decoding
    # step gathers the weights. On one device there is no copy either way.
    share_weights: bool = False
    # DAPO's dynamic sampling ("DAPO: An Open-Source LLM Reinforcement Learning System at Scale", section 3.2): a
    # group whose rewards are all equal has zero advantages and no gradient; draw more prompts until the step has
    # prompts_per_step groups that do not, at most `max_draws` batches of prompts (`rrc_jax.rl.dynamic_sampling`)
    dynamic_sampling: bool = False
    max_draws: int = 4

    def __post_init__(self):
        if self.group_size < 2:
            raise field_error("rl", "group_size", f"{self.group_size}: GRPO needs at least 2 responses per prompt")
        at_least("rl", "prompts_per_step", self.prompts_per_step, 1)
        at_least("rl", "max_new_tokens", self.max_new_tokens, 1)
        if not self.temperature > 0:
            raise field_error("rl", "temperature", f"{self.temperature}: rollouts need temperature > 0 for diverse "
                              "groups")
        if not 0 < self.top_p <= 1:
            raise field_error("rl", "top_p", f"{self.top_p} must be in (0, 1]")
        at_least("rl", "max_draws", self.max_draws, 1)

    @property
    def params(self) -> SamplingParams:
        """How the policy samples rollouts (and AGR's anchors)."""
        return SamplingParams(self.temperature, 0, self.top_p, max_new_tokens=self.max_new_tokens)

    @property
    def greedy(self) -> SamplingParams:
        """The greedy responses of evaluation and of PRC's references."""
        return SamplingParams(0.0, max_new_tokens=self.max_new_tokens)

    @property
    def rows(self) -> int:
        """A step's rollouts, B x m."""
        return self.prompts_per_step * self.group_size

    @property
    def max_batch(self) -> int:
        """Rows per model call of the policy's and the reference's samplers: a step's rollouts, at least 256."""
        return max(256, self.rows)


@dataclasses.dataclass(frozen=True)
class Groups:
    """This host's B prompts and their groups of m sampled responses: `texts [B][m]`, each prompt's tokens
    `prompt_ids [B]`, each response's tokens `responses [B*m]` (group after group) and `truncated [B*m]`.

    Sampled ahead of their update (`rl.max_staleness > 0`, `rrc_jax.rl.pipeline`) they also carry the behaviour
    policy: `logprobs [B*m]`, each response's token log-probabilities under the weights that sampled it (as long as
    the response), and `versions [B*m]`, the optimizer steps those weights had taken."""

    texts: list[list[str]]
    prompt_ids: list[list[int]]
    responses: list[np.ndarray]
    truncated: np.ndarray
    logprobs: list[np.ndarray] | None = None
    versions: np.ndarray | None = None

    @property
    def lengths(self) -> np.ndarray:
        """Tokens of each response `[B, m]`, its stop token included."""
        return np.array([len(r) for r in self.responses], np.int64).reshape(len(self.texts), -1)

    def take(self, groups: Sequence[int]) -> Groups:
        """The groups `groups` (indices into B), in that order."""
        m = len(self.texts[0]) if self.texts else 0
        rows = [g * m + j for g in groups for j in range(m)]
        return Groups([self.texts[g] for g in groups], [self.prompt_ids[g] for g in groups],
                      [self.responses[r] for r in rows], self.truncated[rows],
                      None if self.logprobs is None else [self.logprobs[r] for r in rows],
                      None if self.versions is None else self.versions[rows])

    @staticmethod
    def concat(parts: Sequence[Groups]) -> Groups:
        """The groups of `parts`, one after another."""
        behaviour = all(p.logprobs is not None for p in parts)
        return Groups([t for p in parts for t in p.texts], [i for p in parts for i in p.prompt_ids],
                      [r for p in parts for r in p.responses], np.concatenate([p.truncated for p in parts]),
                      [x for p in parts for x in p.logprobs] if behaviour else None,
                      np.concatenate([p.versions for p in parts]) if behaviour else None)

    def batch(self, pad_id: int) -> dict[str, np.ndarray]:
        """The training batch: `completion_batch` rows of prompt + response `[B*m, T]`, loss on the response
        including its stop token, one padded length on every host (collective), and `truncated [B*m]`; with a
        behaviour policy, `old_logp [B*m, T]` (its log-probabilities at the loss positions, 0 elsewhere)."""
        m = len(self.texts[0])
        prompts = [self.prompt_ids[r // m] for r in range(len(self.responses))]
        longest = max(len(p) + len(r) for p, r in zip(prompts, self.responses))
        batch = completion_batch(prompts, self.responses, pad_id,
                                 length=length_bucket(int(distributed.host_max(longest))))
        batch["truncated"] = self.truncated
        if self.logprobs is not None:
            old = np.zeros(batch["ids"].shape, np.float32)
            for r, (p, x) in enumerate(zip(prompts, self.logprobs)):
                old[r, len(p):len(p) + len(x)] = x
            batch["old_logp"] = old
        return batch

    def with_behaviour(self, logp: np.ndarray, loss_mask: np.ndarray, version: int) -> Groups:
        """These groups with their behaviour policy: `logp [B*m, T]` of `batch`'s rows (`token_logprobs` under the
        weights that sampled them), read at the loss positions `loss_mask [B*m, T]`, and the weights' `version`."""
        logprobs = [np.asarray(logp[r][loss_mask[r].astype(bool)], np.float32) for r in range(len(self.responses))]
        return dataclasses.replace(self, logprobs=logprobs,
                                   versions=np.full(len(self.responses), version, np.int64))


def sample_groups(sampler: Sampler, tokenizer, prompt_set: PromptSet, prompts: Sequence[str], rollout: RolloutConfig,
                  key: jax.Array) -> Groups:
    """m sampled responses to each of this host's B `prompts` (texts of `prompt_set`)."""
    m = rollout.group_size
    ids = [prompt_tokens(tokenizer, prompt_set, p) for p in prompts]
    out = sampler.generate(ids, m, rollout.params, rng=key)
    texts = response_texts(tokenizer, out)
    return Groups([texts[i * m:(i + 1) * m] for i in range(len(prompts))], [list(i) for i in ids],
                  [np.asarray(out.tokens[r, :out.lengths[r]]) for r in range(len(texts))], np.asarray(out.truncated))
