"""The models of a plan: a size preset, a Hugging Face directory or the toy world's (`model_config`), their
parameters read from the decoder built abstractly (`param_shapes`: `nnx.eval_shape`), and the bytes each device holds
of them in a layout on a mesh (`param_bytes`, `lora_param_bytes`)."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import jax.numpy as jnp
from flax import nnx

from rrc_jax.data.toy.task import ALPHABET, TOY_MODELS
from rrc_jax.data.toy.world import ModelSpec
from rrc_jax.data.toy.world import model_config as toy_config
from rrc_jax.errors import ConfigError
from rrc_jax.models import families, real_model
from rrc_jax.models.char_tokenizer import SPECIAL_TOKENS
from rrc_jax.models.decoder import Decoder
from rrc_jax.models.decoder_config import DecoderConfig
from rrc_jax.models.hf_io import read_hf_config
from rrc_jax.models.lora import frozen_base
from rrc_jax.sharding import LAYOUTS, MESH_AXES, model_context, partition

# Size presets: DecoderConfig fields from the public Hugging Face config.json of each model, one family's in its
# module (`rrc_jax.models.families`).
PRESETS = families.presets()


def model_config(name: str, *, field: str = "models.policy", value_head: bool = False):
    """The `DecoderConfig` of a role: a size preset (`PRESETS`), `toy` (the toy world's sizes, `TOY_MODELS`; the
    world is not built), `real` (the real model's preset, `real_model.PRESET`; not built either) or a Hugging Face
    directory (its `config.json`). `field` names the config field in errors."""
    name = real_model.PRESET if name == "real" else name
    if name in PRESETS:
        return DecoderConfig(**PRESETS[name], value_head=value_head)
    if name == "toy":
        role = field.rsplit(".", 1)[-1]
        spec = ModelSpec(**TOY_MODELS["policy" if role == "reference" else role])
        return toy_config(spec, len(SPECIAL_TOKENS) + len(ALPHABET), value_head=value_head)
    path = Path(name).expanduser()
    if not (path / "config.json").is_file():
        raise ConfigError(f"config.{field}={name!r}: not a size preset (known: {', '.join(PRESETS)}), 'toy', or a "
                          "Hugging Face directory with a config.json")

    return DecoderConfig.from_hf(read_hf_config(path), value_head=value_head)


def param_shapes(cfg) -> dict[tuple, tuple[tuple[int, ...], tuple[str | None, ...]]]:
    """Every parameter of `Decoder(cfg)`: its state path -> (shape, logical axis names), read from the decoder built
    abstractly (`nnx.eval_shape`: nothing allocated, so a family's own parameters count without a table here)."""
    return dict(_param_shapes(cfg))


@functools.lru_cache(maxsize=64)
def _param_shapes(cfg) -> tuple:
    with model_context(None):
        model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    return tuple((tuple(path), (tuple(v.shape), tuple(v.get_metadata()["out_sharding"])))
                 for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param)))


def param_count(cfg) -> int:
    """The number of parameters of `Decoder(cfg)`."""
    return sum(math.prod(shape) for shape, _ in param_shapes(cfg).values())


def mesh_axes(names, shape, mesh_shape, layout: str = "train") -> list[int]:
    """Ways each axis of an array of `shape` with logical `names` is split on a `(data, fsdp, tensor)` mesh in
    `layout` (`rrc_jax.sharding.partition`: an axis its mesh axes do not divide is replicated, as JAX places it)."""
    size = dict(zip(MESH_AXES, mesh_shape))
    return [math.prod(size[a] for a in axes) for axes in partition(names, shape, LAYOUTS[layout], size)]


def param_bytes(cfg, dtype: str, mesh_shape: tuple[int, int, int], layout: str = "train") -> int:
    """Bytes per device of `Decoder(cfg)`'s parameters stored in `dtype` on a `(data, fsdp, tensor)` mesh in
    `layout` (`rrc_jax.sharding.LAYOUTS`): each parameter's shard, replicated over data (and, in the inference
    layout, over fsdp); an axis its mesh axes do not divide is whole."""
    return sum(shard_size(shape, names, mesh_shape, layout)
               for shape, names in param_shapes(cfg).values()) * itemsize(dtype)


def shard_size(shape, names, mesh_shape, layout: str) -> int:
    """Elements on one device of an array of `shape` with logical `names` (`mesh_axes`)."""
    return math.prod(n // w for n, w in zip(shape, mesh_axes(names, shape, mesh_shape, layout)))


def itemsize(dtype: str) -> int:
    return {"float32": 4, "bfloat16": 2, "float8_e4m3fn": 1}[dtype]


def weight_bytes(cfg, dtype: str, mesh_shape: tuple[int, int, int], layout: str = "train", qtype: str = "") -> int:
    """`param_bytes`, or with `qtype` ("int8", "nf4") the bytes of the weights of a frozen model stored so
    (`rrc_jax.models.lora.frozen_base`: the projections quantized with their scales, the rest in `dtype`)."""
    if not qtype:
        return param_bytes(cfg, dtype, mesh_shape, layout)
    return lora_param_bytes(cfg, frozen_base(qtype), dtype, mesh_shape, layout)[0]


def lora_param_bytes(cfg, lora, dtype: str, mesh_shape: tuple[int, int, int], layout: str = "train"
                     ) -> tuple[int, int, int]:
    """(frozen base, adapters, adapter count) per device of `Decoder(cfg)` under `lora` (`LoraConfig`) on a mesh in
    `layout`: the base in `dtype` or quantized (`weight_qtype`: int8 values, or nf4's 4-bit codes at half a byte,
    with their scales in `dtype`), the adapters float32; counted on the decoder's own abstract parameters."""
    base = adapters = count = 0
    for shape, names, bits, adapter in _lora_leaves(cfg, lora, dtype):
        size = shard_size(shape, names, mesh_shape, layout) * bits // 8
        if adapter:
            adapters, count = adapters + size, count + math.prod(shape)
        else:
            base += size
    return base, adapters, count


@functools.lru_cache(maxsize=16)
def _lora_leaves(cfg, lora, dtype: str) -> tuple[tuple[tuple[int, ...], tuple, int, bool], ...]:
    """(shape, logical axes, bits per element, is an adapter) of each parameter of `Decoder(cfg)` under `lora`,
    from the decoder built abstractly (nothing allocated)."""
    with model_context(None):
        model = nnx.eval_shape(lambda: Decoder(cfg.replace(lora=lora, param_dtype=dtype), rngs=nnx.Rngs(0)))
    return tuple((tuple(v.shape), tuple(v.out_sharding or ()),
                  4 if v.dtype == jnp.uint4 else jnp.dtype(v.dtype).itemsize * 8, isinstance(v, nnx.LoRAParam))
                 for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param)))


def matmul_params(cfg) -> int:
    """Parameters a token multiplies by: all but the embedding lookup (the tied embedding is the LM head)."""
    return param_count(cfg) - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)
