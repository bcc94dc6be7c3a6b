"""One decoder layer: RMSNorm, GQA self-attention with RoPE (`Attention`, over the kernels of
`rrc_jax.models.attention`), the gated MLP, and the block that joins them with residuals (`Block`); the layers are
stacked on a leading `layers` axis (`stack_layers`) and scanned by the decoder, in segments of equal layer kinds
(`layer_segments`).

Shapes: B batch, T tokens, E embed, H query heads, K kv heads, G = H / K, D head dim, I mlp width."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from rrc_jax import sharding
from rrc_jax.models import lora
from rrc_jax.models.attention import (blockwise_attention, cache_attention, empty_carry, normalize_carry,
                                      ring_attention, Scoring, shared_attention, Window)
from rrc_jax.models.decoder_config import ACTIVATIONS, DecoderConfig
from rrc_jax.models.kv_cache import KV_K, KV_V, LAYERS, RingStep, rows_at, write_blocks
from rrc_jax.models.rope import apply_rope


def init_param(rngs: nnx.Rngs, shape: tuple[int, ...], names: tuple[str | None, ...], dtype,
               scale: float | None = None, init: str = "normal") -> nnx.Param:
    """A parameter of `shape` with logical axes `names` in `dtype`: ones, zeros, or normal of std `scale` (default
    0.02), placed by the logical rules when built under a mesh (`sharding.param`)."""
    if init == "ones":
        value = jnp.ones(shape, dtype)
    elif init == "zeros":
        value = jnp.zeros(shape, dtype)
    else:
        value = (scale or 0.02) * jax.random.normal(rngs.params(), shape, jnp.float32)
        value = value.astype(dtype)
    return sharding.param(value, names)


def _weights(module: nnx.Module, cfg: DecoderConfig, rngs: nnx.Rngs,
             shapes: dict[str, tuple[tuple[int, ...], tuple]]) -> None:
    """`module`'s projection weights `shapes` (name -> shape, logical axes): stored as qwix quantizes them under a
    quantized LoRA base (`lora.add_quantized`), else plain parameters."""
    for name, (shape, names) in shapes.items():
        if cfg.lora is not None and cfg.lora.weight_qtype:
            lora.add_quantized(module, name, shape, names, cfg.lora, cfg.params_dtype)
        else:
            setattr(module, name, init_param(rngs, shape, names, cfg.params_dtype))


class RMSNorm(nnx.Module):
    """`x / sqrt(mean(x^2) + eps) * scale`, normalized in float32; with an `offset` (Gemma: 1, its weights
    0-centred), `* (offset + scale)` in float32 before the cast back, as Gemma's norm computes it."""

    def __init__(self, dim: int, eps: float, *, param_dtype, rngs: nnx.Rngs, offset: float = 0.0):
        self.eps, self.offset = eps, offset
        self.scale = init_param(rngs, (dim,), ("norm",), param_dtype, init="zeros" if offset else "ones")

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        if self.offset:
            return (y * (self.offset + self.scale[...].astype(jnp.float32))).astype(x.dtype)
        return self.scale[...].astype(x.dtype) * y.astype(x.dtype)


def norm(cfg: DecoderConfig, dim: int, rngs: nnx.Rngs) -> RMSNorm:
    """An RMSNorm of `cfg`'s family over `dim` features."""
    return RMSNorm(dim, cfg.rms_norm_eps, param_dtype=cfg.params_dtype, rngs=rngs, offset=cfg.norm_offset)


def dense(x: jax.Array, w: jax.Array, bias: jax.Array | None = None) -> jax.Array:
    """`x [..., E] @ w [E, *N]` -> `[..., *N]`, as one 2-D matmul on `w` viewed `[E, prod(N)]` (an N-D einsum
    lets XLA's CPU layout assignment transpose the weight on every decode step)."""
    y = (x @ w.reshape(w.shape[0], -1).astype(x.dtype)).reshape(*x.shape[:-1], *w.shape[1:])
    return y if bias is None else y + bias.astype(x.dtype)


class Attention(nnx.Module):
    """Grouped-query self-attention with RoPE; reads and writes a layer's cache when given one.

    The q, k and v projections are one weight `qkv [E, K, G + 2, D]`: for kv head j, its G query heads (HF heads
    j*G ... j*G + G - 1), then its key and value. One matmul per layer instead of three (a decode step streams
    every weight once, and fewer, larger products stream faster), and sharding the K axis keeps each group's
    queries with their key and value.
    """

    def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs):
        e, h, k, d, pd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.params_dtype
        self.cfg, self.lora = cfg, cfg.lora
        g = h // k
        weights = {"qkv": ((e, k, g + 2, d), ("embed", "kv_heads", None, "head_dim")),
                   "o": ((h, d, e), ("heads", "head_dim", "embed"))}
        _weights(self, cfg, rngs, weights)
        if cfg.lora is not None and cfg.lora.enabled:
            qkv_out = lambda n: ((k, n, d), ("kv_heads", None, "head_dim"))
            lora.add_adapters(self, cfg.lora, rngs, {
                "q": ((e,), ("embed",), *qkv_out(g)), "k": ((e,), ("embed",), *qkv_out(1)),
                "v": ((e,), ("embed",), *qkv_out(1)), "o": ((h, d), ("heads", "head_dim"), (e,), ("embed",))})
        if cfg.qkv_bias:
            self.qkv_bias = init_param(rngs, (k, h // k + 2, d), ("kv_heads", None, "head_dim"), pd, init="zeros")
        if cfg.o_bias:
            self.o_bias = init_param(rngs, (e,), ("embed",), pd, init="zeros")
        if cfg.qk_norm:
            self.q_norm, self.k_norm = norm(cfg, d, rngs), norm(cfg, d, rngs)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: jax.Array,
                 kv_cache: tuple[tuple, tuple] | None = None, end: jax.Array | None = None,
                 shared: tuple[tuple[jax.Array, jax.Array, jax.Array], ...] | None = None,
                 query_index: jax.Array | None = None, layer: jax.Array | int = 0, window: Window | None = None,
                 ring: RingStep | None = None, dropout: jax.Array | None = None) -> tuple[jax.Array, tuple | None]:
        """x `[B, T, E]`, cos/sin `[B, T, D]`, mask `[B, T, S]` (S = T without cache) -> `[B, T, E]`, cache.

        `kv_cache` = (key blocks, value blocks) of every layer (`KVCache`: `[L, ...]`); this one, layer `layer`,
        writes its keys and values at slots `[end, end + T)` and reads its own.

        `shared` = per level of a branched cache's prefixes, this layer's (k `[J, P, K, D, N_b]`,
        v `[J, P, K, N_b, D]`) and the mask `[J, P, N_b]`: each group of B / P rows' prefix in J blocks
        (`prefix_blocks`), attended before the cache (`KVCache.branch`).
        `query_index [B]`: keys and values of all T tokens go to the cache, but only token `query_index[b]` of
        each row queries; the output is then `[B, 1, E]` (the last layer of `Decoder.extend`).
        `window`: this layer's sliding window, which narrows `mask` and the prefixes' mask to the keys fewer than
        `window.size` positions before each query. `ring`: a sliding layer of a cache that keeps only its window
        (`KVCache.ring`): it attends to its ring and the new tokens instead of `kv_cache`, and returns its updated
        ring buffers (`RingStep`). `dropout [B]`: the rows' keys of LoRA dropout in a training pass (`lora.delta`).
        """
        cfg = self.cfg
        scoring = Scoring(cfg.attention_scale, cfg.attn_logit_softcapping)
        g = cfg.num_heads // cfg.num_kv_heads
        qkv = dense(x, lora.weight(self, "qkv"), self.qkv_bias[...] if cfg.qkv_bias else None)
        if self.lora is not None:  # LoRA: each targeted projection's (alpha / r) x A B, in its group of qkv
            d = cfg.head_dim
            adapted = lora.fused_delta(self, ("q", "k", "v"), x, ((cfg.num_kv_heads, g, d),
                                       (cfg.num_kv_heads, 1, d), (cfg.num_kv_heads, 1, d)), axis=-2, dropout=dropout)
            qkv = qkv if adapted is None else qkv + adapted
        qkv = sharding.constrain(qkv, ("batch", "length", "kv_heads", None, None))  # [B, T, K, G + 2, D]
        qkv = checkpoint_name(qkv, "qkv")
        qk = qkv[..., :g + 1, :]
        if cfg.qk_norm:  # each query head, then the key head, normed over head_dim (Qwen3)
            qk = jnp.concatenate([self.q_norm(qk[..., :g, :]), self.k_norm(qk[..., g:, :])], axis=-2)
        qk = apply_rope(qk, cos, sin)
        q, k, v = qk[..., :g, :], qk[..., g, :], qkv[..., g + 1, :]
        k, v = k.transpose(0, 2, 3, 1), v.swapaxes(1, 2)  # [B, K, D, T], [B, K, T, D]
        query_positions = None if window is None else window.query
        if window is not None:
            mask = mask & (window.query[:, :, None] - window.key[:, None, :] < window.size)
        if query_index is not None:
            q, mask = rows_at(q, query_index), rows_at(mask, query_index)
            query_positions = None if window is None else rows_at(query_positions, query_index)
        b, t, _, _, d = q.shape
        q = q.transpose(0, 2, 3, 1, 4)  # [B, K, G, T, D]
        if kv_cache is None and ring is None:
            out = blockwise_attention(q, k, v, mask, scoring=scoring)
        else:  # (see KVCache for the layout)
            carry = empty_carry(q)
            for level, prefixes in enumerate(shared or ()):  # the ancestors, outermost first
                prefix_window = None if window is None else (query_positions, window.prefix[level], window.size)
                carry = shared_attention(carry, q, *prefixes, scoring=scoring, window=prefix_window)
            if ring is None:
                n_new = k.shape[3]
                kv_cache = (tuple(sharding.constrain(x, KV_K) for x in write_blocks(kv_cache[0], k, end, 3, layer)),
                            tuple(sharding.constrain(x, KV_V) for x in write_blocks(kv_cache[1], v, end, 2, layer)))
                carry = cache_attention(carry, q, *kv_cache, mask, n_slots=jnp.max(end) + n_new, layer=layer,
                                        scoring=scoring)
            else:
                carry, kv_cache = ring_attention(carry, q, k, v, ring, query_index, scoring)
            out = normalize_carry(carry)
        out = sharding.constrain(out.astype(x.dtype).transpose(0, 3, 1, 2, 4),  # [B, T, K, G, D], where q was
                                 ("batch", "length", "kv_heads", None, None)).reshape(b, t, cfg.num_heads * d)
        out = checkpoint_name(out, "attn_out")
        y = dense(out, lora.weight(self, "o").reshape(cfg.num_heads * d, -1), self.o_bias[...] if cfg.o_bias else None)
        adapted = None if self.lora is None else lora.delta(self, "o", out.reshape(b, t, cfg.num_heads, d), dropout)
        return (y if adapted is None else y + adapted), kv_cache


class MLP(nnx.Module):
    """SwiGLU, `down(silu(gate(x)) * up(x))`, or GeGLU with tanh GELU (Gemma; `hidden_act`), gate and up as one
    weight `gate_up [E, I, 2]` (one matmul; the I axis leads so that sharding it keeps each unit's gate and up
    together)."""

    def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs):
        e, i, pd = cfg.hidden_size, cfg.intermediate_size, cfg.params_dtype
        self.mlp_bias, self.hidden_act, self.lora = cfg.mlp_bias, cfg.hidden_act, cfg.lora
        _weights(self, cfg, rngs, {"gate_up": ((e, i, 2), ("embed", "mlp", None)), "down": ((i, e), ("mlp", "embed"))})
        if cfg.lora is not None and cfg.lora.enabled:
            lora.add_adapters(self, cfg.lora, rngs, {"gate": ((e,), ("embed",), (i,), ("mlp",)),
                                                     "up": ((e,), ("embed",), (i,), ("mlp",)),
                                                     "down": ((i,), ("mlp",), (e,), ("embed",))})
        if cfg.mlp_bias:
            self.gate_up_bias = init_param(rngs, (i, 2), ("mlp", None), pd, init="zeros")
            self.down_bias = init_param(rngs, (e,), ("embed",), pd, init="zeros")

    def __call__(self, x: jax.Array, dropout: jax.Array | None = None) -> jax.Array:
        """x `[B, T, E]` -> `[B, T, E]`; `dropout [B]`: the rows' keys of LoRA dropout (`lora.delta`)."""
        bias = lambda name: getattr(self, f"{name}_bias")[...] if self.mlp_bias else None
        gate_up = dense(x, lora.weight(self, "gate_up"), bias("gate_up"))  # [B, T, I, 2]
        if self.lora is not None:  # LoRA on gate and up: their deltas stacked as gate_up is
            i = gate_up.shape[-2]
            adapted = lora.fused_delta(self, ("gate", "up"), x, ((i,), (i,)), axis=-1, stack=True, dropout=dropout)
            gate_up = gate_up if adapted is None else gate_up + adapted
        gate_up = checkpoint_name(sharding.constrain(gate_up, ("batch", "length", "mlp", None)), "gate_up")
        act = ACTIVATIONS[self.hidden_act]
        h = act(gate_up[..., 0]) * gate_up[..., 1]
        y = dense(h, lora.weight(self, "down"), bias("down"))
        adapted = None if self.lora is None else lora.delta(self, "down", h, dropout)
        return y if adapted is None else y + adapted


# What the backward pass of a scanned layer keeps without `remat` (`Decoder._run_layers`), besides the layer's input:
# the products of the expensive operations (the q/k/v projection `[B, T, K, G + 2, D]`, the attention output before
# o `[B, T, H * D]`, the residual stream after attention `[B, T, E]`, the gate/up projection `[B, T, I, 2]`). The
# rest of the layer (norms, rotary, softmax, SwiGLU's elementwise ops) is recomputed from them, one layer at a time.
SAVED_RESIDUALS = ("qkv", "attn_out", "mid", "gate_up")


class Block(nnx.Module):
    """One decoder layer (pre-norm attention, then pre-norm MLP, each with a residual). `Decoder` holds every
    layer's parameters stacked in one `Block` (`stack_layers`) and runs them under a scan."""

    def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs):
        e = cfg.hidden_size
        self.attn_norm = norm(cfg, e, rngs)
        self.attn = Attention(cfg, rngs=rngs)
        self.mlp_norm = norm(cfg, e, rngs)
        self.mlp = MLP(cfg, rngs=rngs)
        if cfg.sandwich_norms:
            self.post_attn_norm, self.post_mlp_norm = norm(cfg, e, rngs), norm(cfg, e, rngs)

    def __call__(self, x, cos, sin, mask, kv_cache=None, end=None, shared=None, query_index=None, layer=0,
                 window=None, ring=None, dropout=None):
        after = lambda name, y: getattr(self, name)(y) if hasattr(self, name) else y  # sandwich norms (Gemma)
        h, kv_cache = self.attn(self.attn_norm(x), cos, sin, mask, kv_cache, end, shared, query_index, layer,
                                window, ring, dropout)
        h = after("post_attn_norm", h)
        x = checkpoint_name(x + h if query_index is None else rows_at(x, query_index) + h, "mid")
        return x + after("post_mlp_norm", self.mlp(self.mlp_norm(x), dropout)), kv_cache


def stack_layers(blocks: list[nnx.Module]) -> nnx.Module:
    """One module of the `blocks`' structure whose parameters are theirs stacked on a leading `layers` axis
    (`[L, ...]`, logical axis `LAYERS`). The blocks are built one by one first, so that random initial values are
    drawn in the order of a list of layers (a model's random initialization does not depend on the stacking)."""
    graphdef, _ = nnx.split(blocks[0])
    stack = lambda *vs: sharding.param(jnp.stack([v[...] for v in vs]), (LAYERS,) + tuple(vs[0].out_sharding),
                                       type(vs[0]))  # an adapter stays an `nnx.LoRAParam`
    return nnx.merge(graphdef, jax.tree.map(stack, *map(nnx.state, blocks),
                                            is_leaf=lambda x: isinstance(x, nnx.Variable)))


def layer_segments(kinds: Sequence[bool]) -> list[tuple[int, tuple[bool, ...], int]]:
    """`kinds` (one per layer) as consecutive segments (start, unit, repeats), each `unit` repeated `repeats` times
    from layer `start`, with the fewest layers in all the units (what a scan over each segment traces):
    [F] * 32 -> [(0, (F,), 32)]; Gemma 3's 62 layers -> [(0, (S,) * 5 + (F,), 10), (60, (S,), 2)]."""
    kinds, n = tuple(kinds), len(kinds)
    best: list[tuple[int, list]] = [(0, [])] * (n + 1)  # best[i]: (cost, segments) of kinds[i:]
    for i in range(n - 1, -1, -1):
        options = []
        for p in range(1, n - i + 1):
            unit, reps = kinds[i:i + p], 1
            while kinds[i + reps * p:i + (reps + 1) * p] == unit:
                reps += 1
            cost, rest = best[i + reps * p]
            options.append((p + cost, [(i, unit, reps)] + rest))
        best[i] = min(options, key=lambda o: o[0])
    return best[0][1]
