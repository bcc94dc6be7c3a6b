"""The rollout: how the policy samples a step's groups (`RolloutConfig`, the `rl` fields it reads) and the
training batch it makes of them (`sample_groups`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import ClassVar

import jax
import numpy as np

from rrc_jax import distributed
from rrc_jax.data.batches import completion_batch, length_bucket
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


def sample_groups(sampler: Sampler, tokenizer, prompt_set: PromptSet, prompts: Sequence[str], rollout: RolloutConfig,
                  key: jax.Array) -> tuple[list[list[str]], dict[str, np.ndarray]]:
    """m sampled responses to each of this host's B `prompts` (texts of `prompt_set`): texts `[B][m]` and the training
    batch (`completion_batch` rows of prompt + response, loss on the response including its stop token, one padded
    length on every host; `truncated [B*m]`)."""
    m = rollout.group_size
    ids = [prompt_tokens(tokenizer, prompt_set, p) for p in prompts]
    out = sampler.generate(ids, m, rollout.params, rng=key)
    texts = response_texts(tokenizer, out)
    longest = max(len(ids[r // m]) + int(out.lengths[r]) for r in range(len(texts)))
    batch = completion_batch([ids[i // m] for i in range(len(texts))],
                             [out.tokens[r, :out.lengths[r]] for r in range(len(texts))], sampler.pad_id,
                             length=length_bucket(int(distributed.host_max(longest))))
    batch["truncated"] = out.truncated
    return [texts[i * m:(i + 1) * m] for i in range(len(prompts))], batch
