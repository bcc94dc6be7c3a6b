"""Input validation shared by the reward constructions and the GRPO loss.

Shape and option checks are static and always run. Value checks (negative counts, probabilities outside [0, 1])
need concrete numbers, so they run only when the input is not a JAX tracer: call the public functions outside
``jax.jit`` to get them, or validate upstream when you trace them inside your own jitted step.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np


def is_concrete(x: Any) -> bool:
    """True when ``x`` holds concrete values (numpy, Python or a non-traced jax.Array)."""
    return not isinstance(x, jax.core.Tracer)


def check_rank(x: Any, rank: int, name: str, layout: str) -> tuple[int, ...]:
    """Raise ValueError unless ``x`` has ``rank`` dimensions; returns its shape. ``layout`` names the axes."""
    shape = tuple(np.shape(x))
    if len(shape) != rank:
        raise ValueError(
            f"{name} must have rank {rank} with layout {layout}, got shape {shape}; "
            f"add or remove axes (a single group needs a leading batch axis of 1: x[None])."
        )
    return shape


def check_real(x: Any, name: str) -> None:
    """Raise ValueError unless ``x`` has a boolean, integer or floating dtype."""
    dtype = np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype
    if not (np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.floating) or dtype == np.bool_):
        raise ValueError(f"{name} must hold real numbers (int, float or bool), got dtype {dtype}.")


def check_nonnegative(x: Any, name: str) -> None:
    """Raise ValueError if a concrete ``x`` has a negative or non-finite entry (vote counts, weights)."""
    if not is_concrete(x) or np.size(x) == 0:
        return
    if isinstance(x, jax.Array) and any(d.platform != "cpu" for d in x.devices()):
        # On an accelerator: reduce where the array lives, one dispatch, two scalars cross to host. (On CPU numpy
        # reads the buffer without a copy and reduces faster than XLA's scalar reductions.)
        low, finite = jax.device_get(_min_and_finite(x))
    else:
        a = np.asarray(x)
        low = np.min(a)
        finite = bool(np.all(np.isfinite(a))) if np.issubdtype(a.dtype, np.floating) else True
    if not finite:
        raise ValueError(f"{name} has NaN or infinite entries; counts and weights must be finite.")
    if low < 0:
        raise ValueError(
            f"{name} has negative entries (min {low}); vote counts are non-negative integers. "
            f"Abstentions are simply not counted."
        )


@jax.jit
def _min_and_finite(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    if x.dtype == jnp.bool_:
        return jnp.zeros((), jnp.int32), jnp.ones((), bool)
    finite = jnp.all(jnp.isfinite(x)) if jnp.issubdtype(x.dtype, jnp.floating) else jnp.ones((), bool)
    return jnp.min(x), finite


def check_option(value: str, allowed: Sequence[str], name: str) -> None:
    """Raise ValueError unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"unknown {name}={value!r}; use one of {', '.join(repr(a) for a in allowed)}.")


def check_votes(votes) -> None:
    """Raise ValueError unless ``votes`` (the voting budget V) is a positive Python int."""
    if isinstance(votes, bool) or not isinstance(votes, int) or votes < 1:
        raise ValueError(f"votes={votes!r} must be a positive int (the voting budget V).")
