"""The decoder's architecture: `DecoderConfig`, the fields the model families set (`rrc_jax.models.families`) and the
features they switch on, read from and written to a Hugging Face `config.json`."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rrc_jax.models.families import family
from rrc_jax.models.families.base import rope_fields
from rrc_jax.models.lora import LoraConfig


SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


LAYER_TYPES = ("full_attention", "sliding_attention")  # `config.json`'s `layer_types`
# A KV cache's storage besides the compute dtype: float8 (e4m3), a byte a value, no scales to carry; keys and values
# are cast to it as written and back to the compute dtype as attention reads them
KV_DTYPES = ("", "float8_e4m3fn")


NO_WINDOW = np.iinfo(np.int32).max  # the window of a full-attention layer


ACTIVATIONS = {"silu": jax.nn.silu, "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True)}


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
    kv_dtype: str = ""  # the KV cache's storage: "" (the compute dtype) or KV_DTYPES' 1-byte float8 (a frozen judge)
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
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype={self.kv_dtype!r}: use one of {', '.join(map(repr, KV_DTYPES))}")
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
    def cache_dtype(self) -> jnp.dtype:
        """What the KV cache stores keys and values in: `kv_dtype`, else the compute dtype."""
        return jnp.dtype(self.kv_dtype or self.dtype)

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
