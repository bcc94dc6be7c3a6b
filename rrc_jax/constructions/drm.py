"""DRM: the discriminative reward model's value head as the reward (Eq. 1's model; the RRC paper's baseline)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx

from rrc_jax import distributed
from rrc_jax.constructions.base import Construction, RewardResult
from rrc_jax.data.batches import pad_sequences, round_up
from rrc_jax.errors import ConfigError
from rrc_jax.models import Decoder
from rrc_jax.rm.examples import scored_ids
from rrc_jax.settings import field_error
from rrc_jax.sharding import host_row_multiple, host_rows, mesh_of, put_rows, use_mesh


@jax.jit
def _values(graphdef, state, ids, mask):
    return nnx.merge(graphdef, state).values(ids, mask)


@dataclasses.dataclass(frozen=True)
class DRMSettings:
    max_batch: int = 256  # sequences per value-head call

    def __post_init__(self):
        if self.max_batch < 1:
            raise field_error("reward.drm", "max_batch", f"{self.max_batch} must be >= 1")


class DRMReward(Construction):
    """The DRM's score of `prompt + response`, rendered with the DRM's *own* tokenizer and chat template
    (`rrc_jax.rm.examples.scored_ids`): a DRM need not share the policy's vocabulary."""

    kind = "drm"
    Settings = DRMSettings
    baseline = True

    def __init__(self, model: Decoder, tokenizer, max_batch: int = 256):
        if not model.cfg.value_head:
            raise ConfigError("the DRM has no value head (score.weight); give a reward model trained with Eq. 1")
        self.model, self.tokenizer, self.max_batch = model, tokenizer, max_batch

    @classmethod
    def roles(cls, config) -> frozenset[str]:
        return frozenset({"drm"})

    @classmethod
    def absolute_scale(cls, config) -> bool:
        return True

    @classmethod
    def from_config(cls, config, ctx) -> DRMReward:
        return cls(ctx.roles.model("drm"), ctx.roles.tokenizer("drm"), cls.settings(config).max_batch)

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
            with use_mesh(mesh):  # the DRM's own layout (`mesh.drm`)
                out[chunk] = host_rows(_values(graphdef, state, ids, mask), mesh)[:len(chunk)]
        return out

    def construct(self, prompts, responses, prompt_index, step) -> RewardResult:
        b, m = len(prompts), len(responses[0]) if responses else 0
        flat = self.scores([p for p in prompts for _ in range(m)], [o for g in responses for o in g])
        return RewardResult(flat.reshape(b, m))
