"""PEFT adapter directories <-> a decoder's LoRA adapters (`rrc_jax.models.lora`), without torch.

`save_adapter(model, dir, base=...)` writes what `peft.PeftModel.from_pretrained(base_model, dir)` loads:
`adapter_config.json` (LoRA, the rank, alpha and target modules) and `adapter_model.safetensors`, one
`lora_A.weight [r, in]` and `lora_B.weight [out, r]` per adapted projection and layer, under PEFT's names
(`base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight`, ...). `load_adapter(model, dir)` reads one back
into a model whose `LoraConfig` has the same rank, alpha and targets (`train --config.init_from=DIR`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import numpy as np
from etils import epath
from flax import nnx
from safetensors.numpy import load_file
from safetensors.numpy import save as safetensors_bytes

from rrc_jax import sharding
from rrc_jax.errors import ConfigError
from rrc_jax.models.lora import LORA_TARGETS

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
MODULES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
           "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}  # a target -> its HF module


def is_adapter_dir(path: str | os.PathLike) -> bool:
    return (Path(path).expanduser() / CONFIG).is_file()


def _adapters(model) -> dict[str, tuple[nnx.Variable, nnx.Variable]]:
    """Each adapted projection of `model` -> its stacked (A `[L, *In, r]`, B `[L, r, *Out]`)."""
    out = {}
    for name in LORA_TARGETS:
        module = model.layers.attn if MODULES[name].startswith("self_attn") else model.layers.mlp
        if hasattr(module, f"{name}_lora_a"):
            out[name] = (getattr(module, f"{name}_lora_a"), getattr(module, f"{name}_lora_b"))
    return out


def _key(n: int, name: str, which: str) -> str:
    return f"base_model.model.model.layers.{n}.{MODULES[name]}.lora_{which}.weight"


def save_adapter(model, path: str | os.PathLike, *, base: str | os.PathLike = "") -> None:
    """Write `model`'s adapters as a PEFT LoRA directory at `path` (`base`: the base model's directory or name,
    recorded as `base_model_name_or_path`). Every process must call it (adapters sharded across hosts are
    gathered); process 0 writes. `path` may be a `gs://` URI."""
    lora = model.cfg.lora
    if lora is None:
        raise ValueError("save_adapter: the model has no LoRA adapters (its cfg.lora is None)")
    tensors = {}
    for name, (a, b) in _adapters(model).items():
        a, b = sharding.to_host(a[...]), sharding.to_host(b[...])
        for n in range(a.shape[0]):
            tensors[_key(n, name, "A")] = np.ascontiguousarray(a[n].reshape(-1, lora.rank).T)  # [r, In]
            tensors[_key(n, name, "B")] = np.ascontiguousarray(b[n].reshape(lora.rank, -1).T)  # [Out, r]
    if jax.process_index() != 0:
        return
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora.rank, "lora_alpha": lora.alpha,
              "lora_dropout": lora.dropout, "target_modules": sorted(MODULES[t].split(".")[1]
                                                                     for t in lora.target_names),
              "bias": "none", "base_model_name_or_path": str(base), "fan_in_fan_out": False, "inference_mode": True,
              "init_lora_weights": True, "use_rslora": False, "use_dora": False, "modules_to_save": None,
              "layers_to_transform": None, "rank_pattern": {}, "alpha_pattern": {}}
    path = epath.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    (path / WEIGHTS).write_bytes(safetensors_bytes(tensors, metadata={"format": "pt"}))


def load_adapter(model, path: str | os.PathLike) -> None:
    """Set `model`'s adapters from the PEFT LoRA directory `path` (a one-line `ConfigError` when its rank, alpha
    or target modules are not the model's `policy.lora`, or a tensor is missing or misshapen)."""
    path = Path(path).expanduser()
    lora = model.cfg.lora
    config = json.loads((path / CONFIG).read_text())
    if config.get("peft_type", "LORA") != "LORA":
        raise ConfigError(f"{path / CONFIG}: peft_type {config.get('peft_type')!r}; only LoRA adapters load")
    targets = sorted(MODULES[t].split(".")[1] for t in lora.target_names)
    theirs = config.get("target_modules")
    theirs = sorted(theirs) if isinstance(theirs, list) else theirs
    for field, mine, value in (("rank", lora.rank, config.get("r")), ("alpha", lora.alpha, config.get("lora_alpha")),
                               ("targets", targets, theirs)):
        if value != mine and not (field == "alpha" and value is not None and float(value) == mine):
            raise ConfigError(f"{path / CONFIG}: the adapter's {field} is {value}, config.policy.lora's {mine}; set "
                              f"config.policy.lora.{field} to the adapter's")
    tensors = load_file(str(path / WEIGHTS))
    tensors = {k.replace(".default.", "."): v for k, v in tensors.items()}  # (saved with an adapter name)
    for name, (a, b) in _adapters(model).items():
        for var, which, shape in ((a, "A", a.shape), (b, "B", b.shape)):
            layers = []
            for n in range(shape[0]):
                key = _key(n, name, which)
                if key not in tensors:
                    raise ConfigError(f"{path / WEIGHTS}: no tensor {key}; the adapter does not match the model")
                w = tensors[key].T  # [In, r] or [r, Out]
                if w.size != int(np.prod(shape[1:])):
                    raise ConfigError(f"{path / WEIGHTS}: {key} has shape {tuple(tensors[key].shape)}, which does "
                                      f"not fit the model's {which} of shape {tuple(shape[1:])}")
                layers.append(w.reshape(shape[1:]))
            value = np.stack(layers).astype(np.float32)
            old = var[...]
            var.set_value(jax.device_put(value, old.sharding))
