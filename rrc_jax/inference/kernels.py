"""The JAX engine's kernels: jit-compiled prefill, extend, and a `lax.while_loop` decode over a `KVCache`.

- `prefill(model, ids, mask, cache_size=S)`: run left-padded prompts `[B, T]` into a fresh `KVCache` of S slots.
- `extend(model, cache, ids, mask)`: append more tokens (e.g. a judge question after a shared
  `[instruction, prompt]` prefix: `cache.branch(rows, size)` lets many rows continue one prefix row, which
  attention then reads once per step for all of them; `cache.take(rows)` copies it into every row).
- `decode(model, cache, params)`: sample up to `params.max_new_tokens` tokens per row, stopping early once every
  row has emitted a stop token.
- `generate(model, prompts, params)`: left-pads token lists to a power-of-two length bucket (compilations are
  shared across calls: one per batch size, bucket and `max_new_tokens`), prefills and decodes.

`rrc_jax.inference.engine.JaxSampler` builds the Sampler protocol on these; the trainer and the judge never call
them directly. `extend` and `decode` consume the cache they are given (donated: the new cache takes its buffers, so
a cache is never held twice). On several hosts every call is collective: each host passes its own rows (the same
number on every host) and gets its own rows back (`sharding.put_rows` / `host_rows`). Returned log-probs are those
of the model's raw distribution, `log_softmax(logits)[token]`, whatever the sampling temperature / top-k / top-p.
Shapes: B rows, T prompt tokens, S cache slots, N new tokens, V vocab.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rrc_jax.models.batches import bucket_length, pad_sequences, round_up
from rrc_jax.inference.sampler import SampleOutput, SamplingParams
from rrc_jax.models.decoder import Decoder
from rrc_jax.models.kv_cache import ATTENTION_BLOCK, KVCache, init_cache
from rrc_jax import distributed
from rrc_jax.sharding import host_rows, mesh_of, put_rows


def greedy_token(logits: jax.Array) -> jax.Array:
    """`argmax(logits, -1)` `[B]` (first index of the maximum) as two plain reductions: XLA's CPU backend runs
    the single variadic (value, index) reduce of `jnp.argmax` several times slower."""
    top = logits.max(axis=-1, keepdims=True)
    v = logits.shape[-1]
    idx = jnp.where(logits == top, jnp.arange(v, dtype=jnp.int32), v)
    return jnp.minimum(idx.min(axis=-1), v - 1)  # a NaN row stays in the vocabulary


def sample_token(logits: jax.Array, key: jax.Array, params: SamplingParams) -> jax.Array:
    """Next tokens `[B]` from `logits [B, V]` under temperature, top-k then top-p (nucleus) filtering. `key`: one
    key for the batch (a row's draw then depends on its place in the batch) or one per row `[B]` (row b draws with
    `key[b]` alone, whatever rows are beside it)."""
    if params.temperature == 0:
        return greedy_token(logits)
    draw = jax.random.categorical if key.ndim == 0 else jax.vmap(jax.random.categorical)
    x = logits / params.temperature
    if params.top_k == 0 and params.top_p >= 1:
        return draw(key, x).astype(jnp.int32)
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
    choice = draw(key, vals)
    return jnp.take_along_axis(idx, choice[:, None], axis=-1)[:, 0].astype(jnp.int32)


def row_keys(rng: jax.Array | int, streams: Sequence[int]) -> np.ndarray:
    """The key data `[R, ...]` uint32 of rows sampling from the streams `streams [R]` of `rng` (a PRNG key or an
    int seed): row r draws from `fold_in(rng, streams[r])`, whatever rows share its batch (`decode`)."""
    key = jax.random.key(rng) if isinstance(rng, int) else rng
    streams = jnp.asarray(np.asarray(streams, np.int64) % (1 << 32), jnp.uint32)
    return np.asarray(jax.random.key_data(jax.vmap(jax.random.fold_in, (None, 0))(key, streams)))


# ----------------------------------------------------------------------------------------------------------
# jit-compiled kernels over (graphdef, state)
# ----------------------------------------------------------------------------------------------------------

@functools.partial(jax.jit, static_argnums=(0,), static_argnames=("size", "ring"))
def _prefill(graphdef, state, ids, mask, *, size, ring):
    model = nnx.merge(graphdef, state)
    return model.extend(init_cache(model.cfg, ids.shape[0], size, ring=ring), ids, mask)


@functools.partial(jax.jit, static_argnums=(0,), donate_argnums=(2,))
def _extend(graphdef, state, cache, ids, mask):
    return nnx.merge(graphdef, state).extend(cache, ids, mask)


class Run(NamedTuple):
    """The decoding state of a batch's rows: tokens `[B, N]` (pad after each row's end), logprobs `[B, N]`, lengths
    `[B]` (tokens generated), stopped `[B]` (a stop token emitted), done `[B]` (stopped, N tokens, or no row to
    decode: padding, a lane waiting for a question)."""

    tokens: jax.Array
    logprobs: jax.Array
    lengths: jax.Array
    stopped: jax.Array
    done: jax.Array


def new_run(live: np.ndarray, n: int, pad_id: int) -> Run:
    """The `Run` of rows about to decode up to `n` tokens, `live [B]` the ones to decode (the others done)."""
    b = len(live)
    return Run(np.full((b, n), pad_id, np.int32), np.zeros((b, n), np.float32), np.zeros(b, np.int32),
               np.zeros(b, bool), ~np.asarray(live, bool))


@functools.partial(jax.jit, static_argnums=(0,), static_argnames=("params", "stop_ids", "pad_id", "impl"),
                   donate_argnums=(2, 4))
def _decode(graphdef, state, cache, keys, run, waiting, refill_at, *, params, stop_ids, pad_id, impl):
    """Decode until every row is done, or until `refill_at` of the rows marked `waiting [B]` are done (a lane with
    a question to take: `rrc_jax.inference.lanes`). Row b's token t draws with `fold_in(keys[b], t)` (its own
    stream, `keys [B]`) or, with one key for the batch, `fold_in(keys, step)`."""
    model = nnx.merge(graphdef, state)
    keys = jax.random.wrap_key_data(keys, impl=impl)  # [] the batch's key, or [B] each row's own stream
    b, n = cache.batch_size, params.max_new_tokens
    stop = jnp.asarray(stop_ids if stop_ids else (-1,), jnp.int32)
    rows = jnp.arange(b)

    def cond(carry):
        _, _, run = carry
        return ~jnp.all(run.done) & (jnp.sum(run.done & waiting) < refill_at)

    def body(carry):
        i, cache, (tokens, logprobs, lengths, stopped, done) = carry
        step_keys = (jax.random.fold_in(keys, i) if keys.ndim == 0
                     else jax.vmap(jax.random.fold_in)(keys, lengths))  # a row's t-th token: its own t-th draw
        tok = sample_token(cache.logits, step_keys, params)
        lp = jnp.take_along_axis(jax.nn.log_softmax(cache.logits, axis=-1), tok[:, None], axis=-1)[:, 0]
        active = ~done
        tok = jnp.where(active, tok, pad_id)
        column = jnp.where(active, lengths, n)  # (n: out of bounds, dropped)
        tokens = tokens.at[rows, column].set(tok, mode="drop")
        logprobs = logprobs.at[rows, column].set(lp, mode="drop")
        cache = model.extend(cache, tok[:, None], active[:, None])
        ends = active & jnp.isin(tok, stop)
        lengths = lengths + active
        return i + 1, cache, Run(tokens, logprobs, lengths, stopped | ends, done | ends | (lengths >= n))

    steps, cache, run = jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), cache, Run(*run)))
    return run, cache, steps  # the cache returned: its buffers are the donated input's


# ----------------------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------------------

def _pad_id(model: Decoder, pad_id: int | None) -> int:
    if pad_id is not None:
        return int(pad_id)
    return int(model.cfg.pad_token_id) if model.cfg.pad_token_id is not None else 0


PREFILL_CHUNK = 256  # tokens a row runs through the model per call (chunked prefill: a layer holds one chunk)


def prefill(model: Decoder, ids, mask, *, cache_size: int, ring: bool = True) -> KVCache:
    """A cache of `cache_size` slots holding the (left-padded) prompts `ids [B, T]`, `mask [B, T]` (this host's
    rows), run `PREFILL_CHUNK` tokens at a time. The sliding layers keep only their window (`KVCache.ring`) unless
    `ring=False`, which a cache to `branch` needs (its prefixes keep every slot)."""
    ids, mask = np.asarray(ids, np.int32), np.asarray(mask, bool)
    if ids.shape[1] > cache_size:
        raise ValueError(f"prompt of {ids.shape[1]} (padded) tokens is longer than the cache of {cache_size} slots; "
                         "raise cache_size or shorten the prompt")
    first, rest = (ids[:, :PREFILL_CHUNK], mask[:, :PREFILL_CHUNK]), (ids[:, PREFILL_CHUNK:], mask[:, PREFILL_CHUNK:])
    graphdef, state = nnx.split(model)
    cache = _prefill(graphdef, state, *put_rows(first, mesh_of(model)), size=cache_size, ring=ring)
    return extend(model, cache, *rest) if rest[0].shape[1] else cache


def extend(model: Decoder, cache: KVCache, ids, mask=None) -> KVCache:
    """`cache` with `ids [B, T]` (this host's rows, real where `mask`) appended, `PREFILL_CHUNK` tokens at a time;
    the input cache is consumed (donated to the result)."""
    ids = np.asarray(ids, np.int32)
    mask = np.ones(ids.shape, bool) if mask is None else np.asarray(mask, bool)
    end = int(cache.end)
    if end + ids.shape[1] > cache.size:
        raise ValueError(f"extending a cache holding {end} slots by {ids.shape[1]} tokens exceeds its "
                         f"{cache.size} slots; prefill with a larger cache_size")
    graphdef, state = nnx.split(model)
    for start in range(0, ids.shape[1], PREFILL_CHUNK):
        chunk = put_rows((ids[:, start:start + PREFILL_CHUNK], mask[:, start:start + PREFILL_CHUNK]), mesh_of(model))
        cache = _extend(graphdef, state, cache, *chunk)
    return cache


def decode(model: Decoder, cache: KVCache, params: SamplingParams, *, rng: jax.Array | int = 0,
           streams: Sequence[int] | None = None, pad_id: int | None = None,
           live: Sequence[bool] | None = None) -> SampleOutput:
    """Sample up to `params.max_new_tokens` after the cache's contents; see `SampleOutput`.

    `params.stop_token_ids=None` stops at the model's EOS ids; `pad_id` defaults to the model's pad id (else 0).
    `rng` is a PRNG key or an int seed. Without `streams` the batch draws with it together (a row's draws depend
    on its place: the rollouts' groups); with `streams [B]` (this host's rows) row b draws from its own stream
    `streams[b]` of it (`row_keys`), so its continuation depends on its stream and its cache alone. `live [B]`
    (this host's rows; default all): the rows to decode; the others, a chunk's padding, end before the first step
    (no tokens, length 0) and so never keep the loop running. The live rows' continuations do not depend on it.
    """
    n = params.max_new_tokens
    end = int(cache.end)
    if end + n > cache.size:
        raise ValueError(f"prompt ({end} slots) plus max_new_tokens={n} does not fit the cache of "
                         f"{cache.size} slots; prefill with cache_size >= {end + n}")
    key = jax.random.key(rng) if isinstance(rng, int) else rng
    mesh = mesh_of(model)
    keys = jax.random.key_data(key) if streams is None else put_rows(row_keys(key, streams), mesh)
    live = np.ones(cache.batch_size // jax.process_count(), bool) if live is None else np.asarray(live, bool)
    pad_id = _pad_id(model, pad_id)
    run, _, _ = decode_rows(model, cache, put_rows(new_run(live, n, pad_id), mesh), keys, params, pad_id=pad_id,
                         impl=str(jax.random.key_impl(key)))
    return SampleOutput(*(host_rows(x, mesh) for x in run_output(run)))


def to_the_end(live: np.ndarray, n: int, pad_id: int) -> tuple[Run, np.ndarray, np.ndarray]:
    """`_decode`'s run, waiting rows and refill count for rows `live [B]` decoding up to `n` tokens to the end."""
    return new_run(live, n, pad_id), np.zeros(len(live), bool), np.int32(len(live) + 1)


def run_output(run: Run) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """tokens, logprobs, lengths and truncated (N tokens without a stop token) of a `Run` (`SampleOutput`)."""
    return run.tokens, run.logprobs, run.lengths, (run.lengths >= run.tokens.shape[1]) & ~run.stopped


def decode_rows(model: Decoder, cache: KVCache, run: Run, keys: jax.Array, params: SamplingParams, *,
                pad_id: int, impl: str, waiting: jax.Array | None = None, refill_at: int = 0
                ) -> tuple[Run, KVCache, jax.Array]:
    """Continue `run` (consumed) over `cache` (consumed) until every row is done or, with `waiting [B]`, until
    `refill_at` of the waiting rows are done; returns the run, the cache and the steps decoded (`_decode`). `keys`: key data, one
    key for the batch or one per row (`row_keys`); `impl` its PRNG implementation."""
    stop = model.cfg.eos_token_ids if params.stop_token_ids is None else params.stop_token_ids
    if waiting is None:  # no lane waits: decode to the end
        waiting, refill_at = put_rows(np.zeros(cache.batch_size // jax.process_count(), bool), mesh_of(model)), \
            cache.batch_size + 1
    graphdef, state = nnx.split(model)
    return _decode(graphdef, state, cache, keys, run, waiting, jnp.int32(refill_at), params=params,
                   stop_ids=tuple(stop), pad_id=pad_id, impl=impl)


def generate(model: Decoder, prompts: Sequence[Sequence[int]], params: SamplingParams, *,
             rng: jax.Array | int = 0, pad_id: int | None = None, cache_size: int | None = None,
             group_size: int = 1, streams: Sequence[int] | None = None,
             live: Sequence[bool] | None = None) -> SampleOutput:
    """Sample continuations of a batch of token-id prompts of any lengths.

    Args:
      model: a `Decoder`.
      prompts: B lists of token ids (different lengths are left-padded to a power-of-two bucket).
      params: `SamplingParams` (N = `max_new_tokens`, temperature 0 = greedy, stop tokens).
      rng: PRNG key or int seed.
      pad_id: id written after a row ends (default: the model's pad id, else 0).
      cache_size: KV-cache slots (default: bucket + N rounded up to a multiple of `ATTENTION_BLOCK`). The longest
        prompt plus N must fit it (or, by default, the model's `max_position_embeddings`); otherwise a clear error.
      group_size: G continuations of every prompt (a GRPO group). Each prompt is prefilled once and shared by its
        G rows (`KVCache.branch`): attention reads it once per step for the whole group.
      streams: `[B * G]` each row's own random stream (`decode`; default: the batch draws together).
      live: `[B]` the prompts to continue (default all); the others are padding, their rows not decoded (`decode`).
    Returns:
      `SampleOutput` of numpy arrays: tokens `[B*G, N]`, logprobs `[B*G, N]`, lengths `[B*G]`, truncated `[B*G]`;
      prompt b's continuations are rows `b*G ... b*G + G - 1`.
    """
    if not prompts:
        raise ValueError("generate() got no prompts")
    if group_size < 1:
        raise ValueError(f"group_size={group_size} must be >= 1")
    n = params.max_new_tokens
    longest = int(distributed.host_max(max(len(p) for p in prompts)))  # one length bucket on every host
    if min(len(p) for p in prompts) == 0:
        raise ValueError("generate() got an empty prompt; every prompt needs at least one token (e.g. BOS)")
    limit = cache_size if cache_size is not None else model.cfg.max_position_embeddings
    if longest + n > limit:
        what = "the cache" if cache_size is not None else "the model's max_position_embeddings"
        raise ValueError(f"prompt of {longest} tokens plus max_new_tokens={n} exceeds {what} "
                         f"({limit}); shorten the prompt or lower max_new_tokens")
    bucket = min(bucket_length(longest), limit - n)
    pad = _pad_id(model, pad_id)
    ids, mask = pad_sequences(prompts, bucket, pad, "left")
    if group_size == 1:
        cache = prefill(model, ids, mask, cache_size=cache_size or round_up(bucket + n, ATTENTION_BLOCK))
    else:
        own = cache_size - bucket if cache_size else round_up(n, ATTENTION_BLOCK)
        cache = prefill(model, ids, mask, cache_size=bucket, ring=False).branch(group_size, size=own)
    live = None if live is None else np.repeat(np.asarray(live, bool), group_size)
    return decode(model, cache, params, rng=rng, streams=streams, pad_id=pad, live=live)
