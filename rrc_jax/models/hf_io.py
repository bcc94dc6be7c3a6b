"""Hugging Face checkpoints <-> `Decoder`, without torch.

`load_hf(dir)` reads `config.json` and `model.safetensors` (or the shards listed in
`model.safetensors.index.json`) one tensor at a time: each tensor is memory-mapped, converted to our layout and
dtype, placed on its device(s) and released before the next, so host RAM never holds a second copy of the model.
`save_hf(model, dir)` writes `config.json` and safetensors shards that transformers loads as the family's causal
LM (`LlamaForCausalLM`, `Qwen3ForCausalLM`, ...; with `generation_config.json`) or, for a model with a value head (a
DRM), as its sequence classifier (`LlamaForSequenceClassification`, ...); such sequence-classification checkpoints
made by transformers (a `score` head, no `lm_head`) load back as DRMs. The families are `rrc_jax.models.families`. Stop tokens come from
`generation_config.json`'s `eos_token_id` when there is one (as transformers' `generate`), else from `config.json`.

Tokenizers come from the same directory through `AutoTokenizer`; `prompt_ids` renders a user prompt with the
tokenizer's chat template when it has one and uses the raw text otherwise (the documented fallback).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from etils import epath
from flax import nnx
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save as safetensors_bytes

from rrc_jax import sharding
from rrc_jax.errors import ConfigError
from rrc_jax.models.decoder import Decoder
from rrc_jax.models.decoder_config import DecoderConfig, is_sequence_classifier, token_ids
from rrc_jax.models import lora as lora_
from rrc_jax.models.families import family
from rrc_jax.models.lora import LoraConfig

Combine = Callable[[list[np.ndarray]], np.ndarray]  # HF tensors -> our parameter
Split = Callable[[np.ndarray], list[np.ndarray]]  # our parameter -> HF tensors


def _one(f: Callable[[np.ndarray], np.ndarray]) -> tuple[Combine, Split]:
    """A parameter that is one HF tensor; `f` (the identity or a transpose) converts it either way."""
    return (lambda ws: f(ws[0])), (lambda w: [f(w)])


_IDENT = _one(lambda w: w)
_T = _one(lambda w: w.T)


Target = tuple[tuple[str, ...], int | None]  # a parameter's path in `Decoder`, and the layer within it (stacked)


def _tensor_map(cfg: DecoderConfig) -> dict[Target, tuple[tuple[str, ...], Combine, Split]]:
    """Each `Decoder` parameter, or layer n of a stacked one (`(path, n)`; n is None for an unstacked one) -> (the
    HF tensors it is made of, HF -> ours, ours -> HF).

    Ours fuses some HF tensors: `attn.qkv [E, K, G + 2, D]` is q_proj, k_proj and v_proj regrouped by kv head
    (query head h belongs to kv head h // G, as in transformers' `repeat_kv`); `mlp.gate_up [E, I, 2]` stacks
    gate_proj and up_proj. A family's own per-layer tensors (`Family.layer_tensors`) map one to one.
    """
    e, h, k, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    g = h // k

    def qkv(weight: bool) -> tuple[Combine, Split]:
        """HF q, k, v weights `[n*D, E]` (biases `[n*D]`) <-> ours `[E, K, G + 2, D]` (bias `[K, G + 2, D]`)."""
        lead = (e,) if weight else ()
        t = (lambda w: w.T) if weight else (lambda w: w)
        combine = lambda ws: np.concatenate([t(w).reshape(*lead, k, -1, d) for w in ws], axis=-2)
        split = lambda w: [t(x.reshape(*lead, -1)) for x in (w[..., :g, :], w[..., g, :], w[..., g + 1, :])]
        return combine, split

    def gate_up(weight: bool) -> tuple[Combine, Split]:
        """HF gate, up weights `[I, E]` (biases `[I]`) <-> ours `[E, I, 2]` (bias `[I, 2]`)."""
        t = (lambda w: w.T) if weight else (lambda w: w)
        return (lambda ws: np.stack([t(w) for w in ws], axis=-1)), (lambda w: [t(w[..., 0]), t(w[..., 1])])

    m: dict[Target, tuple[tuple[str, ...], Combine, Split]] = {
        (("embed",), None): (("model.embed_tokens.weight",), *_IDENT),
        (("final_norm", "scale"), None): (("model.norm.weight",), *_IDENT),
    }
    if cfg.lm_head and not cfg.tie_word_embeddings:
        m[("lm_head",), None] = (("lm_head.weight",), *_T)
    if cfg.value_head:
        m[("value_head", "kernel"), None] = (("score.weight",), lambda ws: ws[0][0], lambda w: [w[None]])
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}."
        m[("layers", "attn_norm", "scale"), n] = ((p + "input_layernorm.weight",), *_IDENT)
        m[("layers", "mlp_norm", "scale"), n] = ((p + "post_attention_layernorm.weight",), *_IDENT)
        fused = lambda module, projs, what: tuple(f"{p}{module}.{x}_proj.{what}" for x in projs)
        m[("layers", "attn", "qkv"), n] = (fused("self_attn", "qkv", "weight"), *qkv(True))
        if cfg.qkv_bias:
            m[("layers", "attn", "qkv_bias"), n] = (fused("self_attn", "qkv", "bias"), *qkv(False))
        m[("layers", "attn", "o"), n] = ((p + "self_attn.o_proj.weight",), lambda ws: ws[0].T.reshape(h, d, e),
                                         lambda w: [w.reshape(h * d, e).T])
        if cfg.o_bias:
            m[("layers", "attn", "o_bias"), n] = ((p + "self_attn.o_proj.bias",), *_IDENT)
        m[("layers", "mlp", "gate_up"), n] = (fused("mlp", ("gate", "up"), "weight"), *gate_up(True))
        m[("layers", "mlp", "down"), n] = ((p + "mlp.down_proj.weight",), *_T)
        if cfg.mlp_bias:
            m[("layers", "mlp", "gate_up_bias"), n] = (fused("mlp", ("gate", "up"), "bias"), *gate_up(False))
            m[("layers", "mlp", "down_bias"), n] = ((p + "mlp.down_proj.bias",), *_IDENT)
        for path, name in family(cfg.model_type).layer_tensors(cfg).items():
            m[("layers", *path), n] = ((p + name,), *_IDENT)
    return m


def _variable(model: Decoder, path: tuple[str, ...]) -> nnx.Variable:
    obj: Any = model
    for p in path:
        obj = getattr(obj, p)
    return obj


@functools.partial(jax.jit, donate_argnums=0)
def _set_layer(stacked: jax.Array, value: jax.Array, n: jax.Array) -> jax.Array:
    """`stacked [L, ...]` with layer `n` set to `value [...]`, in place (donated)."""
    return stacked.at[n].set(value.astype(stacked.dtype))


def read_hf_config(path: str | os.PathLike) -> dict[str, Any]:
    """The `config.json` dict of a Hugging Face model directory (one-line error if there is none)."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"model directory {path} does not exist")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{path} has no config.json; expected a Hugging Face model directory "
                                "(config.json + model.safetensors)")
    try:
        hf = json.loads(cfg_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{cfg_file}: not valid JSON ({e}); the download or copy may be incomplete") from None
    if not isinstance(hf, dict):
        raise ConfigError(f"{cfg_file}: not a JSON object")
    check_numbers(hf, cfg_file)
    return hf


# The numeric fields of a decoder's config.json the families read: sizes (integers >= 1; null where the family has a
# default) and other numbers (null: none).
SIZE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "max_position_embeddings", "sliding_window", "max_window_layers",
               "sliding_window_pattern")
NUMBER_FIELDS = ("rms_norm_eps", "rope_theta", "rope_local_base_freq", "query_pre_attn_scalar",
                 "attn_logit_softcapping", "final_logit_softcapping")


def check_numbers(hf: dict[str, Any], where: Path) -> None:
    """A one-line `ConfigError` naming the first of `SIZE_FIELDS` that is not an integer >= 1, or of
    `NUMBER_FIELDS` that is not a number, in the `config.json` dict `hf` (read from `where`)."""
    for name in SIZE_FIELDS + NUMBER_FIELDS:
        value = hf.get(name)
        if value is None:
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if name in SIZE_FIELDS and not (number and value == int(value) and value >= 1):
            raise ConfigError(f"{where}: {name} is {value!r}, not an integer >= 1; fix the file (a Hugging Face "
                              "config.json gives sizes as JSON numbers)")
        if not number:
            raise ConfigError(f"{where}: {name} is {value!r}, not a finite number; fix the file")


@contextlib.contextmanager
def _safetensors(file: Path):
    """`safe_open(file)`, a one-line `ConfigError` naming the file when it is not a complete safetensors file."""
    try:
        with safe_open(file, framework="numpy") as f:
            yield f
    except SafetensorError as e:
        raise ConfigError(f"{file}: not a readable safetensors file ({e}); the download or copy may be "
                          "incomplete") from None


def _num_labels(hf: dict[str, Any]) -> int:
    """The number of outputs of a sequence classifier's `score` head, from its `config.json` dict."""
    return len(hf["id2label"]) if hf.get("id2label") else int(hf.get("num_labels", 2))


def _generation_stop_tokens(path: Path) -> tuple[int, ...] | None:
    """The stop tokens of `path/generation_config.json` (its `eos_token_id`: one id or a list), None without one."""
    file = path / "generation_config.json"
    if not file.is_file():
        return None
    try:
        return token_ids(json.loads(file.read_text()).get("eos_token_id"))
    except (ValueError, TypeError, AttributeError) as e:
        raise ConfigError(f"{file}: not a JSON object whose eos_token_id is a token id or a list of ids ({e}); "
                          "fix or delete the file") from e


def _tensor_files(path: Path) -> dict[str, Path]:
    """HF tensor name -> the safetensors file holding it (`model.safetensors` or the shards of its index)."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return {name: path / f for name, f in json.loads(index.read_text())["weight_map"].items()}
    single = path / "model.safetensors"
    if single.is_file():
        with _safetensors(single) as f:
            return dict.fromkeys(f.keys(), single)
    raise FileNotFoundError(f"{path} has no model.safetensors or model.safetensors.index.json; "
                            "convert the checkpoint to safetensors (transformers: save_pretrained(...))")


def checkpoint_identity(path: str | os.PathLike, sample_bytes: int = 1 << 20) -> dict[str, str]:
    """Short fingerprints of the Hugging Face checkpoint in `path`, the same wherever it is copied: `config`, a
    SHA-256 of its `config.json`, and `weights`, one over each safetensors file (in name order) of its size, its
    header (every tensor's name, dtype, shape and offsets) and its first and last `sample_bytes` bytes ("" without
    weight files: a served judge's directory holds its config and tokenizer only). Cheap on any checkpoint (the
    weights are not read whole); two checkpoints pass for one only when their configs and headers agree and their
    weights differ only away from each file's ends."""
    path = Path(path)
    config = hashlib.sha256(json.dumps(read_hf_config(path), sort_keys=True).encode()).hexdigest()[:16]
    files = sorted(path.glob("*.safetensors"))
    weights = hashlib.sha256()
    for file in files:
        size = file.stat().st_size
        with file.open("rb") as f:
            head = f.read(8)
            header = f.read(int.from_bytes(head, "little")) if len(head) == 8 else b""
            first = f.read(sample_bytes)
            f.seek(max(size - sample_bytes, f.tell()))
            last = f.read(sample_bytes)
        for part in (file.name.encode(), str(size).encode(), header, first, last):
            weights.update(len(part).to_bytes(8, "little") + part)
    return {"config": config, "weights": weights.hexdigest()[:16] if files else ""}


def decoder_config(path: str | os.PathLike, *, dtype: str = "float32", param_dtype: str | None = None,
                   pad_token_id: int | None = None) -> DecoderConfig:
    """The `DecoderConfig` `load_hf` gives the checkpoint in `path` (its stop tokens from `generation_config.json`
    when present), without reading a weight: what an engine that holds the weights elsewhere needs of the model."""
    path = Path(path)
    hf = read_hf_config(path)
    if is_sequence_classifier(hf) and _num_labels(hf) != 1:
        raise ConfigError(f"{path / 'config.json'}: a sequence classifier with {_num_labels(hf)} labels; a reward "
                          "model scores with one (num_labels=1, score.weight of shape [1, hidden_size])")
    try:
        cfg = DecoderConfig.from_hf(hf, dtype=dtype, param_dtype=param_dtype or dtype)
    except KeyError as e:
        raise ConfigError(f"{path / 'config.json'}: no {e.args[0]}; a decoder's config.json has vocab_size, "
                          "hidden_size, intermediate_size, num_hidden_layers and num_attention_heads") from None
    stop = _generation_stop_tokens(path)
    return cfg.replace(eos_token_ids=cfg.eos_token_ids if stop is None else stop,
                       pad_token_id=cfg.pad_token_id if cfg.pad_token_id is not None else pad_token_id)


def load_hf(path: str | os.PathLike, *, dtype: str = "float32", param_dtype: str | None = None,
            value_head: bool | None = None, pad_token_id: int | None = None,
            layout: sharding.Layout = sharding.Layout(), lora: LoraConfig | None = None, kv_dtype: str = "") -> Decoder:
    """Load a checkpoint of a supported family (`rrc_jax.models.families`; causal LM or sequence classifier) from a
    local Hugging Face directory.

    Args:
      path: directory with `config.json` and `model.safetensors` or a sharded `model.safetensors.index.json`;
        its `generation_config.json`, when present, gives the stop tokens (`cfg.eos_token_ids`).
      dtype: compute dtype (`float32`, `bfloat16`).
      param_dtype: parameter dtype (defaults to `dtype`).
      value_head: add a scalar value head (loaded from `score.weight` when present, else zero-initialized).
        Default: present iff the checkpoint has `score.weight` (a `*ForSequenceClassification` with one label).
      pad_token_id: the pad id when `config.json` names none. A value head scores the last token that is not
        padding (`Decoder.values`), and `save_hf` writes this id, so a DRM trained from a checkpoint without one
        scores the same before and after export.
      layout: where the parameters go (`rrc_jax.sharding.Layout`: a mesh and the rules of the training or the
        inference layout; the default, no mesh, is the default device). Each tensor is placed as it is read.
      lora: adapters to add (`rrc_jax.models.lora`; rank 0: none), initialized as PEFT does (B zero: the model
        computes as the checkpoint); with its `weight_qtype` the projections are quantized one layer at a time as
        they are read, and stored so (the `param_dtype` is then their scales').
      kv_dtype: what its KV caches store keys and values in (`DecoderConfig.kv_dtype`; "": the compute dtype).
    """
    path = Path(path)
    cfg = decoder_config(path, dtype=dtype, param_dtype=param_dtype, pad_token_id=pad_token_id)
    files = _tensor_files(path)
    if value_head is None:
        value_head = "score.weight" in files
    if not (value_head or cfg.lm_head):
        raise ConfigError(f"{path}: a sequence-classification checkpoint (a score head, no lm_head) loads only as a "
                          "reward model (value_head=True, the DRM); give a causal LM checkpoint here")
    cfg = cfg.replace(value_head=value_head, lora=lora if lora is not None and lora.applies else None,
                      kv_dtype=kv_dtype)
    with sharding.model_context(None):  # abstract, the logical names kept as metadata; placed by `layout` below
        model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    tensors = _tensor_map(cfg)
    missing = [n for names, _, _ in tensors.values() for n in names if n not in files]
    if missing and missing != ["score.weight"]:  # (a lone missing score.weight: a fresh value head, zeros)
        where = next(iter(files.values())) if len(set(files.values())) == 1 else f"{path} (sharded checkpoint)"
        raise ConfigError(f"{where}: missing tensor {missing[0]}" +
                         (f" and {len(missing) - 1} more" if len(missing) > 1 else "") +
                         "; the checkpoint does not match its config.json")
    with contextlib.ExitStack() as stack:
        opened: dict[Path, Any] = {}

        def read(name: str) -> np.ndarray:  # memory-mapped; released once converted and placed
            if files[name] not in opened:
                opened[files[name]] = stack.enter_context(_safetensors(files[name]))
            try:
                return opened[files[name]].get_tensor(name)
            except SafetensorError as e:
                raise ConfigError(f"{files[name]}: tensor {name} does not read ({e}); the file may be truncated or "
                                  "corrupted") from None

        place = lambda w, names: (jax.device_put(w, layout.sharding(names, w.shape)) if layout.mesh is not None
                                  else jax.device_put(w))
        for (path, layer), (names, combine, _) in tensors.items():
            var = _variable(model, path)
            shape = var.shape if layer is None else var.shape[1:]
            if missing and names == ("score.weight",):  # a fresh value head on a causal-LM checkpoint
                w = np.zeros(shape)
            else:
                w = _convert(names, [read(n) for n in names], combine, shape, files[names[0]])
            if np.issubdtype(w.dtype, np.inexact) and not np.isfinite(w).all():
                raise ConfigError(f"{files[names[0]]}: tensor {', '.join(names)} holds NaN or inf values; the "
                                  "checkpoint is broken (a diverged run, or a corrupted file)")
            w = w.astype(cfg.params_dtype)
            if layer is None:
                var.set_value(place(w, var.out_sharding))
                continue
            values = [(var, place(w, var.out_sharding[1:]))]
            if lora_.is_quantized(model) and path[-1] in lora_.QUANTIZED_WEIGHTS:  # QLoRA: stored as qwix quantizes
                scale = _variable(model, (*path[:-1], path[-1] + "_scale"))
                values = list(zip((var, scale), _quantize(values[0][1], lora_.QUANTIZED_WEIGHTS[path[-1]], cfg.lora,
                                                          cfg.params_dtype)))
            for v, x in values:
                if layer == 0:  # the stacked parameter, placed whole, then filled one layer at a time
                    v.set_value(_zeros(v.shape, v.dtype, v.out_sharding, layout))
                v.set_value(_set_layer(v[...], x, layer))
    if cfg.lora is not None and cfg.lora.enabled:
        lora_.init_adapters(model, layout)
    return model


_quantize = jax.jit(lora_.quantize, static_argnums=(1, 2, 3))


def _zeros(shape: tuple[int, ...], dtype, names: tuple, layout: sharding.Layout) -> jax.Array:
    """Zeros of `shape` and `dtype` with logical axes `names`, made where `layout` places them."""
    sharded = layout.sharding(names, shape) if layout.mesh is not None else None
    return jax.jit(lambda: jax.numpy.zeros(shape, dtype), out_shardings=sharded)()


def _convert(names: tuple[str, ...], sources: list[np.ndarray], combine: Combine, shape: tuple[int, ...],
             file: Path) -> np.ndarray:
    """`combine(sources)`, or a one-line error naming the tensors when they do not make a parameter of `shape`."""
    try:
        w = combine(sources)
    except ValueError:  # e.g. a q_proj whose rows are not heads x head_dim
        w = None
    if w is None or w.shape != shape:
        got = ", ".join(f"{n} {tuple(x.shape)}" for n, x in zip(names, sources))
        raise ConfigError(f"{file}: tensor {got} does not convert to the shape {shape} that config.json implies")
    return w


def save_hf(model: Decoder, path: str | os.PathLike, *, dtype: str | None = None, tokenizer: Any = None,
            max_shard_bytes: int = 5 * 2**30) -> None:
    """Write `config.json` and safetensors (sharded with an index above `max_shard_bytes`) to `path`.

    A causal LM also gets `generation_config.json` (BOS, pad, and as `eos_token_id` the stop tokens its samplers
    use: the model's EOS ids and the tokenizer's, `stop_tokens`). A model with a value head (a
    DRM) is written as a sequence classifier: `score.weight [1, E]`, no LM head, and a `pad_token_id` (the model's,
    else the tokenizer's), which transformers needs to find the scored token.

    A model with LoRA adapters is written merged (`rrc_jax.models.lora.merge`: the adapters folded into the base,
    dequantized; `rrc_jax.models.peft_io.save_adapter` writes the adapters alone, as PEFT does).

    Every process must call it (parameters sharded across hosts are gathered); process 0 writes. `path` may be a
    `gs://` URI (etils `epath`). `dtype` casts the saved tensors (default: the parameter dtype). A `tokenizer` is
    saved alongside (without the load-time options transformers leaves in `tokenizer_config.json`).
    """
    path = epath.Path(path)
    if model.cfg.lora is not None:  # the adapters folded into the base: a plain checkpoint (PEFT's: peft_io)
        model = lora_.merge(model)
    cfg = model.cfg
    tokenizer_pad = getattr(tokenizer, "pad_token_id", None)
    if cfg.pad_token_id is None and tokenizer_pad is not None:
        cfg = cfg.replace(pad_token_id=int(tokenizer_pad))
    if cfg.value_head and cfg.pad_token_id is None:
        raise ValueError(f"save_hf({path}): the reward model has no pad id, which a sequence-classification "
                         "checkpoint needs; load it with load_hf(..., pad_token_id=ID) or pass a tokenizer that "
                         "has a pad token")
    out_dtype = np.dtype(jax.numpy.dtype(dtype)) if dtype else cfg.params_dtype
    writer = jax.process_index() == 0
    if writer:
        path.mkdir(parents=True, exist_ok=True)
        hf = cfg.to_hf()
        hf["dtype"] = str(np.dtype(out_dtype))
        (path / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
        if not cfg.value_head:
            (path / "generation_config.json").write_text(json.dumps(_generation_config(cfg, tokenizer), indent=2)
                                                         + "\n")
        if tokenizer is not None:
            _save_tokenizer(tokenizer, path)
    shards = list(_shards(model, cfg.replace(lm_head=cfg.lm_head and not cfg.value_head), out_dtype,
                          max_shard_bytes))
    if not writer:
        return
    if len(shards) == 1:
        (path / "model.safetensors").write_bytes(safetensors_bytes(shards[0], metadata={"format": "pt"}))
        return
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        (path / name).write_bytes(safetensors_bytes(shard, metadata={"format": "pt"}))
        for k, v in shard.items():
            weight_map[k] = name
            total += v.nbytes
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def stop_tokens(eos_token_ids: Sequence[int], tokenizer=None) -> tuple[int, ...]:
    """The ids that end a continuation: the model's EOS ids and the tokenizer's EOS id (chat models often end a
    turn with a token that only one of the two names)."""
    ids = {int(t) for t in eos_token_ids}
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    return tuple(sorted(ids))


def _generation_config(cfg: DecoderConfig, tokenizer: Any) -> dict[str, Any]:
    """The `generation_config.json` dict of a causal LM: BOS, pad and its stop tokens as `eos_token_id`."""
    stop = list(stop_tokens(cfg.eos_token_ids, tokenizer))
    return {"bos_token_id": cfg.bos_token_id, "eos_token_id": stop[0] if len(stop) == 1 else (stop or None),
            "pad_token_id": cfg.pad_token_id}


LOAD_TIME_TOKENIZER_KEYS = ("local_files_only", "is_local")  # how a tokenizer was loaded, not what it is


def _save_tokenizer(tokenizer, path: epath.Path) -> None:
    """`tokenizer.save_pretrained` into `path` (through a local directory, so `path` may be a URI), with the
    load-time options (`LOAD_TIME_TOKENIZER_KEYS`) that transformers copies into `tokenizer_config.json` removed."""
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        config = Path(tmp) / "tokenizer_config.json"
        if config.is_file():
            kept = {k: v for k, v in json.loads(config.read_text()).items() if k not in LOAD_TIME_TOKENIZER_KEYS}
            config.write_text(json.dumps(kept, indent=2, ensure_ascii=False) + "\n")
        for f in sorted(Path(tmp).rglob("*")):
            if f.is_file():
                target = path / str(f.relative_to(tmp))
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(f.read_bytes())


def _shards(model: Decoder, cfg: DecoderConfig, out_dtype, max_bytes: int) -> Iterator[dict[str, np.ndarray]]:
    """Safetensors shards (name -> array) of at most `max_bytes` each (a larger tensor alone) of the tensors that
    `cfg` (the model's, as written) maps."""
    shard: dict[str, np.ndarray] = {}
    size = 0
    for (path, layer), (names, _, split) in _tensor_map(cfg).items():
        value = _variable(model, path)[...]
        for name, w in zip(names, split(sharding.to_host(value if layer is None else value[layer]))):
            w = np.ascontiguousarray(w.astype(out_dtype))
            if shard and size + w.nbytes > max_bytes:
                yield shard
                shard, size = {}, 0
            shard[name] = w
            size += w.nbytes
    yield shard


# ----------------------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------------------

# The class names under which a `tokenizer_config.json` asks for the generic `tokenizers` backend (what
# `AutoTokenizer` itself resolves them to).
GENERIC_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")


def _tokenizer_class(path: Path):
    """The class `AutoTokenizer` would pick for `path`: the generic backend, imported directly, when the config names
    it (as the toy world's and `make_char_tokenizer`'s do), which spares a process importing torch through
    `transformers`' auto classes (2 seconds of every command's start-up); else `AutoTokenizer`."""
    config = path / "tokenizer_config.json"
    name = json.loads(config.read_text()).get("tokenizer_class") if config.is_file() else None
    if name in GENERIC_TOKENIZERS and (path / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast  # heavy (1 s): only when a tokenizer loads

        return PreTrainedTokenizerFast
    from transformers import AutoTokenizer  # heavy (1 s): only when a tokenizer loads

    return AutoTokenizer


def load_tokenizer(path: str | os.PathLike):
    """`AutoTokenizer` from a local directory (never downloads). In a model directory (one with `config.json`) a
    tokenizer whose largest id (its vocabulary's or an added token's; ids need not be contiguous) is beyond the
    model's `vocab_size` is a one-line `ConfigError`: those ids would index past the embedding (XLA clamps them
    silently), and every judgment or rollout would be noise."""
    path = Path(path)
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise FileNotFoundError(f"{path} has no tokenizer (tokenizer.json / tokenizer_config.json); save one with "
                                "tokenizer.save_pretrained(dir)")
    tokenizer = _tokenizer_class(path).from_pretrained(str(path), local_files_only=True)
    vocab = read_hf_config(path).get("vocab_size") if (path / "config.json").is_file() else None
    largest = max(tokenizer.get_vocab().values(), default=-1)
    if isinstance(vocab, int) and largest >= vocab:
        raise ConfigError(f"{path}: the tokenizer's largest id is {largest} ({len(tokenizer)} ids) but the model's "
                          f"vocabulary (config.json vocab_size) holds {vocab}; ids >= {vocab} have no embedding: pair "
                          "the model with its own tokenizer")
    return tokenizer


def render_conversation(turns: list[tuple[str, str]]) -> str:
    """A conversation `[(role, content)]` as one text: a single turn is its content; several are
    `"{Role}: {content}"` each, separated by blank lines."""
    if len(turns) == 1:
        return turns[0][1]
    return "\n\n".join(f"{role.capitalize()}: {content}" for role, content in turns)


def format_prompt(tokenizer, text: str | list[dict], system: str | None = None) -> str:
    """The text the model sees for a user prompt, or for a whole conversation (`text` a list of `{role, content}`
    messages ending with a user turn: system message and earlier turns included).

    With a chat template: `[system,] user` messages (or the conversation) rendered with
    `add_generation_prompt=True`. Without one (base models, the toy world): the fallback is `text` itself,
    unchanged (a `system` string, if given, is prepended followed by a blank line; a conversation reads as
    `render_conversation` writes it).
    """
    if isinstance(text, list):
        messages = ([{"role": "system", "content": system}] if system else []) + list(text)
    else:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if isinstance(text, list):
        return render_conversation([(m["role"], m["content"]) for m in messages])
    return f"{system}\n\n{text}" if system else text


def prompt_ids(tokenizer, text: str | list[dict], system: str | None = None) -> list[int]:
    """Token ids of `format_prompt(...)`: special tokens come from the chat template when there is one, else from
    the tokenizer's own `add_special_tokens` (e.g. Llama's BOS)."""
    templated = bool(getattr(tokenizer, "chat_template", None))
    return tokenizer(format_prompt(tokenizer, text, system), add_special_tokens=not templated)["input_ids"]
