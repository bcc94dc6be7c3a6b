"""Hugging Face checkpoints <-> `Decoder`, without torch.

`load_hf(dir)` reads `config.json` and `model.safetensors` (or the shards listed in
`model.safetensors.index.json`) one tensor at a time: each tensor is memory-mapped, converted to our layout and
dtype, placed on its device(s) and released before the next, so host RAM never holds a second copy of the model.
`save_hf(model, dir)` writes `config.json` and safetensors shards that transformers loads as
`LlamaForCausalLM` / `Qwen2ForCausalLM`.

Tokenizers come from the same directory through `AutoTokenizer`; `prompt_ids` renders a user prompt with the
tokenizer's chat template when it has one and uses the raw text otherwise (the documented fallback).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from rrc_jax import sharding
from rrc_jax.models.decoder import Decoder, DecoderConfig

Transform = Callable[[np.ndarray], np.ndarray]
_ident: Transform = lambda w: w


def _tensor_map(cfg: DecoderConfig) -> dict[str, tuple[tuple[Any, ...], Transform, Transform]]:
    """HF tensor name -> (path of the parameter in `Decoder`, HF->ours transform, ours->HF transform)."""
    e, h, k, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    t = lambda w: w.T
    heads_in = lambda n: (lambda w: w.T.reshape(e, n, d), lambda w: w.reshape(e, n * d).T)  # [n*d, e] <-> [e, n, d]
    bias = lambda n: (lambda w: w.reshape(n, d), lambda w: w.reshape(n * d))
    m: dict[str, tuple[tuple[Any, ...], Transform, Transform]] = {
        "model.embed_tokens.weight": (("embed",), _ident, _ident),
        "model.norm.weight": (("final_norm", "scale"), _ident, _ident),
    }
    if not cfg.tie_word_embeddings:
        m["lm_head.weight"] = (("lm_head",), t, t)
    if cfg.value_head:
        m["score.weight"] = (("value_head", "kernel"), lambda w: w[0], lambda w: w[None])
    for i in range(cfg.num_layers):
        p, L = f"model.layers.{i}.", ("layers", i)
        m[p + "input_layernorm.weight"] = (L + ("attn_norm", "scale"), _ident, _ident)
        m[p + "post_attention_layernorm.weight"] = (L + ("mlp_norm", "scale"), _ident, _ident)
        for name, n in (("q", h), ("k", k), ("v", k)):
            m[p + f"self_attn.{name}_proj.weight"] = (L + ("attn", name), *heads_in(n))
            if cfg.qkv_bias:
                m[p + f"self_attn.{name}_proj.bias"] = (L + ("attn", f"{name}_bias"), *bias(n))
        m[p + "self_attn.o_proj.weight"] = (L + ("attn", "o"), lambda w: w.T.reshape(h, d, e),
                                            lambda w: w.reshape(h * d, e).T)
        if cfg.o_bias:
            m[p + "self_attn.o_proj.bias"] = (L + ("attn", "o_bias"), _ident, _ident)
        for name in ("gate", "up", "down"):
            m[p + f"mlp.{name}_proj.weight"] = (L + ("mlp", name), t, t)
            if cfg.mlp_bias:
                m[p + f"mlp.{name}_proj.bias"] = (L + ("mlp", f"{name}_bias"), _ident, _ident)
    return m


def _variable(model: Decoder, path: tuple[Any, ...]) -> nnx.Variable:
    obj: Any = model
    for p in path:
        obj = obj[p] if isinstance(p, int) else getattr(obj, p)
    return obj


def read_hf_config(path: str | os.PathLike) -> dict[str, Any]:
    """The `config.json` dict of a Hugging Face model directory (one-line error if there is none)."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"model directory {path} does not exist")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{path} has no config.json; expected a Hugging Face model directory "
                                "(config.json + model.safetensors)")
    return json.loads(cfg_file.read_text())


def _safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [path / f for f in sorted(set(weight_map.values()))]
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    raise FileNotFoundError(f"{path} has no model.safetensors or model.safetensors.index.json; "
                            "convert the checkpoint to safetensors (transformers: save_pretrained(...))")


def load_hf(path: str | os.PathLike, *, dtype: str = "float32", param_dtype: str | None = None,
            value_head: bool | None = None, mesh: jax.sharding.Mesh | None = None) -> Decoder:
    """Load a Llama / Qwen2 checkpoint from a local Hugging Face directory.

    Args:
      path: directory with `config.json` and `model.safetensors` or a sharded `model.safetensors.index.json`.
      dtype: compute dtype (`float32`, `bfloat16`).
      param_dtype: parameter dtype (defaults to `dtype`).
      value_head: add a scalar value head (loaded from `score.weight` when present, else zero-initialized).
        Default: present iff the checkpoint has `score.weight`.
      mesh: shard parameters over this mesh by their logical axes (`rrc_jax.sharding`); None = default device.
    """
    path = Path(path)
    cfg = DecoderConfig.from_hf(read_hf_config(path), dtype=dtype, param_dtype=param_dtype or dtype)
    files = _safetensors_files(path)
    if value_head is None:
        value_head = any("score.weight" in _keys(f) for f in files)
    cfg = cfg.replace(value_head=value_head)
    with sharding.model_context(mesh):
        model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    tensors = _tensor_map(cfg)
    loaded: set[str] = set()
    for file in files:
        with safe_open(file, framework="numpy") as f:
            for name in f.keys():
                if name not in tensors:
                    continue  # e.g. rotary inv_freq buffers, or lm_head.weight of a tied checkpoint
                target, to_ours, _ = tensors[name]
                var = _variable(model, target)
                w = to_ours(f.get_tensor(name))
                if w.shape != var.value.shape:
                    raise ValueError(f"{file}: tensor {name} has shape {w.shape} after conversion, "
                                     f"expected {var.value.shape} from config.json")
                w = w.astype(cfg.params_dtype)
                var.value = (jax.device_put(w, sharding.logical_to_sharding(var.sharding_names, mesh))
                             if mesh is not None else jax.device_put(w))
                loaded.add(name)
    missing = [n for n in tensors if n not in loaded]
    if missing == ["score.weight"]:  # a fresh value head on a causal-LM checkpoint
        var = _variable(model, tensors["score.weight"][0])
        var.value = np.zeros(var.value.shape, cfg.params_dtype)
        if mesh is not None:
            var.value = jax.device_put(var.value, sharding.logical_to_sharding(var.sharding_names, mesh))
    elif missing:
        where = files[0] if len(files) == 1 else f"{path} (sharded checkpoint)"
        raise ValueError(f"{where}: missing tensor {missing[0]}" +
                         (f" and {len(missing) - 1} more" if len(missing) > 1 else "") +
                         "; the checkpoint does not match its config.json")
    return model


def _keys(file: Path) -> list[str]:
    with safe_open(file, framework="numpy") as f:
        return list(f.keys())


def _host_array(x: jax.Array) -> np.ndarray:
    if not x.is_fully_addressable:
        from jax.experimental import multihost_utils
        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(jax.device_get(x))


def save_hf(model: Decoder, path: str | os.PathLike, *, dtype: str | None = None, tokenizer: Any = None,
            max_shard_bytes: int = 5 * 2**30) -> None:
    """Write `config.json` and safetensors (sharded with an index above `max_shard_bytes`) to `path`.

    Every process must call it (parameters sharded across hosts are gathered); process 0 writes.
    `dtype` casts the saved tensors (default: the parameter dtype). A `tokenizer` is saved alongside.
    """
    path = Path(path)
    cfg = model.cfg
    out_dtype = np.dtype(jax.numpy.dtype(dtype)) if dtype else cfg.params_dtype
    writer = jax.process_index() == 0
    if writer:
        path.mkdir(parents=True, exist_ok=True)
        hf = cfg.to_hf()
        hf["dtype"] = str(np.dtype(out_dtype))
        (path / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
        if tokenizer is not None:
            tokenizer.save_pretrained(str(path))
    shards = list(_shards(model, out_dtype, max_shard_bytes))
    if not writer:
        return
    if len(shards) == 1:
        save_file(shards[0], str(path / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(path / name), metadata={"format": "pt"})
        for k, v in shard.items():
            weight_map[k] = name
            total += v.nbytes
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _shards(model: Decoder, out_dtype, max_bytes: int) -> Iterator[dict[str, np.ndarray]]:
    shard: dict[str, np.ndarray] = {}
    size = 0
    for name, (target, _, to_hf) in _tensor_map(model.cfg).items():
        w = np.ascontiguousarray(to_hf(_host_array(_variable(model, target).value)).astype(out_dtype))
        if shard and size + w.nbytes > max_bytes:
            yield shard
            shard, size = {}, 0
        shard[name] = w
        size += w.nbytes
    yield shard


# ----------------------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------------------

def load_tokenizer(path: str | os.PathLike):
    """`AutoTokenizer` from a local directory (never downloads)."""
    from transformers import AutoTokenizer

    path = Path(path)
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise FileNotFoundError(f"{path} has no tokenizer (tokenizer.json / tokenizer_config.json); save one with "
                                "tokenizer.save_pretrained(dir)")
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def format_prompt(tokenizer, text: str, system: str | None = None) -> str:
    """The text the model sees for a user prompt.

    With a chat template: `[system,] user` messages rendered with `add_generation_prompt=True`.
    Without one (base models, the toy world): the fallback is `text` itself, unchanged (a `system` string, if
    given, is prepended followed by a blank line).
    """
    if getattr(tokenizer, "chat_template", None):
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"{system}\n\n{text}" if system else text


def prompt_ids(tokenizer, text: str, system: str | None = None) -> list[int]:
    """Token ids of `format_prompt(...)`: special tokens come from the chat template when there is one, else from
    the tokenizer's own `add_special_tokens` (e.g. Llama's BOS)."""
    templated = bool(getattr(tokenizer, "chat_template", None))
    return tokenizer(format_prompt(tokenizer, text, system), add_special_tokens=not templated)["input_ids"]
