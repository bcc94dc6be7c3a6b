"""Rotary position embeddings: the inverse frequencies of a `DecoderConfig` (the `default`, `linear` and `llama3`
scalings) and their application to query and key heads.

Shapes: B batch, T tokens, D head dim."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from rrc_jax.models.decoder_config import DecoderConfig


def rope_inv_freq(cfg: DecoderConfig) -> np.ndarray:
    """Inverse frequencies `[D/2]` (float32), with `linear` or `llama3` scaling (as transformers computes them)."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / d))
    p = dict(cfg.rope_scaling)
    if cfg.rope_type == "linear":
        inv = inv / p["factor"]
    elif cfg.rope_type == "llama3":
        factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
        old_len = p.get("original_max_position_embeddings", cfg.max_position_embeddings)
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv = np.where(medium, smoothed, scaled)
    return inv.astype(np.float32)


def rope_cos_sin(positions: jax.Array, inv_freq) -> tuple[jax.Array, jax.Array]:
    """cos, sin `[B, T, D]` (float32) for integer `positions [B, T]`."""
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate `x [B, T, ..., D]` (any head axes) by `cos, sin [B, T, D]` (rotate-half, as Llama / Qwen2)."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    heads = (1,) * (x.ndim - 3)
    cos, sin = (c.reshape(*c.shape[:2], *heads, c.shape[-1]).astype(x.dtype) for c in (cos, sin))
    return x * cos + rotated * sin
