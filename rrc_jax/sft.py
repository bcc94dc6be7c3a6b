"""Supervised losses and steps shared by every trainer: next-token SFT on completions (the GRM's Eq. 2, the toy
policy's pre-training) and the Bradley-Terry DRM objective (Eq. 1).

Batches are dicts of numpy / jax arrays, right-padded:

- SFT: `ids [B, T]`, `mask [B, T]` (real tokens), `loss_mask [B, T]` (tokens whose log-likelihood is trained:
  the completion, i.e. the judge's rationale + verdict for a GRM, the response for a policy).
- Pairs: `chosen_ids`, `chosen_mask`, `rejected_ids`, `rejected_mask` `[B, T]`; optional `margin [B]`.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rrc_jax.models import Decoder
from rrc_jax.rewards import bradley_terry_loss
from rrc_jax.sampling import pad_sequences


def sft_batch(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], length: int, pad_id: int
              ) -> dict[str, np.ndarray]:
    """Right-padded `[prompt, completion]` rows with a loss mask over the completion tokens."""
    rows = [list(p) + list(c) for p, c in zip(prompts, completions)]
    too_long = [i for i, r in enumerate(rows) if len(r) > length]
    if too_long:
        raise ValueError(f"example {too_long[0]} has {len(rows[too_long[0]])} tokens, more than max_len={length}; "
                         "raise max_len")
    ids, mask = pad_sequences(rows, length, pad_id, "right")
    loss_mask = np.zeros_like(mask)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        loss_mask[i, len(p):len(p) + len(c)] = True
    return {"ids": ids, "mask": mask, "loss_mask": loss_mask}


def sft_loss(model: Decoder, batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean negative log-likelihood of the `loss_mask` tokens (Eq. 2 over the judge's rationale and verdict)."""
    logp = model.token_logprobs(batch["ids"], batch["mask"])
    w = batch["loss_mask"].astype(jnp.float32)
    n = jnp.maximum(w.sum(), 1.0)
    loss = -(logp * w).sum() / n
    return loss, {"loss": loss, "tokens": w.sum()}


def bt_loss(model: Decoder, batch: dict[str, jax.Array], center_coef: float = 0.0
            ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Bradley-Terry loss of the value head on chosen / rejected pairs (Eq. 1), with its pairwise accuracy."""
    r_c = model.values(batch["chosen_ids"], batch["chosen_mask"])
    r_r = model.values(batch["rejected_ids"], batch["rejected_mask"])
    loss = bradley_terry_loss(r_c, r_r, margin=batch.get("margin"), center_coef=center_coef)
    return loss, {"loss": loss, "accuracy": jnp.mean((r_c > r_r).astype(jnp.float32))}


def make_optimizer(model: Decoder, learning_rate: float | optax.Schedule, *, weight_decay: float = 0.0,
                   grad_clip: float = 1.0) -> nnx.Optimizer:
    """AdamW with global-norm clipping over the model's parameters."""
    tx = optax.chain(optax.clip_by_global_norm(grad_clip), optax.adamw(learning_rate, weight_decay=weight_decay))
    return nnx.Optimizer(model, tx, wrt=nnx.Param)


@nnx.jit(static_argnames=("kind",))
def train_step(model: Decoder, optimizer: nnx.Optimizer, batch: dict[str, jax.Array], kind: str = "sft"
               ) -> dict[str, jax.Array]:
    """One optimizer step on `sft_loss` (kind='sft') or `bt_loss` (kind='bt'); returns the step's metrics."""
    loss_fn = sft_loss if kind == "sft" else bt_loss
    grads, metrics = nnx.grad(loss_fn, has_aux=True)(model, batch)
    optimizer.update(model, grads)
    return metrics
