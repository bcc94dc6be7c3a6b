"""Discriminative reward model (DRM) objective: the Bradley-Terry loss (Eq. 1)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rrc_jax.rewards._checks import check_real


def bradley_terry_loss(r_chosen, r_rejected, margin=None, center_coef: float = 0.0) -> jax.Array:
    """Bradley-Terry loss, Eq. 1: ``-mean(log sigmoid(r_chosen - r_rejected - margin))`` + optional centering.

    Args:
      r_chosen: ``[batch]`` scalar rewards of the preferred responses ``r_phi(x, y_a)``.
      r_rejected: ``[batch]`` scalar rewards of the rejected responses ``r_phi(x, y_b)``.
      margin: optional ``[batch]`` (or scalar) margin subtracted inside the sigmoid (Llama-2 style: a pair labelled
        with a stronger preference must be separated by more). ``None`` is Eq. 1 exactly.
      center_coef: weight of the reward-centering term ``center_coef * mean((r_chosen + r_rejected) ** 2)``, which
        pins the free offset of Bradley-Terry rewards near zero. 0 disables it.

    Returns:
      float32 scalar loss, differentiable with respect to both reward arrays. ``log_sigmoid`` keeps it finite for
      large reward gaps.
    """
    check_real(r_chosen, "r_chosen")
    check_real(r_rejected, "r_rejected")
    r_c = jnp.asarray(r_chosen, dtype=jnp.float32)
    r_r = jnp.asarray(r_rejected, dtype=jnp.float32)
    if r_c.ndim != 1 or r_c.shape != r_r.shape:
        raise ValueError(
            f"r_chosen and r_rejected must both be [batch] with the same shape, got {r_c.shape} and {r_r.shape}; "
            f"squeeze a trailing scalar-head axis with r[..., 0]."
        )
    diff = r_c - r_r
    if margin is not None:
        m = jnp.asarray(margin, dtype=jnp.float32)
        if m.ndim > 1 or (m.ndim == 1 and m.shape != r_c.shape):
            raise ValueError(f"margin must be a scalar or [batch] = {r_c.shape}, got shape {m.shape}.")
        diff = diff - m
    loss = -jnp.mean(jax.nn.log_sigmoid(diff))  # Eq. 1
    return loss + center_coef * jnp.mean((r_c + r_r) ** 2)
