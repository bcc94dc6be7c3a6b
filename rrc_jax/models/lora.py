"""LoRA adapters on the decoder's projections, and a quantized frozen base (QLoRA).

LoRA ("LoRA: Low-Rank Adaptation of Large Language Models", section 4.1): a frozen weight `W [In, Out]` gains a
trainable product `A [In, r] @ B [r, Out]`, the layer computing `x W + (alpha / r) x A B`; `B` starts at zero, so
the adapted model starts as the base. QLoRA ("QLoRA: Efficient Finetuning of Quantized LLMs", section 3) stores the
frozen base in 4-bit NormalFloat (nf4, one scale per block of 64 input weights) and trains the same adapters
through it; int8 (one scale per output channel) is the milder option.

The adapters are per Hugging Face projection (`LORA_TARGETS`: q, k, v, o, gate, up, down), as PEFT keeps them, so
that an adapter directory maps one to one (`rrc_jax.models.peft_io`); their deltas are added to the decoder's fused
products (`qkv`'s query, key and value groups, `gate_up`'s two halves). Like every layer weight they are stacked on
the `layers` axis and run under the decoder's scan, with logical axes that shard them like the weight they adapt
(the rank axis over fsdp, `RANK`). They are `nnx.LoRAParam`s, float32 whatever the base's dtype: the learner
differentiates and updates them only (`trainable`), the rollout copy syncs them only, checkpoints hold them only.
LoRA dropout (`LoraConfig.dropout`, PEFT's `lora_dropout`) drops each adapter's input in the learner's forward pass
only, with masks drawn from a seed per row (`Decoder.token_logprobs`'s `dropout_seed`): the same whatever the
micro-batches, and the same again after a resume.

Why not qwix's `LoraProvider`: it finds a weight by intercepting the operations of the module that owns it, during
one traced method of an unscanned model, and creates the adapters there. The decoder's layers are one stacked module
sliced inside a `lax.scan` and entered through several methods (`token_logprobs`, `extend`, `values`): the adapters
it would create belong to a per-step slice and are lost. The quantization is qwix's (`qwix.quantize`,
`qwix.dequantize`: its nf4 code book and absmax calibration), applied one layer at a time as a checkpoint loads and
undone one layer at a time inside the scan.

Shapes: E embed, H heads, K kv heads, G = H / K, D head dim, I mlp width, r rank, L layers.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from rrc_jax import sharding
from rrc_jax.settings import at_least, field_error, not_in_config, one_of

LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")  # the projections, by their Hugging Face names
WEIGHT_QTYPES = ("", "int8", "nf4")  # the frozen base's storage ("": the compute dtype)
# The base weights a quantized base stores in `weight_qtype`, and which of their axes are inputs (the contracted
# ones; the scales run along the others). The embedding, norms and LM head stay in the compute dtype, as in QLoRA.
QUANTIZED_WEIGHTS = {"qkv": (0,), "o": (0, 1), "gate_up": (0,), "down": (0,)}
# The logical axis of an adapter's rank (`rrc_jax.sharding.LOGICAL_RULES`): over fsdp in the training layout, so that
# B (whose other axes are tensor's or unsplit) is sharded like the weights; whole in the inference layout.
RANK = "lora_rank"


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """LoRA on the policy (`policy.lora`): rank 0 is a full fine-tune. Hashable: it is part of the static
    `DecoderConfig`."""

    GROUP: ClassVar[str] = "policy.lora"
    rank: int = 0  # r; 0: no adapters, every weight trains (float32 master weights)
    alpha: float = 16.0  # the adapters' products are scaled by alpha / r (PEFT's lora_alpha)
    targets: str = "q,k,v,o,gate,up,down"  # the adapted projections, comma-separated (`LORA_TARGETS`)
    dropout: float = 0.0  # on each adapter's input in the learner's forward pass (PEFT's lora_dropout)
    weight_qtype: str = ""  # the frozen base: "" (the compute dtype), "int8" or "nf4" (QLoRA)
    block_size: int = 64  # nf4: input weights per scale (QLoRA's 64)
    # a frozen model's quantized weights without adapters (`frozen_base`: a judge in int8); set by the code
    frozen: bool = not_in_config(False)

    def __post_init__(self):
        at_least("policy.lora", "rank", self.rank, 0)
        if self.rank and not self.alpha > 0:
            raise field_error("policy.lora", "alpha", f"{self.alpha} must be > 0")
        unknown = [t for t in self.target_names if t not in LORA_TARGETS]
        if unknown or (self.rank and not self.target_names):
            raise field_error("policy.lora", "targets", f"{self.targets!r}: name some of {', '.join(LORA_TARGETS)}")
        if not 0.0 <= self.dropout < 1.0:  # also NaN
            raise field_error("policy.lora", "dropout", f"{self.dropout} must be in [0, 1)")
        one_of("policy.lora", "weight_qtype", self.weight_qtype, WEIGHT_QTYPES)
        if self.weight_qtype and not self.rank and not self.frozen:
            raise field_error("policy.lora", "weight_qtype", f"{self.weight_qtype!r} quantizes the frozen base of "
                              "LoRA; set policy.lora.rank > 0 too (a full fine-tune trains every weight)")
        at_least("policy.lora", "block_size", self.block_size, 1)

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def applies(self) -> bool:
        """Whether a model loaded with it differs from the checkpoint's: adapters, or quantized weights."""
        return self.enabled or bool(self.weight_qtype)


    @property
    def target_names(self) -> tuple[str, ...]:
        return tuple(t.strip() for t in self.targets.split(",") if t.strip())

    @property
    def scale(self) -> float:
        """alpha / r, the adapters' factor."""
        return self.alpha / self.rank

    def check_rank(self, cfg, where: str) -> None:
        """A `ConfigError` when `rank` exceeds the smaller side of a targeted projection of the model `cfg` (a
        `DecoderConfig`, `where` its directory): `A B` of rank r > min(In, Out) is no longer low-rank, and PEFT
        refuses to load such adapters."""
        e, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
        sides = {"q": (e, cfg.num_heads * d), "k": (e, cfg.num_kv_heads * d), "v": (e, cfg.num_kv_heads * d),
                 "o": (cfg.num_heads * d, e), "gate": (e, i), "up": (e, i), "down": (i, e)}
        for name in self.target_names:
            if self.rank > min(sides[name]):
                raise field_error("policy.lora", "rank", f"{self.rank} exceeds the smaller side of {where}'s {name} "
                                  f"projection ({sides[name][0]} x {sides[name][1]}); use a rank <= "
                                  f"{min(min(sides[t]) for t in self.target_names)}")


def frozen_base(weight_qtype: str) -> LoraConfig | None:
    """The weights of a model that never trains (the judge) stored in `weight_qtype` ("int8", "nf4"; "": None, the
    compute dtype) as a QLoRA base is, with no adapters: each projection dequantized one layer at a time as the
    decoder's scan reaches it, so that decoding reads a byte a weight (int8) instead of two (bfloat16)."""
    return LoraConfig(weight_qtype=weight_qtype, frozen=True) if weight_qtype else None


def trainable(model) -> type[nnx.Variable]:
    """What the learner trains in `model`: its adapters (`nnx.LoRAParam`) under LoRA, else every `nnx.Param`."""
    lora = getattr(getattr(model, "cfg", None), "lora", None)
    return nnx.LoRAParam if lora is not None and lora.enabled else nnx.Param


# -- adapters ---------------------------------------------------------------------------------------------------

def add_adapters(module: nnx.Module, lora: LoraConfig, rngs: nnx.Rngs,
                 shapes: dict[str, tuple[tuple[int, ...], tuple, tuple[int, ...], tuple]]) -> None:
    """Give `module` the adapters of its targeted projections: `shapes` maps a projection of `LORA_TARGETS` to
    (input shape, its logical axes, output shape, its logical axes); projection p gets `p_lora_a [*In, r]` (PEFT's
    init: uniform in +-1/sqrt(fan_in)) and `p_lora_b [r, *Out]` (zeros)."""
    for name, (in_shape, in_names, out_shape, out_names) in shapes.items():
        if name not in lora.target_names:
            continue
        bound = 1.0 / math.sqrt(math.prod(in_shape))
        a = jax.random.uniform(rngs.params(), (*in_shape, lora.rank), jnp.float32, -bound, bound)
        setattr(module, f"{name}_lora_a", sharding.param(a, (*in_names, RANK), nnx.LoRAParam))
        setattr(module, f"{name}_lora_b", sharding.param(jnp.zeros((lora.rank, *out_shape), jnp.float32),
                                                        (RANK, *out_names), nnx.LoRAParam))


def init_adapters(model, layout: sharding.Layout, seed: int = 0) -> None:
    """Fill the (abstract) adapters of a loaded `model` as `add_adapters` initializes them, each layer's `A` drawn
    from its own key, placed where `layout` puts them (`load_hf`)."""
    for i, (path, var) in enumerate(nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))):
        shape, names = var.shape, tuple(var.out_sharding)
        placed = layout.sharding(names, shape) if layout.mesh is not None else None
        if path[-1].endswith("_lora_a"):  # [L, *In, r]
            bound = 1.0 / math.sqrt(math.prod(shape[1:-1]))
            key = jax.random.fold_in(jax.random.key(seed), i)
            make = lambda key=key: jax.random.uniform(key, shape, jnp.float32, -bound, bound)
        else:
            make = lambda: jnp.zeros(shape, jnp.float32)
        var.set_value(jax.jit(make, out_shardings=placed)())


def dropped(x: jax.Array, keys: jax.Array, rate: float) -> jax.Array:
    """Inverted dropout of `x [B, ...]`, row b's mask drawn from `keys[b]` (`keys [B]`, typed): each element is
    zeroed with probability `rate` and the others scaled by 1 / (1 - rate), so that the expectation is `x`."""
    keep = jax.vmap(lambda k: jax.random.bernoulli(k, 1.0 - rate, x.shape[1:]))(keys)
    return jnp.where(keep, x / jnp.asarray(1.0 - rate, x.dtype), jnp.zeros((), x.dtype))


def delta(module: nnx.Module, name: str, x: jax.Array, dropout: jax.Array | None = None) -> jax.Array | None:
    """Projection `name`'s adapter applied to its input `x [B, T, *In]`: `(alpha / r) x A B` `[B, T, *Out]` (LoRA
    Eq. 3), in `x`'s dtype; None when `name` has no adapter. `dropout [B]` (typed keys, the rows' keys of this
    layer): in a training forward pass, `x` goes through LoRA dropout (`LoraConfig.dropout`) first, as PEFT's
    `lora_B(lora_A(dropout(x)))`, each projection with its own mask."""
    a = getattr(module, f"{name}_lora_a", None)
    if a is None:
        return None
    if dropout is not None and module.lora.dropout > 0:  # each projection's own keys
        keys = jax.vmap(jax.random.fold_in, (0, None))(dropout, LORA_TARGETS.index(name))
        x = dropped(x, keys, module.lora.dropout)
    a, b = a[...], getattr(module, f"{name}_lora_b")[...]
    n_in = a.ndim - 1
    lead = x.shape[:x.ndim - n_in]
    xa = x.reshape(*lead, -1) @ a.reshape(-1, a.shape[-1]).astype(x.dtype)  # [..., r]
    out = (xa @ b.reshape(b.shape[0], -1).astype(x.dtype)).reshape(*lead, *b.shape[1:])
    return out * jnp.asarray(module.lora.scale, x.dtype)


def fused_delta(module: nnx.Module, names: tuple[str, ...], x: jax.Array, shapes: tuple[tuple[int, ...], ...],
                axis: int, stack: bool = False, dropout: jax.Array | None = None) -> jax.Array | None:
    """The deltas of the projections `names` that make one fused product, joined along its `axis` (concatenated,
    or stacked on a new last axis with `stack`), zeros for an untargeted one (`shapes`: each one's output shape);
    None when none is targeted. `dropout`: as `delta`'s."""
    parts = [delta(module, n, x, dropout) for n in names]
    if all(p is None for p in parts):
        return None
    lead = x.shape[:-1]
    parts = [jnp.zeros((*lead, *s), x.dtype) if p is None else p for p, s in zip(parts, shapes)]
    return jnp.stack(parts, axis=-1) if stack else jnp.concatenate(parts, axis=axis)


# -- the quantized base -----------------------------------------------------------------------------------------

def qtype(name: str):
    """qwix's qtype of a `weight_qtype`."""
    return jnp.int8 if name == "int8" else name


def scale_shape(shape: tuple[int, ...], inputs: tuple[int, ...], lora: LoraConfig) -> tuple[int, ...]:
    """The scales' shape of a weight of `shape` whose `inputs` axes are contracted: int8, one per output channel
    (the inputs reduced); nf4, one per `block_size` consecutive weights of the last input axis (the whole axis when
    the block does not divide it) and per index of the other axes."""
    out = list(shape)
    if lora.weight_qtype == "int8":
        for i in inputs:
            out[i] = 1
    else:
        last = inputs[-1]
        out[last] = shape[last] // _block(shape[last], lora.block_size)
    return tuple(out)


def _block(n: int, block: int) -> int:
    return block if n % block == 0 else n


def quantize(w: jax.Array, inputs: tuple[int, ...], lora: LoraConfig, scale_dtype) -> tuple[jax.Array, jax.Array]:
    """`w` (one layer's weight) as qwix stores it in `lora.weight_qtype`: (values, scales of `scale_shape`)."""
    import qwix  # heavy (1.4 s): only for a quantized base

    others = tuple(i for i in range(w.ndim) if i not in inputs)
    if lora.weight_qtype == "int8":
        q = qwix.quantize(w, qtype("int8"), channelwise_axes=others, scale_dtype=scale_dtype)
    else:
        last = inputs[-1]
        q = qwix.quantize(w, qtype("nf4"), channelwise_axes=others + inputs[:-1],
                          tiled_axes={last: _block(w.shape[last], lora.block_size)}, scale_dtype=scale_dtype)
    return q.qvalue, q.scale


def storage_dtype(lora: LoraConfig):
    """The dtype of a quantized weight's values: int8, or nf4's 4-bit codes (uint4)."""
    return jnp.int8 if lora.weight_qtype == "int8" else jnp.uint4


def add_quantized(module: nnx.Module, name: str, shape: tuple[int, ...], names: tuple, lora: LoraConfig,
                  scale_dtype) -> None:
    """`module.<name>` as a quantized weight: its values (`storage_dtype`, filled as a checkpoint loads) and
    `<name>_scale` (`scale_shape`), on the weight's logical axes (an axis the mesh does not divide is whole)."""
    inputs = QUANTIZED_WEIGHTS[name]
    s_shape = scale_shape(shape, inputs, lora)
    setattr(module, name, sharding.param(jnp.zeros(shape, storage_dtype(lora)), names))
    setattr(module, f"{name}_scale", sharding.param(jnp.ones(s_shape, scale_dtype), names))  # (too short: whole)


def weight(module: nnx.Module, name: str) -> jax.Array:
    """The weight `name` of `module` as the matmul reads it: dequantized (qwix) when the base is quantized."""
    value = getattr(module, name)[...]
    scale = getattr(module, f"{name}_scale", None)
    if scale is None:
        return value
    import qwix  # heavy (1.4 s): only for a quantized base

    return qwix.dequantize(qwix.QArray(value, scale[...], qtype=qtype(module.lora.weight_qtype)))


def is_quantized(model) -> bool:
    lora = getattr(getattr(model, "cfg", None), "lora", None)
    return lora is not None and bool(lora.weight_qtype)


# -- views of an adapted model ------------------------------------------------------------------------------------

def frozen_copy(model):
    """A model that computes as `model` does now and never changes: its base shared (frozen, never donated), its
    adapters copied (a few MB). The reference of a LoRA run: the base with the run's initial adapters (zero: the
    base itself), without a second copy of the base."""
    graphdef, state = nnx.split(model)
    state = jax.tree.map(lambda v: v.replace(jnp.copy(v[...])) if isinstance(v, nnx.LoRAParam) else v, state,
                         is_leaf=lambda v: isinstance(v, nnx.Variable))
    return nnx.merge(graphdef, state)


def merged_layers(model) -> dict[tuple[str, ...], jax.Array]:
    """The base weights of every stacked layer with the adapters folded in (`W + (alpha / r) A B`, float32,
    dequantized): path in the decoder (`("layers", "attn", "qkv")`, ...) -> `[L, ...]`."""
    cfg, layers = model.cfg, model.layers
    k, g, d = cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads, cfg.head_dim
    f32 = lambda x: x.astype(jnp.float32)
    per_layer = lambda fn: jax.vmap(fn)  # over the stacked layers

    def product(module, name):  # [L, *In, *Out] of one projection's A B, times alpha / r
        a, b = getattr(module, f"{name}_lora_a", None), getattr(module, f"{name}_lora_b", None)
        if a is None:
            return None
        return per_layer(lambda a, b: jnp.tensordot(a, b, axes=1))(a[...], b[...]) * cfg.lora.scale

    def dequantized(module, name):
        if getattr(module, f"{name}_scale", None) is None:
            return f32(getattr(module, name)[...])
        import qwix  # heavy (1.4 s): only for a quantized base

        q = qwix.QArray(getattr(module, name)[...], getattr(module, f"{name}_scale")[...],
                        qtype=qtype(cfg.lora.weight_qtype))
        return f32(per_layer(qwix.dequantize)(q))

    attn, mlp = layers.attn, layers.mlp
    e, i = cfg.hidden_size, cfg.intermediate_size
    ln = cfg.num_layers
    zeros = lambda *s: jnp.zeros((ln, *s), jnp.float32)
    qkv = dequantized(attn, "qkv")
    parts = [product(attn, n) for n in ("q", "k", "v")]
    if any(p is not None for p in parts):
        shapes = ((e, k, g, d), (e, k, 1, d), (e, k, 1, d))
        qkv = qkv + jnp.concatenate([zeros(*s) if p is None else p for p, s in zip(parts, shapes)], axis=-2)
    o = dequantized(attn, "o") + (0 if product(attn, "o") is None else product(attn, "o"))
    gate_up = dequantized(mlp, "gate_up")
    parts = [product(mlp, n) for n in ("gate", "up")]
    if any(p is not None for p in parts):
        gate_up = gate_up + jnp.stack([zeros(e, i) if p is None else p for p in parts], axis=-1)
    down = dequantized(mlp, "down") + (0 if product(mlp, "down") is None else product(mlp, "down"))
    return {("layers", "attn", "qkv"): qkv, ("layers", "attn", "o"): o, ("layers", "mlp", "gate_up"): gate_up,
            ("layers", "mlp", "down"): down}


def merge(model, param_dtype: str | None = None):
    """A plain `Decoder` (no adapters, no quantization) equal to `model` with its adapters folded into the base
    (`merged_layers`), its parameters in `param_dtype` (default: the base's compute dtype): what `save_hf` writes as a
    Hugging Face checkpoint."""
    cfg = model.cfg
    plain = cfg.replace(lora=None, param_dtype=param_dtype or cfg.dtype)
    merged = merged_layers(model)
    _, state = nnx.split(model)
    flat = dict(nnx.to_flat_state(state))
    with sharding.model_context(None):
        out = nnx.eval_shape(lambda: type(model)(plain, rngs=nnx.Rngs(0)))  # a `Decoder`, abstract
    target = nnx.state(out)
    for path, var in nnx.to_flat_state(target):
        value = merged[path] if path in merged else flat[path][...]
        var.set_value(jnp.asarray(value).astype(plain.params_dtype))
    nnx.update(out, target)
    return out


def adapter_count(model) -> int:
    """The number of adapter parameters of `model` (0 without LoRA)."""
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam)))
