"""Attention kernels: dense, blockwise (training over long sequences), over a KV cache's blocks, over shared
prefixes (`KVCache.branch`) and over a sliding layer's ring buffer; each is an online softmax step over key blocks,
with Gemma's soft cap and query scaling (`Scoring`) and a sliding window (`Window`).

Shapes: B batch, T queries, S keys, K kv heads, G = H / K query heads per kv head, D head dim."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rrc_jax import sharding
from rrc_jax.models.kv_cache import KV_K, KV_V, RingStep, ring_write, rows_at


_MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)  # finite: a query with no visible key gives no NaN


def softcap(x: jax.Array, cap: float) -> jax.Array:
    """`cap * tanh(x / cap)`: `x` squashed smoothly into `(-cap, cap)` (Gemma 2's logit soft-capping)."""
    return cap * jnp.tanh(x / cap)


@dataclasses.dataclass(frozen=True)
class Scoring:
    """How q.k products become attention logits: times `scale` (`head_dim^-1/2`, or Gemma's
    `query_pre_attn_scalar^-1/2`), then soft-capped at `cap` when it is set (Gemma 2)."""

    scale: float
    cap: float | None = None

    def __call__(self, s: jax.Array) -> jax.Array:
        s = s * self.scale
        return s if self.cap is None else softcap(s, self.cap)


class Window(NamedTuple):
    """A layer's sliding window: a query sees a key only when `query - key < size` (their RoPE positions, as
    transformers' `sliding_window_overlay`). size `[]` int32 (`NO_WINDOW` for a full layer), query `[B, T]`, key
    `[B, S]` (the attention's own keys or cache slots), prefix: per level of a branched cache's prefixes, their
    slots' positions `[J, P_l, N_b]` (`prefix_blocks`, `decoder.prefix_positions`), else None."""

    size: jax.Array
    query: jax.Array
    key: jax.Array
    prefix: tuple[jax.Array, ...] | None = None


def _scores(q: jax.Array, k: jax.Array) -> jax.Array:
    """Unscaled attention scores `[B, K, G, T, S]` (float32) of q `[B, K, G, T, D]` against k `[B, K, D, S]`.
    Rows and kv heads stay two batch axes: merging them would merge an axis split over the row axes with one split
    over `tensor`, which XLA does by gathering the cache's kv heads at every decoding step."""
    b, kh, g, t, d = q.shape
    return jnp.einsum("bkqd,bkds->bkqs", q.reshape(b, kh, g * t, d), k.astype(q.dtype),
                      preferred_element_type=jnp.float32).reshape(b, kh, g, t, -1)


def stored(x: jax.Array, q: jax.Array) -> jax.Array:
    """Cached keys or values as attention multiplies them by the queries `q`: in `q`'s dtype when stored in a byte
    (a float8 cache, `DecoderConfig.kv_dtype`), else as they are."""
    return x.astype(q.dtype) if x.dtype.itemsize == 1 else x


def _weighted(p: jax.Array, v: jax.Array, q: jax.Array | None = None) -> jax.Array:
    """`p [B, K, G, T, S] @ v [B, K, S, D]` -> `[B, K, G, T, D]` float32 (rows and kv heads two batch axes); `v`
    as `stored` reads it for the queries `q`."""
    b, kh, g, t, s = p.shape
    v = v if q is None else stored(v, q)
    return jnp.einsum("bkqs,bksd->bkqd", p.astype(v.dtype).reshape(b, kh, g * t, s), v,
                      preferred_element_type=jnp.float32).reshape(b, kh, g, t, -1)


def dense_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                    scoring: Scoring | None = None) -> jax.Array:
    """Softmax attention. q `[B, K, G, T, D]`, k `[B, K, D, S]`, v `[B, K, S, D]`, mask `[B, T, S]`
    -> `[B, K, G, T, D]` float32; logits by `scoring` (default: scaled by `D^-1/2`)."""
    scoring = scoring or Scoring(q.shape[-1] ** -0.5)
    scores = jnp.where(mask[:, None, None], scoring(_scores(q, k)), _MASK_VALUE)
    return _weighted(jax.nn.softmax(scores, axis=-1), v)


TRAINING_ATTENTION_BLOCK = 512  # keys per block of `blockwise_attention`


def blockwise_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                        block: int | None = None, scoring: Scoring | None = None) -> jax.Array:
    """`dense_attention` over blocks of `block` keys with an online softmax, each block recomputed in the backward
    pass (`jax.checkpoint` in a `lax.scan`): the backward pass keeps one running output per block,
    `[B, K, G, T, D]`, instead of the float32 scores `[B, K, G, T, S]` (and their exp and mask). Pure JAX, so the
    same on TPU, GPU and CPU. Up to `block` (default `TRAINING_ATTENTION_BLOCK`) keys it is `dense_attention`.
    A query that sees no key (padding) gets another meaningless average than there; nothing reads it.

    q `[B, K, G, T, D]`, k `[B, K, D, S]`, v `[B, K, S, D]`, mask `[B, T, S]` -> `[B, K, G, T, D]` float32.
    """
    b, kh, d, s = k.shape
    block = block or TRAINING_ATTENTION_BLOCK
    scoring = scoring or Scoring(q.shape[-1] ** -0.5)
    if s <= block:
        return dense_attention(q, k, v, mask, scoring)
    n = -(-s // block)
    pad = n * block - s
    k = jnp.pad(k, ((0, 0), (0, 0), (0, 0), (0, pad))).reshape(b, kh, d, n, block).transpose(3, 0, 1, 2, 4)
    v = jnp.pad(v, ((0, 0), (0, 0), (0, pad), (0, 0))).reshape(b, kh, n, block, d).transpose(2, 0, 1, 3, 4)
    mask = jnp.pad(mask, ((0, 0), (0, 0), (0, pad))).reshape(b, mask.shape[1], n, block).transpose(2, 0, 1, 3)
    step = jax.checkpoint(lambda carry, kvm: (_attend(carry, q, *kvm, scoring), None))
    carry, _ = jax.lax.scan(step, empty_carry(q), (k, v, mask))
    return normalize_carry(carry)


def _attend(carry: tuple, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
            scoring: Scoring | None = None) -> tuple:
    """One online-softmax step over keys `k [B, K, D, S]`, values `v [B, K, S, D]` visible where `mask [B, T, S]`.

    carry = (running max `[B, K, G, T]`, running sum `[B, K, G, T]`, unnormalized output `[B, K, G, T, D]`).
    """
    scoring = scoring or Scoring(q.shape[-1] ** -0.5)
    s = jnp.where(mask[:, None, None], scoring(_scores(q, k)), _MASK_VALUE)
    return _softmax_step(carry, s, lambda p: _weighted(p, v, q))


def _softmax_step(carry: tuple, s: jax.Array, weighted_values) -> tuple:
    """Fold masked, scaled scores `s [..., S]` into an online-softmax carry (running max `[...]`, running sum
    `[...]`, unnormalized output `[..., D]`); `weighted_values(p)` -> `[..., D]` is `p @ values`."""
    m, l, acc = carry
    m_new = jnp.maximum(m, s.max(axis=-1))
    p = jnp.exp(s - m_new[..., None])
    scale = jnp.exp(m - m_new)
    return m_new, l * scale + p.sum(axis=-1), acc * scale[..., None] + weighted_values(p)


def empty_carry(q: jax.Array) -> tuple:
    b, kh, g, t, d = q.shape
    return (jnp.full((b, kh, g, t), _MASK_VALUE, jnp.float32), jnp.zeros((b, kh, g, t), jnp.float32),
            jnp.zeros((b, kh, g, t, d), jnp.float32))


def normalize_carry(carry: tuple) -> jax.Array:
    _, l, acc = carry
    return acc / l[..., None]


def cache_attention(carry: tuple, q: jax.Array, k_blocks: tuple[jax.Array, ...], v_blocks: tuple[jax.Array, ...],
                    mask: jax.Array, n_slots: jax.Array, layer: jax.Array | int,
                    scoring: Scoring | None = None) -> tuple:
    """`_attend` over layer `layer` of a cache stored as blocks (`KVCache`), skipping at run time the blocks that
    start at or after `n_slots` (the filled slots): a decoding step then costs in proportion to the tokens so far,
    not to S.

    k_blocks `[L, B, K, D, S_j]`, v_blocks `[L, B, K, S_j, D]`, mask `[B, T, S]`.
    """
    start = 0
    mine = lambda block: jax.lax.dynamic_index_in_dim(block, layer, 0, keepdims=False)
    for j, (k, v) in enumerate(zip(k_blocks, v_blocks)):
        n = k.shape[-1]
        step = lambda c, k=k, v=v, m=mask[:, :, start:start + n]: _attend(c, q, mine(k), mine(v), m, scoring)
        carry = step(carry) if j == 0 else jax.lax.cond(start < n_slots, step, lambda c: c, carry)
        start += n
    return carry


def shared_attention(carry: tuple, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                     scoring: Scoring | None = None, window: tuple | None = None) -> tuple:
    """`_attend` over per-prompt prefixes: q `[B, K, G, T, D]` of B = P * M rows, rows `p*M ... p*M + M - 1`
    seeing prefix p, stored in J blocks (`prefix_blocks`): k `[J, P, K, D, N_b]`, v `[J, P, K, N_b, D]`, valid
    where `mask [J, P, N_b]`. `window` = (query positions `[B, T]`, prefix slot positions `[J, P, N_b]`, size
    `[]`): a slot is seen only by the queries fewer than `size` positions after it (a sliding layer, `Window`).

    A group's queries meet their prefix in one matmul `[M*G*T, D] x [D, N]` per prompt and kv head, so each prefix
    slot is read once per step however many rows continue it, and the cost is linear in P. Scores are laid out
    `[P, K, M, G, T, N_b]`, one block at a time in a `lax.scan` (a long suffix prefilled after a long prefix holds
    one block's scores at a time); only the small carry is transposed.
    """
    b, kh, g, t, d = q.shape
    j, p, _ = mask.shape
    m = b // p
    to_groups = lambda x: x.reshape(p, m, kh, g, t, *x.shape[4:]).swapaxes(1, 2)  # [B, K, G, T, ..] -> [P, K, M, ..]
    from_groups = lambda x: x.swapaxes(1, 2).reshape(b, kh, g, t, *x.shape[5:])
    qg = to_groups(q).reshape(p, kh, m * g * t, d)
    scoring = scoring or Scoring(d ** -0.5)
    blocks = (k, v, mask)
    if window is None:
        seen = lambda mj: mj[:, None, None, None, None, :]  # [P, 1, 1, 1, 1, N_b]
    else:
        query, positions, size = window
        query, blocks = query.reshape(p, m, t), blocks + (positions,)
        seen = lambda mj, pj: (mj[:, None, None, :] & (query[..., None] - pj[:, None, None, :] < size)
                               )[:, None, :, None]  # [P, 1, M, 1, T, N_b]

    def fold(c, kvm):
        kj, vj, mj = kvm[:3]
        nj = mj.shape[-1]
        s = jnp.einsum("pkqd,pkdn->pkqn", qg, kj.astype(q.dtype), preferred_element_type=jnp.float32)
        s = jnp.where(seen(*kvm[2:]), scoring(s.reshape(p, kh, m, g, t, nj)), _MASK_VALUE)
        vq = stored(vj, q)
        weighted = lambda w: jnp.einsum("pkqn,pknd->pkqd", w.astype(vq.dtype).reshape(p, kh, m * g * t, nj), vq,
                                        preferred_element_type=jnp.float32).reshape(p, kh, m, g, t, d)
        return _softmax_step(c, s, weighted), None

    carry = tuple(map(to_groups, carry))
    if j == 1:
        carry, _ = fold(carry, tuple(x[0] for x in blocks))
    else:
        carry, _ = jax.lax.scan(fold, carry, blocks)
    return tuple(map(from_groups, carry))


def ring_attention(carry: tuple, q: jax.Array, k: jax.Array, v: jax.Array, ring: RingStep,
                   query_index: jax.Array | None, scoring: Scoring) -> tuple[tuple, tuple[jax.Array, jax.Array]]:
    """`_attend` over a sliding layer's ring and the new tokens' own keys `k [B, K, D, T]`, values
    `v [B, K, T, D]`, which are then written to the ring. Returns the carry and the updated (ring_k, ring_v).
    With `query_index [B]`, only that token of each row queries (`q [B, K, G, 1, D]`).

    One new token (decoding) is written first and the ring read once: the slot it takes held the token W
    positions back, which its query does not see. Several may overwrite slots their earlier queries see, so the
    ring is read before they are written."""
    mine = lambda x: jax.lax.dynamic_index_in_dim(x, ring.index, 0, keepdims=False)
    write = lambda x, old, new, axis, names: sharding.constrain(
        ring_write(x, old, new, ring.index, ring.source, ring.hit, axis), names)
    if k.shape[3] == 1 and query_index is None:
        ring_k, ring_v = write(ring.k, mine(ring.k), k, 3, KV_K), write(ring.v, mine(ring.v), v, 2, KV_V)
        seen = ring.seen | ring.hit[:, None, :]  # (the new token's own slot)
        return _attend(carry, q, mine(ring_k), mine(ring_v), seen, scoring), (ring_k, ring_v)
    seen, chunk = ring.seen, ring.chunk
    if query_index is not None:
        seen, chunk = rows_at(seen, query_index), rows_at(chunk, query_index)
    old_k, old_v = mine(ring.k), mine(ring.v)
    carry = _attend(carry, q, old_k, old_v, seen, scoring)
    carry = _attend(carry, q, k, v, chunk, scoring)
    # The writes must follow the reads. They are made to depend on the output (finite, so `0 * sum` is 0, which XLA
    # does not fold; per row and kv head, as those are split: no collective): otherwise XLA cannot order them and
    # copies every sliding layer's ring at every layer (`tests/test_sampling.py` checks the compiled program).
    after = (0 * carry[2].sum(axis=(2, 3, 4)))[:, :, None, None]  # [B, K, 1, 1]
    return carry, (write(ring.k, old_k, k + after.astype(k.dtype), 3, KV_K),
                   write(ring.v, old_v, v + after.astype(v.dtype), 2, KV_V))
