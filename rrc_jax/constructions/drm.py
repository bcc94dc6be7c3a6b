"""DRM: the discriminative reward model's value head as the reward (Eq. 1's model; the RRC paper's baseline)."""

from __future__ import annotations

import dataclasses

from rrc_jax.constructions.base import Construction, RewardResult
from rrc_jax.rm.scores import DRMScorer
from rrc_jax.settings import field_error


@dataclasses.dataclass(frozen=True)
class DRMSettings:
    max_batch: int = 256  # sequences per value-head call

    def __post_init__(self):
        if self.max_batch < 1:
            raise field_error("reward.drm", "max_batch", f"{self.max_batch} must be >= 1")


class DRMReward(DRMScorer, Construction):
    """The DRM's score of `prompt + response` as the reward (`rrc_jax.rm.scores.DRMScorer`: in the DRM's own
    tokenizer and chat template)."""

    kind = "drm"
    Settings = DRMSettings
    baseline = True

    @classmethod
    def roles(cls, s) -> frozenset[str]:
        return frozenset({"drm"})

    @classmethod
    def absolute_scale(cls, s) -> bool:
        return True

    @classmethod
    def from_settings(cls, s, ctx) -> DRMReward:
        return cls(ctx.roles.model("drm"), ctx.roles.tokenizer("drm"), s.constructions["drm"].max_batch)

    def construct(self, prompts, responses, prompt_index, step) -> RewardResult:
        b, m = len(prompts), len(responses[0]) if responses else 0
        flat = self.scores([p for p in prompts for _ in range(m)], [o for g in responses for o in g])
        return RewardResult(flat.reshape(b, m))
