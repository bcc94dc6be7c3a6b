"""The decoder that the model families share (Llama 3.x, Qwen2 / Qwen2.5, Qwen3, Mistral, Gemma 2, Gemma 3:
`rrc_jax.models.families`).

Pre-norm transformer: token embedding -> L x [RMSNorm -> GQA self-attention with RoPE -> residual,
RMSNorm -> gated MLP -> residual] (the L layers' parameters stacked on a leading `layers` axis and run under a
scan, as MaxText's scanned layers) -> RMSNorm -> LM head (tied to the embedding or not) and, optionally,
a scalar value head (the DRM's Bradley-Terry score, Eq. 1). A sequence-classification checkpoint
(`LlamaForSequenceClassification`, ...: a `score` head, no LM head) is a decoder with the value head only
(`lm_head=False`).

What a family does differently lives in its module of `rrc_jax.models.families` (its `config.json` fields, its
extra tensors); the decoder implements the features they switch on: biases on q/k/v (`qkv_bias`), on o (`o_bias`)
and on the MLP (`mlp_bias`), RMSNorm of each query and key head (`qk_norm`), tied embeddings, the `linear` and
`llama3` RoPE frequency scalings, and Gemma's: embeddings scaled by sqrt(E), `(1 + w)` norms, norms after
attention and MLP too, GeGLU, `query_pre_attn_scalar`, soft-capped attention and output logits, and sliding-window
layers (`layer_types`, with their own RoPE base in Gemma 3). A sliding layer's window is a mask on RoPE positions,
so it holds in every attention path: training, log-probs, prefill, decode and shared prefixes (`Window`); a cache
longer than the window keeps only the window of a sliding layer (`KVCache.ring`).

LoRA (`rrc_jax.models.lora`, `cfg.lora`): adapters beside the q/k/v/o and gate/up/down projections, stacked and
scanned with the layers, their deltas added to the fused products; with a quantized base the projections are read
through `lora.weight` (qwix's dequantization, one layer at a time inside the scan).

Padding can sit anywhere. Positions derive from the attention mask (`cumsum(mask) - 1`), so left- and
right-padded batches give the same logits at their real tokens. For generation the model reads and writes a
`KVCache` whose per-slot validity mask lets a prefix prefilled once be extended by many suffixes
(see `rrc_jax.inference.sampling`).

Shapes: B batch, T new tokens, S cache slots, E embed, H query heads, K kv heads, G = H / K, D head dim,
I mlp width, V vocab, W sliding window, L_s sliding layers.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct
from jax.ad_checkpoint import checkpoint_name

from rrc_jax import sharding
from rrc_jax.models.families import family
from rrc_jax.models import lora
from rrc_jax.models.families.base import rope_fields
from rrc_jax.models.lora import LoraConfig

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
LAYER_TYPES = ("full_attention", "sliding_attention")  # `config.json`'s `layer_types`
NO_WINDOW = np.iinfo(np.int32).max  # the window of a full-attention layer
ACTIVATIONS = {"silu": jax.nn.silu, "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True)}
_MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)  # finite: a query with no visible key gives no NaN
ACTIVATION = ("batch", "length", "embed")  # logical axes of the residual stream [B, T, E] (`sharding.constrain`)


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Architecture and numerics of a decoder. Hashable (it is static in jit)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_type: str = "default"
    # (key, value) pairs of the rope scaling parameters (`factor`, `low_freq_factor`, ...), sorted by key.
    rope_scaling: tuple[tuple[str, float], ...] = ()
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # RMSNorm of each query and key head before RoPE (Qwen3, Gemma 3)
    hidden_act: str = "silu"  # the MLP's gate activation (`ACTIVATIONS`): SwiGLU, or GeGLU (Gemma)
    norm_offset: float = 0.0  # every RMSNorm scales by (norm_offset + w): 1 for Gemma, whose weights are 0-centred
    sandwich_norms: bool = False  # an RMSNorm after attention and after the MLP too, before each residual (Gemma)
    embed_scale: bool = False  # token embeddings times sqrt(hidden_size), in the compute dtype (Gemma)
    query_pre_attn_scalar: int | None = None  # attention logits scaled by its -1/2 power, not head_dim's (Gemma)
    attn_logit_softcapping: float | None = None  # attention logits -> cap * tanh(logits / cap) (Gemma 2)
    final_logit_softcapping: float | None = None  # the LM head's logits likewise (Gemma 2)
    sliding_window: int | None = None  # a sliding layer's query sees the keys fewer than this many positions back
    # per layer, 'full_attention' or 'sliding_attention' (`LAYER_TYPES`); () is every layer full
    layer_types: tuple[str, ...] = ()
    local_rope_theta: float | None = None  # the RoPE base of the sliding layers (default RoPE; Gemma 3)
    value_head: bool = False
    lm_head: bool = True  # False: a sequence classifier (the value head only), which gives no logits
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    dtype: str = "float32"  # compute dtype
    param_dtype: str = "float32"
    lora: LoraConfig | None = None  # adapters on the projections, a quantized base (`rrc_jax.models.lora`)

    def __post_init__(self):
        family(self.model_type)  # a one-line error for an unknown one
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"unsupported rope type {self.rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"unsupported hidden activation {self.hidden_act!r}; supported: {', '.join(ACTIVATIONS)}")
        if self.layer_types and (len(self.layer_types) != self.num_layers or set(self.layer_types) - set(LAYER_TYPES)):
            raise ValueError(f"layer_types must name one of {', '.join(LAYER_TYPES)} for each of the {self.num_layers} "
                             f"layers; got {list(self.layer_types)}")
        if any(self.sliding) and not (self.sliding_window and self.sliding_window >= 1):
            raise ValueError(f"sliding-attention layers need sliding_window >= 1; got {self.sliding_window}")

    @property
    def sliding(self) -> tuple[bool, ...]:
        """Per layer, whether it attends within `sliding_window` positions only."""
        return tuple(t == "sliding_attention" for t in self.layer_types) or (False,) * self.num_layers

    @property
    def windows(self) -> np.ndarray | None:
        """Per layer `[L]` int32, how many positions back (the query's own included) its queries see: the window
        for a sliding layer, `NO_WINDOW` for a full one; None when no layer slides (nothing to mask)."""
        if not any(self.sliding):
            return None
        return np.array([self.sliding_window if s else NO_WINDOW for s in self.sliding], np.int32)

    @property
    def attention_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @property
    def params_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.param_dtype)

    def replace(self, **changes: Any) -> DecoderConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_hf(cls, hf: dict[str, Any], **overrides: Any) -> DecoderConfig:
        """From a Hugging Face `config.json` dict (transformers 4.x `rope_scaling` or 5.x `rope_parameters`): the
        fields every family reads alike here, its own from its module (`Family.decoder_fields`)."""
        model_type = hf.get("model_type")
        try:
            fam = family(model_type)
        except ValueError as e:
            raise ValueError(f"{e} (config.json)") from None
        heads = hf["num_attention_heads"]
        kwargs = dict(
            model_type=model_type,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            hidden_act=hf.get("hidden_act") or "silu",
            **rope_fields(hf.get("rope_parameters") or hf.get("rope_scaling") or {}, hf.get("rope_theta", 10000.0)),
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            lm_head=not is_sequence_classifier(hf),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=token_ids(hf.get("eos_token_id")),
            pad_token_id=hf.get("pad_token_id"),
        )
        kwargs.update(fam.decoder_fields(hf))
        kwargs.update(overrides)
        return cls(**kwargs)

    def to_hf(self) -> dict[str, Any]:
        """A `config.json` dict that transformers loads as the family's causal LM (`LlamaForCausalLM`, ...), or,
        with a value head, as its sequence classifier (`LlamaForSequenceClassification`, ...) with one label (the
        score)."""
        fam = family(self.model_type)
        arch = fam.sequence_classifier if self.value_head else fam.causal_lm
        rope = {"rope_type": self.rope_type, "rope_theta": self.rope_theta, **dict(self.rope_scaling)}
        if "original_max_position_embeddings" in rope:
            rope["original_max_position_embeddings"] = int(rope["original_max_position_embeddings"])
        hf = dict(
            architectures=[arch], model_type=self.model_type, vocab_size=self.vocab_size,
            hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers, num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads, head_dim=self.head_dim, hidden_act=self.hidden_act,
            rms_norm_eps=self.rms_norm_eps, max_position_embeddings=self.max_position_embeddings,
            rope_parameters=rope, rope_theta=self.rope_theta,
            rope_scaling=None if self.rope_type == "default" else rope,
            tie_word_embeddings=self.tie_word_embeddings, bos_token_id=self.bos_token_id,
            eos_token_id=(list(self.eos_token_ids) if len(self.eos_token_ids) > 1 else
                          (self.eos_token_ids[0] if self.eos_token_ids else None)),
            pad_token_id=self.pad_token_id, dtype=self.param_dtype,
        )
        hf.update(fam.hf_fields(self))
        if self.value_head:
            hf.update(id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
        return hf


def token_ids(value: int | list[int] | None) -> tuple[int, ...]:
    """A Hugging Face token-id field (`eos_token_id`: None, one id or a list of ids) as a tuple of ids."""
    if value is None:
        return ()
    return tuple(int(t) for t in value) if isinstance(value, (list, tuple)) else (int(value),)


def is_sequence_classifier(hf: dict[str, Any]) -> bool:
    """Whether a `config.json` dict is a `*ForSequenceClassification` checkpoint (a `score` head, no LM head)."""
    return any(str(a).endswith("ForSequenceClassification") for a in hf.get("architectures") or ())


# ----------------------------------------------------------------------------------------------------------
# RoPE
# ----------------------------------------------------------------------------------------------------------

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


# ----------------------------------------------------------------------------------------------------------
# KV cache
# ----------------------------------------------------------------------------------------------------------

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
    tokens); end `[]` int32, the next slot to write; logits `[B, V]` float32, the next-token logits after each
    row's last valid token.

    A cache made by `branch(group, size)` also holds P read-only prefixes, prefix p continued by the `group`
    consecutive rows `p*group ... p*group + group - 1` (B = P * group) and attended before their own slots:
    the prefixes' N slots stored block-major (`prefix_blocks`), J blocks of N_b slots: shared_k
    `[L, J, P, K, D, N_b]`, shared_v `[L, J, P, K, N_b, D]`, shared_mask `[J, P, N_b]` (the prefix's valid slots). Each
    row attends to its own prompt's prefix only, so the cost is linear in the number of prompts. Otherwise these
    are None.

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
    shared_k: jax.Array | None = None
    shared_v: jax.Array | None = None
    shared_mask: jax.Array | None = None
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
        return self.shared_mask is not None

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

    def branch(self, group: int, size: int) -> KVCache:
        """A cache of P * `group` new rows with `size` slots of their own, rows `p*group ... p*group + group - 1`
        continuing row p of this P-row cache.

        The rows' common history is not copied: row p becomes prefix p of the new cache's shared prefixes, which
        attention reads once per step for its group instead of once per row (a GRPO group after its prompt; the
        judge's questions after `[instruction, prompt]`). Equal to `take(repeat(arange(P), group))` followed by
        the same extensions, up to float rounding.
        """
        if self.shared:
            raise ValueError("branch() of a branched cache is not supported; branch the prefix cache once")
        if self.ring:
            raise ValueError("branch() of a cache whose sliding layers keep only their window: the prefixes need "
                             "every slot; prefill them with ring=False")
        return _branch(self, group, size)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _branch(cache: KVCache, group: int, size: int) -> KVCache:
    _, p, kh, d, _ = cache.k[0].shape
    shared_k, shared_v, shared_mask = prefix_blocks(jnp.concatenate(cache.k, axis=4),
                                                    jnp.concatenate(cache.v, axis=3), cache.valid)
    own = _empty_cache(cache.sliding, cache.window, p * group, kh, size, d, cache.k[0].dtype, cache.logits.shape[1],
                       ring=True)
    rows = lambda x: jnp.repeat(x, group, axis=0)
    return own.replace(positions=rows(cache.positions), logits=rows(cache.logits), shared_k=shared_k,
                       shared_v=shared_v, shared_mask=shared_mask)


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
    `layer`'s `new` (T slots along `axis`) written at slots `[end, end + T)`; the caller keeps `end + T <= S`.

    One block, or one new token: an in-place update of each block (a block that does not hold the slot rewrites
    its own value there, so decoding touches one slot per block). Several tokens over several blocks (prefill,
    extend): the layer's part of each block is rebuilt from a gather of the tokens that land in it.
    """
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
    """An empty cache of `size` slots for `batch_size` rows, in the compute dtype. `ring`: the sliding layers keep
    only their window when it is shorter than `size` (`KVCache`); False for a cache to `branch` (its prefixes)."""
    return _empty_cache(cfg.sliding, cfg.sliding_window or 0, batch_size, cfg.num_kv_heads, size, cfg.head_dim,
                        cfg.compute_dtype, cfg.vocab_size, ring=ring)


# ----------------------------------------------------------------------------------------------------------
# Layers
# ----------------------------------------------------------------------------------------------------------

def _param(rngs: nnx.Rngs, shape: tuple[int, ...], names: tuple[str | None, ...], dtype, scale: float | None = None,
           init: str = "normal") -> nnx.Param:
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
            setattr(module, name, _param(rngs, shape, names, cfg.params_dtype))


class RMSNorm(nnx.Module):
    """`x / sqrt(mean(x^2) + eps) * scale`, normalized in float32; with an `offset` (Gemma: 1, its weights
    0-centred), `* (offset + scale)` in float32 before the cast back, as Gemma's norm computes it."""

    def __init__(self, dim: int, eps: float, *, param_dtype, rngs: nnx.Rngs, offset: float = 0.0):
        self.eps, self.offset = eps, offset
        self.scale = _param(rngs, (dim,), ("norm",), param_dtype, init="zeros" if offset else "ones")

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
            self.qkv_bias = _param(rngs, (k, h // k + 2, d), ("kv_heads", None, "head_dim"), pd, init="zeros")
        if cfg.o_bias:
            self.o_bias = _param(rngs, (e,), ("embed",), pd, init="zeros")
        if cfg.qk_norm:
            self.q_norm, self.k_norm = norm(cfg, d, rngs), norm(cfg, d, rngs)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: jax.Array,
                 kv_cache: tuple[tuple, tuple] | None = None, end: jax.Array | None = None,
                 shared: tuple[jax.Array, jax.Array, jax.Array] | None = None,
                 query_index: jax.Array | None = None, layer: jax.Array | int = 0, window: Window | None = None,
                 ring: RingStep | None = None, dropout: jax.Array | None = None) -> tuple[jax.Array, tuple | None]:
        """x `[B, T, E]`, cos/sin `[B, T, D]`, mask `[B, T, S]` (S = T without cache) -> `[B, T, E]`, cache.

        `kv_cache` = (key blocks, value blocks) of every layer (`KVCache`: `[L, ...]`); this one, layer `layer`,
        writes its keys and values at slots `[end, end + T)` and reads its own.

        `shared` = this layer's (k `[J, P, K, D, N_b]`, v `[J, P, K, N_b, D]`) and the mask `[J, P, N_b]`: each
        group of B / P rows' prefix in J blocks (`prefix_blocks`), attended before the cache (`KVCache.branch`).
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
            carry = _empty_carry(q)
            if shared is not None:
                prefix_window = None if window is None else (query_positions, window.prefix, window.size)
                carry = shared_attention(carry, q, *shared, scoring=scoring, window=prefix_window)
            if ring is None:
                n_new = k.shape[3]
                kv_cache = (tuple(sharding.constrain(x, KV_K) for x in write_blocks(kv_cache[0], k, end, 3, layer)),
                            tuple(sharding.constrain(x, KV_V) for x in write_blocks(kv_cache[1], v, end, 2, layer)))
                carry = cache_attention(carry, q, *kv_cache, mask, n_slots=end + n_new, layer=layer, scoring=scoring)
            else:
                carry, kv_cache = ring_attention(carry, q, k, v, ring, query_index, scoring)
            out = _normalize(carry)
        out = sharding.constrain(out.astype(x.dtype).transpose(0, 3, 1, 2, 4),  # [B, T, K, G, D], where q was
                                 ("batch", "length", "kv_heads", None, None)).reshape(b, t, cfg.num_heads * d)
        out = checkpoint_name(out, "attn_out")
        y = dense(out, lora.weight(self, "o").reshape(cfg.num_heads * d, -1), self.o_bias[...] if cfg.o_bias else None)
        adapted = None if self.lora is None else lora.delta(self, "o", out.reshape(b, t, cfg.num_heads, d), dropout)
        return (y if adapted is None else y + adapted), kv_cache


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
    `[B, S]` (the attention's own keys or cache slots), prefix `[J, P, N_b]`: a branched cache's prefix slots
    (`prefix_blocks`), else None."""

    size: jax.Array
    query: jax.Array
    key: jax.Array
    prefix: jax.Array | None = None


def _scores(q: jax.Array, k: jax.Array) -> jax.Array:
    """Unscaled attention scores `[B, K, G, T, S]` (float32) of q `[B, K, G, T, D]` against k `[B, K, D, S]`.
    Rows and kv heads stay two batch axes: merging them would merge an axis split over the row axes with one split
    over `tensor`, which XLA does by gathering the cache's kv heads at every decoding step."""
    b, kh, g, t, d = q.shape
    return jnp.einsum("bkqd,bkds->bkqs", q.reshape(b, kh, g * t, d), k.astype(q.dtype),
                      preferred_element_type=jnp.float32).reshape(b, kh, g, t, -1)


def _weighted(p: jax.Array, v: jax.Array) -> jax.Array:
    """`p [B, K, G, T, S] @ v [B, K, S, D]` -> `[B, K, G, T, D]` float32 (rows and kv heads two batch axes)."""
    b, kh, g, t, s = p.shape
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
SHARED_ATTENTION_BLOCK = 512  # prefix slots per block of `shared_attention`


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
    carry, _ = jax.lax.scan(step, _empty_carry(q), (k, v, mask))
    return _normalize(carry)


def _attend(carry: tuple, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
            scoring: Scoring | None = None) -> tuple:
    """One online-softmax step over keys `k [B, K, D, S]`, values `v [B, K, S, D]` visible where `mask [B, T, S]`.

    carry = (running max `[B, K, G, T]`, running sum `[B, K, G, T]`, unnormalized output `[B, K, G, T, D]`).
    """
    scoring = scoring or Scoring(q.shape[-1] ** -0.5)
    s = jnp.where(mask[:, None, None], scoring(_scores(q, k)), _MASK_VALUE)
    return _softmax_step(carry, s, lambda p: _weighted(p, v))


def _softmax_step(carry: tuple, s: jax.Array, weighted_values) -> tuple:
    """Fold masked, scaled scores `s [..., S]` into an online-softmax carry (running max `[...]`, running sum
    `[...]`, unnormalized output `[..., D]`); `weighted_values(p)` -> `[..., D]` is `p @ values`."""
    m, l, acc = carry
    m_new = jnp.maximum(m, s.max(axis=-1))
    p = jnp.exp(s - m_new[..., None])
    scale = jnp.exp(m - m_new)
    return m_new, l * scale + p.sum(axis=-1), acc * scale[..., None] + weighted_values(p)


def _empty_carry(q: jax.Array) -> tuple:
    b, kh, g, t, d = q.shape
    return (jnp.full((b, kh, g, t), _MASK_VALUE, jnp.float32), jnp.zeros((b, kh, g, t), jnp.float32),
            jnp.zeros((b, kh, g, t, d), jnp.float32))


def _normalize(carry: tuple) -> jax.Array:
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
        weighted = lambda w: jnp.einsum("pkqn,pknd->pkqd", w.astype(vj.dtype).reshape(p, kh, m * g * t, nj), vj,
                                        preferred_element_type=jnp.float32).reshape(p, kh, m, g, t, d)
        return _softmax_step(c, s, weighted), None

    carry = tuple(map(to_groups, carry))
    if j == 1:
        carry, _ = fold(carry, tuple(x[0] for x in blocks))
    else:
        carry, _ = jax.lax.scan(fold, carry, blocks)
    return tuple(map(from_groups, carry))


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
            self.gate_up_bias = _param(rngs, (i, 2), ("mlp", None), pd, init="zeros")
            self.down_bias = _param(rngs, (e,), ("embed",), pd, init="zeros")

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


# ----------------------------------------------------------------------------------------------------------
# Decoder
# ----------------------------------------------------------------------------------------------------------

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


def rows_at(x: jax.Array, index: jax.Array) -> jax.Array:
    """`x[b, index[b]]` kept as `[B, 1, ...]` for `x [B, T, ...]` and `index [B]`."""
    return jnp.take_along_axis(x, index.reshape(-1, *([1] * (x.ndim - 1))), axis=1)


def positions_from_mask(mask: jax.Array) -> jax.Array:
    """RoPE positions `[B, T]` of a padded batch: the index of each token among its row's real tokens."""
    return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=1) - 1, 0)


def last_valid_index(mask: jax.Array) -> jax.Array:
    """Index `[B]` of the last real token of each row of `mask [B, T]` (0 for an empty row)."""
    t = mask.shape[1]
    return jnp.where(mask.any(axis=1), t - 1 - jnp.argmax(mask[:, ::-1], axis=1), 0)


def score_index(input_ids: jax.Array, mask: jax.Array, pad_token_id: int | None) -> jax.Array:
    """Index `[B]` of the token a sequence classifier scores in `input_ids [B, T]`: the last real token (`mask`)
    that is not `pad_token_id`, as transformers' `*ForSequenceClassification` picks it (its rightmost non-pad
    token), so a row ending in real tokens equal to the pad id (a pad id that is also EOS) is scored before them.
    With no pad id, the last real token."""
    mask = mask.astype(bool)
    return last_valid_index(mask if pad_token_id is None else mask & (input_ids != pad_token_id))


class Decoder(nnx.Module):
    """The shared decoder (module docstring). `model(input_ids, attention_mask=mask)` -> logits `[B, T, V]` (float32)."""

    def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs):
        from rrc_jax.models.heads import ScalarHead  # local: heads imports nothing from here at import time

        self.cfg = cfg
        self.inv_freq = tuple(float(f) for f in rope_inv_freq(cfg))  # static (hashable) constant, not a parameter
        if cfg.local_rope_theta is not None:  # the sliding layers' RoPE (Gemma 3): default, its own base
            local = cfg.replace(rope_theta=cfg.local_rope_theta, rope_type="default", rope_scaling=())
            self.local_inv_freq = tuple(float(f) for f in rope_inv_freq(local))
        pd = cfg.params_dtype
        self.embed = _param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), pd)
        self.layers = stack_layers([Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)])  # [L, ...] each
        self.final_norm = norm(cfg, cfg.hidden_size, rngs)
        if cfg.lm_head and not cfg.tie_word_embeddings:
            self.lm_head = _param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), pd)
        if cfg.value_head:
            self.value_head = ScalarHead(cfg.hidden_size, param_dtype=pd, rngs=rngs)

    # -- building blocks ---------------------------------------------------------------------------------

    def _run_layers(self, input_ids: jax.Array, positions: jax.Array, mask: jax.Array,
                    cache: KVCache | None = None, last_index: jax.Array | None = None, remat: bool = False,
                    key_positions: jax.Array | None = None, ring: RingStep | None = None,
                    dropout_seed: jax.Array | None = None) -> tuple[jax.Array, tuple | None]:
        """Final-normed hidden states `[B, T, E]` and, when a cache is given, its updated blocks and rings
        (k, v, ring_k, ring_v).

        The layers run under one `lax.scan` over their stacked parameters (one layer traced and compiled, whatever
        L). Without a cache (training, log-probs) the parameters are the scan's input, so their gradient is stacked
        the same way, and with FSDP each step gathers one layer's weights. The backward pass keeps each layer's
        input `[B, T, E]` and `SAVED_RESIDUALS`, and recomputes the rest one layer at a time; with `remat` it keeps
        only the input and recomputes the whole layer. With a cache (prefill, decode) the scan runs
        over layer indices, carrying the stacked cache, which each layer updates in place at its own index. In a
        cache whose sliding layers keep only their window (`KVCache.ring`, `ring` the extend's `ring_plan`), full
        and sliding layers read and write different stacks: the layers run as scans over the repeats of their
        pattern of kinds (`layer_segments`: Gemma 2's (sliding, full), Gemma 3's five sliding then one full), each
        kind known where it is traced (a `lax.switch` on it would copy the whole cache at every layer).

        With `last_index [B]`, only the hidden state `[B, 1, E]` of token `last_index[b]` of each row: the last
        layer, run after the scan, still writes every token's keys and values, but skips the attention and MLP of
        the others (nothing reads them). `key_positions [B, S]`: the positions of the keys (the cache's slots;
        default `positions`), read by sliding layers only (`layer_view`). `dropout_seed [B]` (uint32, without a
        cache): LoRA dropout's seed of each row, its key in layer i `fold_in(key(seed), i)` (`lora.delta`).
        """
        cfg = self.cfg
        x = jnp.take(self.embed[...], input_ids, axis=0).astype(cfg.compute_dtype)
        if cfg.embed_scale:
            x = x * jnp.asarray(math.sqrt(cfg.hidden_size), x.dtype)
        x = sharding.constrain(x, ACTIVATION)
        view = self.layer_view(positions, positions if key_positions is None else key_positions, cache)
        graphdef, params = nnx.split(self.layers)
        if cache is None:
            def layer(h, xs):
                p, i = xs
                cos, sin, window = view(i)
                keys = None if dropout_seed is None else jax.vmap(
                    lambda seed: jax.random.fold_in(jax.random.key(seed), i))(dropout_seed)
                h, _ = nnx.merge(graphdef, p)(h, cos, sin, mask, window=window, dropout=keys)
                return sharding.constrain(h, ACTIVATION), None

            policy = None if remat else jax.checkpoint_policies.save_only_these_names(*SAVED_RESIDUALS)
            x, _ = jax.lax.scan(jax.checkpoint(layer, prevent_cse=False, policy=policy), x,
                                (params, jnp.arange(cfg.num_layers)))
            return self.final_norm(x), None

        sliding = cache.sliding if cache.ring else (False,) * cfg.num_layers
        full_index = jnp.asarray(np.cumsum(~np.asarray(sliding)) - 1)  # a layer's index in its kind's stack
        ring_index = jnp.asarray(np.cumsum(sliding) - 1)

        def run(i, local, carry, query_index=None):  # layer i (traced), a sliding one in ring buffers when `local`
            h, k, v, ring_k, ring_v = carry
            block = nnx.merge(graphdef, jax.tree.map(lambda a: a[i], params))  # a slice of the stacked weights
            shared = (cache.shared_k[i], cache.shared_v[i], cache.shared_mask) if cache.shared else None
            cos, sin, window = view(i)
            if local:
                step = ring._replace(k=ring_k, v=ring_v, index=ring_index[i])
                h, (ring_k, ring_v) = block(h, cos, sin, mask, None, cache.end, shared, query_index, 0, window, step)
            else:
                h, (k, v) = block(h, cos, sin, mask, (k, v), cache.end, shared, query_index, full_index[i], window)
            return sharding.constrain(h, ACTIVATION), k, v, ring_k, ring_v

        n = cfg.num_layers - (last_index is not None)
        carry = (x, cache.k, cache.v, cache.ring_k, cache.ring_v)
        for start, unit, reps in layer_segments(sliding[:n]):  # one scan over each repeated pattern of kinds
            def body(c, j, start=start, unit=unit):
                for offset, local in enumerate(unit):
                    c = run(start + j * len(unit) + offset, local, c)
                return c, None

            carry, _ = jax.lax.scan(body, carry, jnp.arange(reps))
        if last_index is not None:
            carry = run(n, sliding[n], carry, query_index=last_index)
        x, *kv = carry
        return self.final_norm(x), tuple(kv)

    def layer_view(self, positions: jax.Array, key_positions: jax.Array, cache: KVCache | None = None):
        """`view(i)` -> (cos, sin `[B, T, D]`, `Window` or None): what layer `i` (traced) attends with. Full and
        sliding layers differ in their RoPE base when the family has a local one (Gemma 3) and in their window
        (None when no layer slides). positions `[B, T]` of the queries, key_positions `[B, S]`; with a branched
        cache, the prefix slots' positions come from its `shared_mask`."""
        cfg = self.cfg
        cos, sin = rope_cos_sin(positions, self.inv_freq)
        if cfg.local_rope_theta is not None:
            sliding, local = jnp.asarray(cfg.sliding), rope_cos_sin(positions, self.local_inv_freq)
            rope = lambda i: (jnp.where(sliding[i], local[0], cos), jnp.where(sliding[i], local[1], sin))
        else:
            rope = lambda i: (cos, sin)
        if cfg.windows is None:
            return lambda i: (*rope(i), None)
        sizes, prefix = jnp.asarray(cfg.windows), None
        if cache is not None and cache.shared:  # [J, P, N_b] -> each prefix's slots in order -> positions
            j, p, nb = cache.shared_mask.shape
            flat = cache.shared_mask.swapaxes(0, 1).reshape(p, j * nb).astype(jnp.int32)
            prefix = (jnp.cumsum(flat, axis=1) - 1).reshape(p, j, nb).swapaxes(0, 1)
        return lambda i: (*rope(i), Window(sizes[i], positions, key_positions, prefix))

    def hidden_states(self, input_ids: jax.Array, attention_mask: jax.Array | None = None, *,
                      remat: bool = False, dropout_seed: jax.Array | None = None) -> jax.Array:
        """Final-normed hidden states `[B, T, E]` of a padded batch (no cache); `remat`: recompute each block in
        the backward pass; `dropout_seed [B]`: LoRA dropout's seed of each row, in a training pass (`_run_layers`)."""
        if attention_mask is None:
            attention_mask = jnp.ones(input_ids.shape, bool)
        attention_mask = attention_mask.astype(bool)
        t = input_ids.shape[1]
        causal = jnp.tril(jnp.ones((t, t), bool))
        mask = causal[None] & attention_mask[:, None, :]
        h, _ = self._run_layers(input_ids, positions_from_mask(attention_mask), mask, remat=remat,
                                dropout_seed=dropout_seed)
        return h

    def logits_from_hidden(self, h: jax.Array) -> jax.Array:
        """LM-head logits `[..., V]` (float32) of hidden states `[..., E]`."""
        if not self.cfg.lm_head:
            raise ValueError("this model is a sequence classifier (a score head, no LM head): it scores sequences "
                             "(values) but gives no logits and cannot generate; use a causal LM checkpoint")
        w = self.embed[...].T if self.cfg.tie_word_embeddings else self.lm_head[...]
        logits = jnp.dot(h, w.astype(h.dtype), preferred_element_type=jnp.float32).astype(jnp.float32)
        if self.cfg.final_logit_softcapping:
            logits = softcap(logits, self.cfg.final_logit_softcapping)
        return sharding.constrain(logits, ("batch",) + (None,) * (logits.ndim - 2) + ("vocab",))

    # -- public API ----------------------------------------------------------------------------------------

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None) -> jax.Array:
        """Logits `[B, T, V]` (float32) for `input_ids [B, T]`, `attention_mask [B, T]` (1 = real token)."""
        return self.logits_from_hidden(self.hidden_states(input_ids, attention_mask))

    def values(self, input_ids: jax.Array, attention_mask: jax.Array | None = None) -> jax.Array:
        """Scalar value-head scores `[B]` (the DRM reward, Eq. 1) of `input_ids [B, T]`, read at each row's last
        real token that is not the pad id (`score_index`, as transformers' sequence classifiers)."""
        if not self.cfg.value_head:
            raise ValueError("this model has no value head; build it with DecoderConfig(value_head=True)")
        if attention_mask is None:
            attention_mask = jnp.ones(input_ids.shape, bool)
        h = self.hidden_states(input_ids, attention_mask)
        index = score_index(input_ids, attention_mask, self.cfg.pad_token_id)
        last = jnp.take_along_axis(h, index[:, None, None], axis=1)[:, 0]
        return self.value_head(last)

    def token_logprobs(self, input_ids: jax.Array, attention_mask: jax.Array | None = None, *,
                       chunk_size: int = 128, return_entropy: bool = False, temperature: float = 1.0,
                       remat: bool = False, dropout_seed: jax.Array | None = None
                       ) -> jax.Array | tuple[jax.Array, jax.Array]:
        """Log-probabilities `[B, T]` of each token given the ones before it, under `softmax(logits / temperature)`
        (the distribution a sampler at that temperature draws from); column 0 is 0.

        The LM head and log-softmax run over `chunk_size` positions at a time under `jax.checkpoint`, so neither
        the forward nor the backward pass materializes `[B, T, V]` logits. With `return_entropy`, also the
        entropy `[B, T]` of the predictive distribution that produced each token (column 0 is 0). `remat`: the
        decoder blocks are recomputed in the backward pass (`hidden_states`). `dropout_seed [B]` (uint32): a
        training pass with LoRA dropout, each row's masks drawn from its seed (so the same whatever the
        micro-batches); without it, none.
        """
        b, t = input_ids.shape
        h = self.hidden_states(input_ids, attention_mask, remat=remat, dropout_seed=dropout_seed)[:, :-1]
        targets = input_ids[:, 1:]
        n = t - 1
        c = max(1, min(chunk_size, n))
        pad = (-n) % c
        h = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, pad)))
        h = h.reshape(b, -1, c, h.shape[-1]).swapaxes(0, 1)  # [chunks, B, c, E]
        targets = targets.reshape(b, -1, c).swapaxes(0, 1)

        @jax.checkpoint
        def chunk(args):
            hc, tc = args
            logp = jax.nn.log_softmax(self.logits_from_hidden(hc) / temperature, axis=-1)
            tok = jnp.take_along_axis(logp, tc[..., None], axis=-1)[..., 0]
            ent = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
            return tok, ent

        tok, ent = jax.lax.map(chunk, (h, targets))
        fix = lambda x: jnp.pad(x.swapaxes(0, 1).reshape(b, -1)[:, :n], ((0, 0), (1, 0)))
        return (fix(tok), fix(ent)) if return_entropy else fix(tok)

    def extend(self, cache: KVCache, input_ids: jax.Array, attention_mask: jax.Array | None = None) -> KVCache:
        """Append `input_ids [B, T]` (real where `attention_mask`) to `cache` at slots `[end, end + T)`.

        Returns the updated cache whose `logits` are the next-token logits after each row's last real token
        (unchanged for a row with no real token in this chunk). The caller keeps `end + T <= cache.size`
        (`rrc_jax.inference.sampling` checks it with a clear error).
        """
        if attention_mask is None:
            attention_mask = jnp.ones(input_ids.shape, bool)
        new = attention_mask.astype(bool)
        t, s = input_ids.shape[1], cache.size
        valid = jax.lax.dynamic_update_slice_in_dim(cache.valid, new, cache.end, axis=1)
        slot_q = cache.end + jnp.arange(t)
        mask = valid[:, None, :] & (jnp.arange(s)[None, None, :] <= slot_q[None, :, None])
        positions = cache.positions[:, None] + jnp.maximum(jnp.cumsum(new.astype(jnp.int32), axis=1) - 1, 0)
        key_positions = None
        if self.cfg.windows is not None:  # a slot's position: the row's tokens before it (its prefix's included)
            before = cache.positions - cache.valid.sum(axis=1, dtype=jnp.int32)
            key_positions = before[:, None] + jnp.cumsum(valid.astype(jnp.int32), axis=1) - 1
        ring, ring_positions = None, cache.ring_positions
        if cache.ring:
            ring, ring_positions = ring_plan(cache.ring_positions, positions, cache.positions, new, cache.window)
        last = last_valid_index(new) if t > 1 else None  # (one token: the layers' output is already [B, 1, E])
        h, (k, v, ring_k, ring_v) = self._run_layers(input_ids, positions, mask, cache, last_index=last,
                                                     key_positions=key_positions, ring=ring)
        last = h[:, 0]
        logits = jnp.where(new.any(axis=1)[:, None], self.logits_from_hidden(last), cache.logits)
        return cache.replace(k=k, v=v, ring_k=ring_k, ring_v=ring_v, ring_positions=ring_positions, valid=valid,
                             positions=cache.positions + new.sum(axis=1, dtype=jnp.int32), end=cache.end + t,
                             logits=logits)
