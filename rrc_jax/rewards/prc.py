"""Probability-based reward construction (PRC), the baseline RRC replaces (Eq. 5), and its saturation statistic.

PRC prompts the GRM with ``[instruction, x, o, o_ref]`` and uses the probability of the verdict token "A" (the
candidate ``o`` is better than the reference) as the reward. With chain-of-thought judges this probability
saturates near 0 or 1 (Table 6: 88.3% of samples in ``[0, 0.1] U [0.9, 1]``), which :func:`prc_saturation`
measures.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rrc_jax.rewards._checks import check_real, is_concrete


def _check_probabilities(p_a, name: str = "p_a") -> None:
    check_real(p_a, name)
    if is_concrete(p_a):
        a = np.asarray(p_a, dtype=np.float64)
        if a.size and not (np.all(np.isfinite(a)) and np.min(a) >= 0.0 and np.max(a) <= 1.0):
            raise ValueError(
                f"{name} must hold probabilities in [0, 1]; got min {np.min(a)}, max {np.max(a)} (NaN counts as "
                f"invalid). Pass pi(w = A | s_o), e.g. jax.nn.softmax(logits)[..., token_a], not a logit."
            )


def prc_rewards(p_a) -> jax.Array:
    """PRC rewards, Eq. 5: ``r(x, o) = pi_phi(w = A | s_o)``, the judge's probability that ``o`` beats ``o_ref``.

    Args:
      p_a: ``[batch, group]`` (any shape works) probabilities of the "A" verdict token.

    Returns:
      float32 rewards of the same shape.
    """
    _check_probabilities(p_a)
    return jnp.asarray(p_a, dtype=jnp.float32)


def prc_saturation(p_a, low: float = 0.1, high: float = 0.9) -> jax.Array:
    """Share of probabilities in the extreme buckets ``[0, low] U [high, 1]`` (Table 6's saturation statistic).

    Args:
      p_a: probabilities of any shape; every entry counts once.
      low, high: bucket edges, ``0 <= low < high <= 1`` (Table 6 uses 0.1 and 0.9; both edges are inclusive).

    Returns:
      float32 scalar in ``[0, 1]`` (0 for an empty input).
    """
    if not 0.0 <= low < high <= 1.0:
        raise ValueError(f"need 0 <= low < high <= 1 for the saturation buckets, got low={low}, high={high}.")
    _check_probabilities(p_a)
    p = jnp.asarray(p_a, dtype=jnp.float32)
    if p.size == 0:
        return jnp.zeros((), jnp.float32)
    return jnp.mean(((p <= low) | (p >= high)).astype(jnp.float32))
