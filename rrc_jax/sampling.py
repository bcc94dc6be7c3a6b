"""Batched KV-cache sampler: jit-compiled prefill, optional extend, and a `lax.while_loop` decode.

Three steps, each jit-compiled once per shape:

- `prefill(model, ids, mask, cache_size=S)`: run left-padded prompts `[B, T]` into a fresh `KVCache` of S slots.
- `extend(model, cache, ids, mask)`: append more tokens (e.g. a judge question after a shared
  `[instruction, prompt]` prefix: `cache.branch(rows, size)` lets many rows continue one prefix row, which
  attention then reads once per step for all of them; `cache.take(rows)` copies it into every row).
- `decode(model, cache, max_new_tokens=N, ...)`: sample up to N tokens per row, stopping early once every row
  has emitted a stop token.

`generate(model, prompts, ...)` does the usual thing in one call: it left-pads token lists to a power-of-two
length bucket (so compilations are shared across calls: one per batch size, bucket and `max_new_tokens`),
prefills, and decodes.

Returned log-probs are those of the model's raw distribution, `log_softmax(logits)[token]`, whatever the sampling
temperature / top-k / top-p (what GRPO needs as "old" log-probs). Shapes: B rows, T prompt tokens, S cache slots,
N new tokens, V vocab.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rrc_jax.models.decoder import ATTENTION_BLOCK, Decoder, KVCache, init_cache

MIN_BUCKET = 16


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. `temperature=0` is greedy; `top_k=0` and `top_p=1` switch those filters off."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0 (0 = greedy)")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} must be >= 0 (0 = off)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1] (1 = off)")


class SampleOutput(NamedTuple):
    """tokens `[B, N]` (pad after each row's end), logprobs `[B, N]` (0 after the end), lengths `[B]` (generated
    tokens including the stop token), truncated `[B]` (no stop token within N)."""

    tokens: np.ndarray
    logprobs: np.ndarray
    lengths: np.ndarray
    truncated: np.ndarray


def greedy_token(logits: jax.Array) -> jax.Array:
    """`argmax(logits, -1)` `[B]` (first index of the maximum) as two plain reductions: XLA's CPU backend runs
    the single variadic (value, index) reduce of `jnp.argmax` several times slower."""
    top = logits.max(axis=-1, keepdims=True)
    v = logits.shape[-1]
    idx = jnp.where(logits == top, jnp.arange(v, dtype=jnp.int32), v)
    return jnp.minimum(idx.min(axis=-1), v - 1)  # a NaN row stays in the vocabulary


def sample_token(logits: jax.Array, key: jax.Array, params: SamplingParams) -> jax.Array:
    """Next tokens `[B]` from `logits [B, V]` under temperature, top-k then top-p (nucleus) filtering."""
    if params.temperature == 0:
        return greedy_token(logits)
    x = logits / params.temperature
    if params.top_k == 0 and params.top_p >= 1:
        return jax.random.categorical(key, x, axis=-1).astype(jnp.int32)
    if params.top_k > 0:
        vals, idx = jax.lax.top_k(x, min(params.top_k, x.shape[-1]))
    else:
        idx = jnp.argsort(-x, axis=-1)
        vals = jnp.take_along_axis(x, idx, axis=-1)
    if params.top_p < 1:
        probs = jax.nn.softmax(vals, axis=-1)
        # keep the smallest prefix whose mass reaches top_p (the token that crosses it included)
        keep = jnp.cumsum(probs, axis=-1) - probs < params.top_p
        vals = jnp.where(keep, vals, -jnp.inf)
    choice = jax.random.categorical(key, vals, axis=-1)
    return jnp.take_along_axis(idx, choice[:, None], axis=-1)[:, 0].astype(jnp.int32)


# ----------------------------------------------------------------------------------------------------------
# jit-compiled kernels over (graphdef, state)
# ----------------------------------------------------------------------------------------------------------

@functools.partial(jax.jit, static_argnums=(0,), static_argnames=("size",))
def _prefill(graphdef, state, ids, mask, *, size):
    model = nnx.merge(graphdef, state)
    return model.extend(init_cache(model.cfg, ids.shape[0], size), ids, mask)


@functools.partial(jax.jit, static_argnums=(0,))
def _extend(graphdef, state, cache, ids, mask):
    return nnx.merge(graphdef, state).extend(cache, ids, mask)


@functools.partial(jax.jit, static_argnums=(0,), static_argnames=("max_new_tokens", "params", "stop_ids", "pad_id"))
def _decode(graphdef, state, cache, rng, *, max_new_tokens, params, stop_ids, pad_id):
    model = nnx.merge(graphdef, state)
    b, n = cache.batch_size, max_new_tokens
    stop = jnp.asarray(stop_ids if stop_ids else (-1,), jnp.int32)

    def cond(carry):
        i, _, _, _, done, _ = carry
        return (i < n) & ~jnp.all(done)

    def body(carry):
        i, cache, tokens, logprobs, done, lengths = carry
        tok = sample_token(cache.logits, jax.random.fold_in(rng, i), params)
        lp = jnp.take_along_axis(jax.nn.log_softmax(cache.logits, axis=-1), tok[:, None], axis=-1)[:, 0]
        active = ~done
        tok = jnp.where(active, tok, pad_id)
        tokens = tokens.at[:, i].set(tok)
        logprobs = logprobs.at[:, i].set(jnp.where(active, lp, 0.0))
        cache = model.extend(cache, tok[:, None], active[:, None])
        done = done | (active & jnp.isin(tok, stop))
        return i + 1, cache, tokens, logprobs, done, lengths + active

    init = (jnp.zeros((), jnp.int32), cache, jnp.full((b, n), pad_id, jnp.int32), jnp.zeros((b, n), jnp.float32),
            jnp.zeros((b,), bool), jnp.zeros((b,), jnp.int32))
    _, cache, tokens, logprobs, done, lengths = jax.lax.while_loop(cond, body, init)
    return tokens, logprobs, lengths, ~done


# ----------------------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------------------

def bucket_length(n: int, minimum: int = MIN_BUCKET) -> int:
    """The padded length used for `n` tokens: the next power of two, at least `minimum`."""
    return max(minimum, 1 << max(0, int(n) - 1).bit_length())


def length_bucket(n: int) -> int:
    """A finer padded length for n tokens: quarter steps of `bucket_length(n)` (at least 16), so padding wastes
    at most about a third while compilations stay at four per octave."""
    b = bucket_length(n)
    return min(b, round_up(n, max(16, b // 4)))


def round_up(n: int, multiple: int) -> int:
    """`n` rounded up to a multiple of `multiple` (cache sizes: multiples of the attention block are read only
    as far as they are filled)."""
    return -(-int(n) // multiple) * multiple


def pad_sequences(seqs: Sequence[Sequence[int]], length: int, pad_id: int, side: str = "left"
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Token lists -> ids `[B, length]` int32 and mask `[B, length]` bool, padded on `side` ('left' | 'right')."""
    if side not in ("left", "right"):
        raise ValueError(f"side={side!r}: use 'left' or 'right'")
    ids = np.full((len(seqs), length), pad_id, np.int32)
    mask = np.zeros((len(seqs), length), bool)
    for i, s in enumerate(seqs):
        if len(s) > length:
            raise ValueError(f"sequence {i} has {len(s)} tokens, more than the padded length {length}")
        sl = slice(length - len(s), length) if side == "left" else slice(0, len(s))
        ids[i, sl] = np.asarray(s, np.int32)
        mask[i, sl] = True
    return ids, mask


def _pad_id(model: Decoder, pad_id: int | None) -> int:
    if pad_id is not None:
        return int(pad_id)
    return int(model.cfg.pad_token_id) if model.cfg.pad_token_id is not None else 0


def prefill(model: Decoder, ids, mask, *, cache_size: int) -> KVCache:
    """A cache of `cache_size` slots holding the (left-padded) prompts `ids [B, T]`, `mask [B, T]`."""
    ids, mask = jnp.asarray(ids, jnp.int32), jnp.asarray(mask, bool)
    if ids.shape[1] > cache_size:
        raise ValueError(f"prompt of {ids.shape[1]} (padded) tokens is longer than the cache of {cache_size} slots; "
                         "raise cache_size or shorten the prompt")
    graphdef, state = nnx.split(model)
    return _prefill(graphdef, state, ids, mask, size=cache_size)


def extend(model: Decoder, cache: KVCache, ids, mask=None) -> KVCache:
    """`cache` with `ids [B, T]` (real where `mask`) appended; the input cache is left unchanged."""
    ids = jnp.asarray(ids, jnp.int32)
    mask = jnp.ones(ids.shape, bool) if mask is None else jnp.asarray(mask, bool)
    end = int(cache.end)
    if end + ids.shape[1] > cache.size:
        raise ValueError(f"extending a cache holding {end} slots by {ids.shape[1]} tokens exceeds its "
                         f"{cache.size} slots; prefill with a larger cache_size")
    graphdef, state = nnx.split(model)
    return _extend(graphdef, state, cache, ids, mask)


def decode(model: Decoder, cache: KVCache, *, max_new_tokens: int, rng: jax.Array | int = 0,
           sampling: SamplingParams = SamplingParams(), stop_token_ids: Sequence[int] | None = None,
           pad_id: int | None = None) -> SampleOutput:
    """Sample up to `max_new_tokens` after the cache's contents; see `SampleOutput`.

    `stop_token_ids` defaults to the model's EOS ids; `pad_id` to its pad id (else 0). `rng` is a PRNG key or an
    int seed; results are deterministic for a given key.
    """
    cfg = model.cfg
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
    end = int(cache.end)
    if end + max_new_tokens > cache.size:
        raise ValueError(f"prompt ({end} slots) plus max_new_tokens={max_new_tokens} does not fit the cache of "
                         f"{cache.size} slots; prefill with cache_size >= {end + max_new_tokens}")
    stop = tuple(int(t) for t in (cfg.eos_token_ids if stop_token_ids is None else stop_token_ids))
    pad = _pad_id(model, pad_id)
    key = jax.random.key(rng) if isinstance(rng, int) else rng
    graphdef, state = nnx.split(model)
    out = _decode(graphdef, state, cache, key, max_new_tokens=max_new_tokens, params=sampling, stop_ids=stop,
                  pad_id=pad)
    return SampleOutput(*(np.asarray(x) for x in out))


def generate(model: Decoder, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, rng: jax.Array | int = 0,
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             stop_token_ids: Sequence[int] | None = None, pad_id: int | None = None,
             cache_size: int | None = None, group_size: int = 1) -> SampleOutput:
    """Sample continuations of a batch of token-id prompts of any lengths.

    Args:
      model: a `Decoder`.
      prompts: B lists of token ids (different lengths are left-padded to a power-of-two bucket).
      max_new_tokens: N, the most tokens generated per row.
      rng: PRNG key or int seed.
      temperature, top_k, top_p: see `SamplingParams` (temperature 0 = greedy).
      stop_token_ids: ids that end a row (default: the model's EOS ids).
      pad_id: id written after a row ends (default: the model's pad id, else 0).
      cache_size: KV-cache slots (default: bucket + N rounded up to a multiple of `ATTENTION_BLOCK`). The longest
        prompt plus N must fit it (or, by default, the model's `max_position_embeddings`); otherwise a clear error.
      group_size: G continuations of every prompt (a GRPO group). Each prompt is prefilled once and shared by its
        G rows (`KVCache.branch`): attention reads it once per step for the whole group.
    Returns:
      `SampleOutput` of numpy arrays: tokens `[B*G, N]`, logprobs `[B*G, N]`, lengths `[B*G]`, truncated `[B*G]`;
      prompt b's continuations are rows `b*G ... b*G + G - 1`.
    """
    if not prompts:
        raise ValueError("generate() got no prompts")
    if group_size < 1:
        raise ValueError(f"group_size={group_size} must be >= 1")
    longest = max(len(p) for p in prompts)
    if min(len(p) for p in prompts) == 0:
        raise ValueError("generate() got an empty prompt; every prompt needs at least one token (e.g. BOS)")
    limit = cache_size if cache_size is not None else model.cfg.max_position_embeddings
    if longest + max_new_tokens > limit:
        what = "the cache" if cache_size is not None else "the model's max_position_embeddings"
        raise ValueError(f"prompt of {longest} tokens plus max_new_tokens={max_new_tokens} exceeds {what} "
                         f"({limit}); shorten the prompt or lower max_new_tokens")
    bucket = min(bucket_length(longest), limit - max_new_tokens)
    pad = _pad_id(model, pad_id)
    ids, mask = pad_sequences(prompts, bucket, pad, "left")
    if group_size == 1:
        cache = prefill(model, ids, mask, cache_size=cache_size or round_up(bucket + max_new_tokens, ATTENTION_BLOCK))
    else:
        own = cache_size - bucket if cache_size else round_up(max_new_tokens, ATTENTION_BLOCK)
        rows = np.repeat(np.arange(len(prompts), dtype=np.int32), group_size)
        cache = prefill(model, ids, mask, cache_size=bucket).branch(rows, size=own)
    return decode(model, cache, max_new_tokens=max_new_tokens, rng=rng,
                  sampling=SamplingParams(temperature, top_k, top_p), stop_token_ids=stop_token_ids, pad_id=pad)
