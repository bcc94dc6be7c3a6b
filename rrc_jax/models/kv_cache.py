"""The KV cache the decoder reads and writes while it generates: per-layer key and value blocks (one block, or
blocks of `ATTENTION_BLOCK` slots when the cache is large), each slot's validity mask and RoPE position, the shared
prefixes a branched cache reads once for many rows (`KVCache.branch`), and the ring buffers that keep only the window
of a sliding layer (`ring_size`, `ring_plan`, `ring_write`).

Shapes: L layers, B rows, K kv heads, D head dim, S cache slots, W sliding window."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from rrc_jax import sharding
from rrc_jax.models.decoder_config import DecoderConfig


LAYERS = "layers"  # the logical axis of the decoder layers, stacked (replicated: each device holds every layer)


KV_K = (LAYERS, "batch", "kv_heads", "head_dim", "length")  # logical axes of a key block [L, B, K, D, S_j]


KV_V = (LAYERS, "batch", "kv_heads", "length", "head_dim")  # and of a value block [L, B, K, S_j, D]


@struct.dataclass
class KVCache:
    """Key/value cache with a per-slot validity mask.

    Slots are written left to right by all rows together (`end` is shared); a slot holds a real token of a row
    only where `valid[b, s]`. Attention of a new token at slot `e` sees the valid slots `s <= e`, so padding may
    sit anywhere (left-padded prompts, right-padded suffixes, rows that finished decoding).

    k: a tuple of blocks `[L, B, K, D, S_j]`; v: blocks `[L, B, K, S_j, D]`, every layer's stacked on the leading
    axis as the parameters are (`Decoder` scans over it); the blocks hold consecutive slots and their S_j sum to S.
    Rows are sharded over `(data, fsdp)` and kv heads over `tensor`
    (`KV_K`, `KV_V`), so sampling and judging run as one program over the mesh. A small cache is one block; from
    `BLOCKED_ATTENTION_MIN_BYTES` per layer on, blocks of `ATTENTION_BLOCK` slots, so that attention visits only the
    filled ones (a decode step costs in proportion to the tokens so far). Keys are `[.., D, S_j]` so that both
    attention matmuls are the standard `[M, K] x [K, N]` form: scores `q [G*T, D] x k [D, S_j]`, output
    `p [G*T, S_j] x v [S_j, D]`.

    valid `[B, S]` bool; positions `[B]` int32, the RoPE position of each row's next token (= its number of valid
    tokens); end `[]` int32, the next slot to write (`[B]`, each row's own, in a cache of lanes: `as_lanes`); logits `[B, V]` float32, the next-token logits after each
    row's last valid token.

    A cache made by `branch(group, size)` also holds read-only prefixes, attended before the rows' own slots, in
    levels (a prefix tree of fixed depth, outermost first; empty tuples for a cache never branched). Level l holds
    P_l prefixes, prefix p continued by the B / P_l consecutive rows `p*B/P_l ...`; a branch of a branched cache
    turns the rows' own slots into the next level (each row a prefix of the new rows: a judge question's
    `[instruction, prompt]`, then its first response, then the whole question before its votes). A level's N slots
    are stored block-major (`prefix_blocks`), J blocks of N_b slots: shared_k[l] `[L, J, P_l, K, D, N_b]`,
    shared_v[l] `[L, J, P_l, K, N_b, D]`, shared_mask[l] `[J, P_l, N_b]` (the prefix's valid slots). Each row
    attends to its own ancestors only, each read once per step for all the rows under it, so the cost is linear in
    the number of prefixes.

    A cache of more slots than the sliding window (`ring_size`) keeps its sliding layers' keys and values in ring
    buffers of `window` slots instead (`ring`): ring_k `[L_s, B, K, D, W]`, ring_v `[L_s, B, K, W, D]` for the
    L_s sliding layers, the key of a row's token at RoPE position p at slot `p % W`, so a ring holds each row's
    last W tokens however its padding falls (the ones a sliding layer's next query can see); ring_positions
    `[B, W]` int32 the position each slot holds (-1: empty). k and v then hold the full-attention layers only
    (`[L - L_s, ...]`, or none). `sliding` (static) marks the sliding layers, one flag per layer, and `window` is
    their window (0 when none slides).
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    valid: jax.Array
    positions: jax.Array
    end: jax.Array
    logits: jax.Array
    shared_k: tuple[jax.Array, ...] = ()
    shared_v: tuple[jax.Array, ...] = ()
    shared_mask: tuple[jax.Array, ...] = ()
    ring_k: jax.Array | None = None
    ring_v: jax.Array | None = None
    ring_positions: jax.Array | None = None
    sliding: tuple[bool, ...] = struct.field(pytree_node=False, default=())
    window: int = struct.field(pytree_node=False, default=0)

    @property
    def size(self) -> int:
        return self.valid.shape[1]

    @property
    def batch_size(self) -> int:
        return self.valid.shape[0]

    @property
    def shared(self) -> bool:
        return bool(self.shared_mask)

    @property
    def lanes(self) -> bool:
        """Whether each row writes at a cursor of its own (`end [B]`, `as_lanes`): a decoding lane that takes a new
        question when its judgment ends (`rrc_jax.inference.lanes`)."""
        return self.end.ndim == 1

    def as_lanes(self) -> KVCache:
        """This cache with a cursor per row (`end [B]`, each at the shared `end`): rows then advance by their own
        real tokens, and `reset_lanes` empties a row's own slots for a new question."""
        return self if self.lanes else self.replace(end=jnp.full((self.batch_size,), self.end, jnp.int32))

    @property
    def ring(self) -> bool:
        """Whether the sliding layers keep only their window (ring buffers; see the class docstring)."""
        return self.ring_positions is not None

    def take(self, rows: jax.Array) -> KVCache:
        """The cache of the given rows `[R]` (repeats allowed), copied: one prefix prefilled once, reused by many
        rows. `branch` reuses it without the copies. Not for a branched cache (its rows are grouped by prefix)."""
        if self.shared:
            raise ValueError("take() of a branched cache: take the rows before branching")
        take = lambda x, axis=0: None if x is None else jnp.take(x, rows, axis=axis)
        blocks = lambda x: take(x, axis=1)  # [L, B, ...]
        return self.replace(k=jax.tree.map(blocks, self.k), v=jax.tree.map(blocks, self.v), valid=take(self.valid),
                            positions=take(self.positions), logits=take(self.logits), end=jnp.copy(self.end),
                            ring_k=blocks(self.ring_k), ring_v=blocks(self.ring_v),
                            ring_positions=take(self.ring_positions))

    def branch(self, group: int, size: int, *, ring: bool = True) -> KVCache:
        """A cache of B * `group` new rows with `size` slots of their own, rows `b*group ... b*group + group - 1`
        continuing row b of this B-row cache.

        The rows' common history is not copied: row b's own slots become prefix b of a new level of shared
        prefixes (the class docstring), which attention reads once per step for its group instead of once per row
        (a GRPO group after its prompt; a judge question's votes after the question). Branching a branched cache
        adds a level under the ones it has. `ring=False` keeps every slot of the new rows' sliding layers (a cache
        to be branched again). Equal to `take(repeat(arange(B), group))` followed by the same extensions, up to
        float rounding.
        """
        if self.ring:
            raise ValueError("branch() of a cache whose sliding layers keep only their window: the prefixes need "
                             "every slot; prefill (or branch) it with ring=False")
        return _branch(self, group, size, ring)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _branch(cache: KVCache, group: int, size: int, ring: bool) -> KVCache:
    _, b, kh, d, _ = cache.k[0].shape
    k, v, mask = prefix_blocks(jnp.concatenate(cache.k, axis=4), jnp.concatenate(cache.v, axis=3), cache.valid)
    own = _empty_cache(cache.sliding, cache.window, b * group, kh, size, d, cache.k[0].dtype, cache.logits.shape[1],
                       ring=ring)
    rows = lambda x: jnp.repeat(x, group, axis=0)
    return own.replace(positions=rows(cache.positions), logits=rows(cache.logits),
                       shared_k=cache.shared_k + (k,), shared_v=cache.shared_v + (v,),
                       shared_mask=cache.shared_mask + (mask,))


def fresh_rows(cache: KVCache, n: int) -> KVCache:
    """An empty cache of `n` rows laid out as `cache`'s own slots (size, dtype, rings), without shared prefixes."""
    kh, d = (cache.k[0].shape[2], cache.k[0].shape[3]) if cache.k else (cache.ring_k.shape[2], cache.ring_k.shape[3])
    dtype = cache.k[0].dtype if cache.k else cache.ring_k.dtype
    return _empty_cache(cache.sliding, cache.window, n, kh, cache.size, d, dtype, cache.logits.shape[1],
                        ring=cache.ring)


class OwnRows(NamedTuple):
    """The rows' own slots of a cache, every kind of layer's in one array (whatever its blocks): k `[L, n, K, D, S]`,
    v `[L, n, K, S, D]` (the full layers'), valid `[n, S]`, positions `[n]`, logits `[n, V]`, end `[n]` (each row's
    cursor), and the rings when the cache keeps them (`KVCache.ring`, else None). What a lane takes from a
    prefilled question (`own_rows`, `put_rows_of`)."""

    k: jax.Array | None
    v: jax.Array | None
    valid: jax.Array
    positions: jax.Array
    logits: jax.Array
    end: jax.Array
    ring_k: jax.Array | None = None
    ring_v: jax.Array | None = None
    ring_positions: jax.Array | None = None

    ROW_AXIS = dict(k=1, v=1, valid=0, positions=0, logits=0, end=0, ring_k=1, ring_v=1, ring_positions=0)

    def take(self, rows: jax.Array) -> OwnRows:
        """The rows `rows [m]` (repeats allowed)."""
        return OwnRows(*(None if x is None else jnp.take(x, rows, axis=self.ROW_AXIS[f])
                         for f, x in zip(self._fields, self)))

    def concat(self, other: OwnRows) -> OwnRows:
        """These rows, then `other`'s."""
        return OwnRows(*(None if x is None else jnp.concatenate([x, y], axis=self.ROW_AXIS[f])
                         for f, x, y in zip(self._fields, self, other)))

    def put(self, rows: jax.Array, new: OwnRows) -> OwnRows:
        """These rows with `rows [m]` (an index past the last: none, dropped) replaced by `new`'s m rows."""
        return OwnRows(*(None if x is None else x.at[(slice(None),) * self.ROW_AXIS[f] + (rows,)].set(y, mode="drop")
                         for f, x, y in zip(self._fields, self, new)))


def own_rows(cache: KVCache, ends: jax.Array | None = None) -> OwnRows:
    """The `OwnRows` of `cache` (its own slots, not its shared prefixes), the cursors `ends [B]` (default: the
    cache's, one per row)."""
    whole = lambda blocks, axis: jnp.concatenate(blocks, axis=axis) if blocks else None
    end = jnp.broadcast_to(cache.end, (cache.batch_size,)) if ends is None else ends
    return OwnRows(whole(cache.k, 4), whole(cache.v, 3), cache.valid, cache.positions, cache.logits,
                   end.astype(jnp.int32), cache.ring_k, cache.ring_v, cache.ring_positions)


def put_rows_of(cache: KVCache, rows: jax.Array, new: OwnRows) -> KVCache:
    """`cache` (of lanes, `KVCache.lanes`) with its rows `rows [n]` (an index >= B: none, dropped) replaced by
    `new`'s n rows (`own_rows` of a cache laid out as its own slots, `fresh_rows`), each block updated in place."""
    out = []
    for blocks, whole, axis in ((cache.k, new.k, 4), (cache.v, new.v, 3)):
        start, mine = 0, []
        for block in blocks:  # the new rows' slots cut to this cache's blocks
            n = block.shape[axis]
            mine.append(block.at[:, rows].set(jax.lax.slice_in_dim(whole, start, start + n, axis=axis), mode="drop"))
            start += n
        out.append(tuple(mine))
    rest = OwnRows(None, None, cache.valid, cache.positions, cache.logits, cache.end, cache.ring_k, cache.ring_v,
                   cache.ring_positions).put(rows, new._replace(k=None, v=None))
    return cache.replace(**(rest._asdict() | dict(k=out[0], v=out[1])))


def put_prefix(cache: KVCache, one: KVCache, slot: jax.Array) -> KVCache:
    """`cache` (branched once) with its prefix `slot` replaced by the one row of `one` (prefilled, `ring=False`,
    as many slots as the prefixes hold): a lane group's next prompt."""
    k, v, mask = prefix_blocks(jnp.concatenate(one.k, axis=4), jnp.concatenate(one.v, axis=3), one.valid)
    return cache.replace(shared_k=(cache.shared_k[0].at[:, :, slot].set(k[:, :, 0]),),
                         shared_v=(cache.shared_v[0].at[:, :, slot].set(v[:, :, 0]),),
                         shared_mask=(cache.shared_mask[0].at[:, slot].set(mask[:, 0]),))


def prefix_blocks(k: jax.Array, v: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Every layer's prefixes k `[L, P, K, D, N]`, v `[L, P, K, N, D]`, mask `[P, N]` stored block-major for
    `shared_attention`: `[L, J, P, K, D, N_b]`, `[L, J, P, K, N_b, D]`, `[J, P, N_b]`, J blocks of
    `SHARED_ATTENTION_BLOCK` slots (one block of N when N is not a multiple of it), so that the attention scans
    them as they are, with no copy per step."""
    layers, p, kh, d, n = k.shape
    nb = SHARED_ATTENTION_BLOCK if n > SHARED_ATTENTION_BLOCK and n % SHARED_ATTENTION_BLOCK == 0 else n
    j = n // nb
    blocked = lambda names: names[:1] + (None,) + names[1:]
    k = sharding.constrain(k.reshape(layers, p, kh, d, j, nb).transpose(0, 4, 1, 2, 3, 5), blocked(KV_K))
    v = sharding.constrain(v.reshape(layers, p, kh, j, nb, d).transpose(0, 3, 1, 2, 4, 5), blocked(KV_V))
    return k, v, mask.reshape(p, j, nb).swapaxes(0, 1)


ATTENTION_BLOCK = 64  # cache slots per block of a blocked cache


BLOCKED_ATTENTION_MIN_BYTES = 2 << 20  # per layer and per k or v; smaller caches are one block


def block_slots(b: int, kh: int, s: int, d: int, dtype) -> int:
    """Slots per block of a layer's cache `[B, K, D, S]`: `ATTENTION_BLOCK` once it reaches
    `BLOCKED_ATTENTION_MIN_BYTES` (and S is a multiple of it), else S (one block).

    Skipping empty blocks pays once a cache is large; below that, reading all of it in one pass is cheaper than the
    per-block control flow (static shapes: decided when the cache is made).
    """
    large = b * kh * s * d * jnp.dtype(dtype).itemsize >= BLOCKED_ATTENTION_MIN_BYTES
    return ATTENTION_BLOCK if large and s % ATTENTION_BLOCK == 0 and s > ATTENTION_BLOCK else s


def _empty_kv(layers: int, b: int, kh: int, s: int, d: int, dtype) -> tuple[tuple, tuple]:
    """Zero key blocks `[L, B, K, D, S_j]` and value blocks `[L, B, K, S_j, D]` of `layers` layers, sharded by
    `KV_K` / `KV_V` under a mesh."""
    n = block_slots(b, kh, s, d, dtype)
    zeros = lambda shape, names: sharding.constrain(jnp.zeros(shape, dtype), names)
    return (tuple(zeros((layers, b, kh, d, n), KV_K) for _ in range(s // n)),
            tuple(zeros((layers, b, kh, n, d), KV_V) for _ in range(s // n)))


def write_blocks(blocks: tuple[jax.Array, ...], new: jax.Array, end: jax.Array, axis: int, layer: jax.Array
                 ) -> tuple[jax.Array, ...]:
    """`blocks` (every layer's, stacked: `[L, ...]`, consecutive slots along the per-layer `axis`) with layer
    `layer`'s `new` (`[B, ...]`, T slots along `axis`) written at slots `[end, end + T)`; the caller keeps
    `end + T <= S`. `end [B]` (a cache of lanes, `KVCache.lanes`): each row at its own slots, those past S dropped.

    One block, or one new token: an in-place update of each block (a block that does not hold the slot rewrites
    its own value there, so decoding touches one slot per block). Several tokens over several blocks (prefill,
    extend): the layer's part of each block is rebuilt from a gather of the tokens that land in it.
    """
    if end.ndim:
        return _write_rows(blocks, new, end, axis, layer)
    axis += 1  # in the stacked block
    t, upd, out, start = new.shape[axis - 1], new.astype(blocks[0].dtype)[None], [], 0

    def put(block, value, slot):  # `value [1, ...]` into layer `layer` of `block`, from `slot` along `axis`
        index = [layer] + [0] * (block.ndim - 1)
        index[axis] = slot
        return jax.lax.dynamic_update_slice(block, value, index)

    for block in blocks:
        n = block.shape[axis]
        if len(blocks) == 1:
            block = put(block, upd, end)
        elif t == 1:
            pos = jnp.clip(end - start, 0, n - 1)
            inside = (end >= start) & (end < start + n)
            index = [layer] + [0] * (block.ndim - 1)
            index[axis] = pos
            old = jax.lax.dynamic_slice(block, index, upd.shape)
            block = put(block, jnp.where(inside, upd, old), pos)
        else:
            idx = start + jnp.arange(n) - end  # which new token lands in each slot of this block
            shape = [1] * block.ndim
            shape[axis] = n
            hit = ((idx >= 0) & (idx < t)).reshape(shape)
            mine = jax.lax.dynamic_index_in_dim(block, layer, 0, keepdims=True)
            block = put(block, jnp.where(hit, jnp.take(upd, jnp.clip(idx, 0, t - 1), axis=axis), mine), 0)
        out.append(block)
        start += n
    return tuple(out)


def _write_rows(blocks: tuple[jax.Array, ...], new: jax.Array, end: jax.Array, axis: int, layer: jax.Array
                ) -> tuple[jax.Array, ...]:
    """`write_blocks` with a slot of its own per row, `end [B]`: one new token is scattered (one slot per row, in
    place); several are placed by a gather per row, as `write_blocks` places them in a block."""
    t, upd, out, start = new.shape[axis], new.astype(blocks[0].dtype), [], 0
    b = new.shape[0]
    for block in blocks:
        n = block.shape[axis + 1]
        if t == 1:  # [L, B, ..., S_j, ...]: row r's token at slot end[r] - start of layer `layer`, when inside
            local = end - start
            local = jnp.where((local >= 0) & (local < n), local, n)  # n: out of bounds, dropped
            index = [layer, jnp.arange(b)] + [slice(None)] * (block.ndim - 2)
            index[axis + 1] = local
            block = block.at[tuple(index)].set(jnp.squeeze(upd, axis), mode="drop")
        else:
            idx = start + jnp.arange(n)[None] - end[:, None]  # [B, n] which new token lands in each slot
            shape = [b] + [1] * (new.ndim - 1)
            shape[axis] = n
            hit = ((idx >= 0) & (idx < t)).reshape(shape)
            taken = jnp.take_along_axis(upd, jnp.clip(idx, 0, t - 1).reshape(shape), axis=axis)
            mine = jax.lax.dynamic_index_in_dim(block, layer, 0, keepdims=False)
            block = jax.lax.dynamic_update_index_in_dim(block, jnp.where(hit, taken, mine), layer, 0)
        out.append(block)
        start += n
    return tuple(out)


def ring_size(sliding: tuple[bool, ...], window: int, size: int) -> int | None:
    """Slots of the sliding layers' ring buffers in a cache of `size` slots (`KVCache`): the window when it is
    shorter, else None (every layer keeps every slot)."""
    return window if any(sliding) and window < size else None


def _empty_cache(sliding: tuple[bool, ...], window: int, b: int, kh: int, s: int, d: int, dtype, vocab: int, *,
                 ring: bool) -> KVCache:
    """An empty `KVCache` of `b` rows and `s` slots; with `ring`, the sliding layers in ring buffers when their
    window is shorter than `s` (`ring_size`)."""
    r = ring_size(sliding, window, s) if ring else None
    full = len(sliding) - (sum(sliding) if r else 0)
    k, v = _empty_kv(full, b, kh, s, d, dtype) if full else ((), ())
    ring_k = ring_v = ring_positions = None
    if r:
        zeros = lambda shape, names: sharding.constrain(jnp.zeros(shape, dtype), names)
        ring_k, ring_v = zeros((sum(sliding), b, kh, d, r), KV_K), zeros((sum(sliding), b, kh, r, d), KV_V)
        ring_positions = sharding.constrain(jnp.full((b, r), -1, jnp.int32), ("batch", None))
    return KVCache(k=k, v=v, valid=jnp.zeros((b, s), bool), positions=jnp.zeros((b,), jnp.int32),
                   end=jnp.zeros((), jnp.int32), logits=jnp.zeros((b, vocab), jnp.float32), ring_k=ring_k,
                   ring_v=ring_v, ring_positions=ring_positions, sliding=tuple(sliding),
                   window=window if any(sliding) else 0)


def init_cache(cfg: DecoderConfig, batch_size: int, size: int, *, ring: bool = True) -> KVCache:
    """An empty cache of `size` slots for `batch_size` rows, in `cfg.cache_dtype`. `ring`: the sliding layers keep
    only their window when it is shorter than `size` (`KVCache`); False for a cache to `branch` (its prefixes)."""
    return _empty_cache(cfg.sliding, cfg.sliding_window or 0, batch_size, cfg.num_kv_heads, size, cfg.head_dim,
                        cfg.cache_dtype, cfg.vocab_size, ring=ring)


SHARED_ATTENTION_BLOCK = 512  # prefix slots per block of `shared_attention`


class RingStep(NamedTuple):
    """A sliding layer's ring buffers (`KVCache.ring`) and how one `extend` of T tokens reads and writes them.

    k `[L_s, B, K, D, W]`, v `[L_s, B, K, W, D]`: every sliding layer's rings before this extend, index `[]` this
    layer's. The rest is the same for every sliding layer (`ring_plan`): seen `[B, T, W]`, the slots each new
    token's query sees (filled, fewer than W positions back); chunk `[B, T, T]`, the new tokens it sees (real,
    not after it, within the window); source `[B, W]`, the new token written to each slot where `hit [B, W]`.
    """

    k: jax.Array | None
    v: jax.Array | None
    index: jax.Array | int
    seen: jax.Array
    chunk: jax.Array
    source: jax.Array
    hit: jax.Array


def ring_plan(ring_positions: jax.Array, positions: jax.Array, count: jax.Array, new: jax.Array, window: int
              ) -> tuple[RingStep, jax.Array]:
    """The reads and writes of the rings (`RingStep`, without a layer's buffers) when T new tokens `new [B, T]`
    (real ones) at RoPE positions `positions [B, T]` extend rows holding `count [B]` tokens, whose rings hold the
    positions `ring_positions [B, W]`; and the positions the rings hold after it.

    A row's real tokens take consecutive positions from `count`: the slot `r` of its ring gets the latest of them
    congruent to r modulo W, so the ring keeps the row's last W tokens whatever its padding.
    """
    t, w = new.shape[1], window
    seen = (ring_positions >= 0)[:, None, :] & (positions[:, :, None] - ring_positions[:, None, :] < w)
    chunk = (new[:, None, :] & jnp.tril(jnp.ones((t, t), bool))[None]
             & (positions[:, :, None] - positions[:, None, :] < w))
    ranks = jnp.cumsum(new.astype(jnp.int32), axis=1)  # [B, T], the real tokens so far in the chunk
    last = count + ranks[:, -1] - 1  # [B] the position of the row's last real token
    held = last[:, None] - (last[:, None] - jnp.arange(w)[None]) % w  # [B, W] its latest position at each slot
    hit = held >= count[:, None]
    # the column of the real token of rank held - count: the first whose running count passes it
    source = jax.vmap(lambda r, x: jnp.searchsorted(r, x, side="left"))(ranks, held - count[:, None] + 1)
    step = RingStep(None, None, 0, seen, chunk, jnp.minimum(source, t - 1).astype(jnp.int32), hit)
    return step, jnp.where(hit, held, ring_positions)


def ring_write(ring: jax.Array, mine: jax.Array, new: jax.Array, index: jax.Array | int, source: jax.Array,
               hit: jax.Array, axis: int) -> jax.Array:
    """`ring [L_s, B, ...]` with layer `index`'s slots (`mine [B, ...]`, as they were) where `hit [B, W]` holding
    the new tokens `source [B, W]` of `new [B, ...]` (T tokens along `axis`; a layer's W slots lie along the same
    axis)."""
    shape = [1] * new.ndim
    shape[0], shape[axis] = source.shape
    taken = jnp.take_along_axis(new, source.reshape(shape), axis=axis).astype(ring.dtype)
    return jax.lax.dynamic_update_index_in_dim(ring, jnp.where(hit.reshape(shape), taken, mine), index, 0)


def rows_at(x: jax.Array, index: jax.Array) -> jax.Array:
    """`x[b, index[b]]` kept as `[B, 1, ...]` for `x [B, T, ...]` and `index [B]`."""
    return jnp.take_along_axis(x, index.reshape(-1, *([1] * (x.ndim - 1))), axis=1)
