"""Input validation shared by the reward constructions and the GRPO loss.

Shape and option checks are static and always run. Value checks (negative counts, probabilities outside [0, 1])
need concrete numbers, so they run only when the input is not a JAX tracer: call the public functions outside
``jax.jit`` to get them, or validate upstream when you trace them inside your own jitted step.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
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
    if not is_concrete(x):
        return
    a = np.asarray(x)
    if a.size and not np.all(np.isfinite(a)):
        raise ValueError(f"{name} has NaN or infinite entries; counts and weights must be finite.")
    if a.size and np.min(a) < 0:
        raise ValueError(
            f"{name} has negative entries (min {np.min(a)}); vote counts are non-negative integers. "
            f"Abstentions are simply not counted."
        )


def check_option(value: str, allowed: Sequence[str], name: str) -> None:
    """Raise ValueError unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"unknown {name}={value!r}; use one of {', '.join(repr(a) for a in allowed)}.")
