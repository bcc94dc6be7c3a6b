"""Supervised losses of the reward-model trainers, as `rrc_jax.rl.learner` loss functions: next-token SFT on
completions (the GRM's Eq. 2, the toy policy's pre-training) and the Bradley-Terry DRM objective (Eq. 1).

Batches are dicts of right-padded arrays:

- SFT (`rrc_jax.models.batches.completion_batch`): `ids [B, T]`, `mask [B, T]` (real tokens), `loss_mask [B, T]`
  (tokens whose log-likelihood is trained: the judge's rationale + verdict for a GRM, the response for a policy).
- Pairs (`rrc_jax.rm.examples.drm_batches`): `chosen_ids`, `chosen_mask`, `rejected_ids`, `rejected_mask`
  `[B, T]`; optional `margin [B]`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rrc_jax.models import Decoder
from rrc_jax.rewards import bradley_terry_loss


def sft_loss(model: Decoder, batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean negative log-likelihood of the `loss_mask` tokens (Eq. 2 over the judge's rationale and verdict);
    `weight` = the number of those tokens (a token mean)."""
    logp = model.token_logprobs(batch["ids"], batch["mask"])
    w = batch["loss_mask"].astype(jnp.float32)
    n = jnp.maximum(w.sum(), 1.0)
    return -(logp * w).sum() / n, {"tokens": w.sum(), "weight": w.sum()}


def bt_loss(model: Decoder, batch: dict[str, jax.Array], center_coef: float = 0.0
            ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Bradley-Terry loss of the value head on chosen / rejected pairs (Eq. 1), with its pairwise accuracy."""
    r_c = model.values(batch["chosen_ids"], batch["chosen_mask"])
    r_r = model.values(batch["rejected_ids"], batch["rejected_mask"])
    loss = bradley_terry_loss(r_c, r_r, margin=batch.get("margin"), center_coef=center_coef)
    return loss, {"accuracy": jnp.mean((r_c > r_r).astype(jnp.float32))}


LOSSES = {"sft": sft_loss, "bt": bt_loss}
