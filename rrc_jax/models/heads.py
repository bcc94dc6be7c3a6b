"""Scalar value head: the discriminative reward model's score `r_phi(x, y)` (Eq. 1)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from rrc_jax import sharding


class ScalarHead(nnx.Module):
    """`h [..., E] -> h @ w [...]` (float32), no bias, as transformers' `*ForSequenceClassification.score`.

    Initialized to zero so a fresh DRM scores every response equally.
    """

    def __init__(self, hidden_size: int, *, param_dtype, rngs: nnx.Rngs):
        del rngs
        self.kernel = sharding.param(jnp.zeros((hidden_size,), param_dtype), ("embed",))

    def __call__(self, h: jax.Array) -> jax.Array:
        return jnp.dot(h, self.kernel[...].astype(h.dtype), preferred_element_type=jnp.float32)
