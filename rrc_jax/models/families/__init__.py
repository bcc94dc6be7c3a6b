"""Model families: what each decoder family does differently from the shared decoder (`rrc_jax.models.decoder`),
one module each, and the registry that maps a `config.json` `model_type` to its family.

A family says how its `config.json` translates to and from `DecoderConfig` (`decoder_fields`, `hf_fields`), which
per-layer tensors it has beyond the shared ones (`layer_tensors`), the `architectures` names of its causal LM and
sequence classifier, its size presets for the planner, and tiny transformers configs that exercise its features
(`examples`: the test suite checks parity with transformers on each). Adding a family is one module here plus one
line in `FAMILIES` (docs/models.md, with Qwen3 as the example).
"""

from __future__ import annotations

from typing import Any

from rrc_jax.models.families.base import Family
from rrc_jax.models.families.gemma2 import Gemma2
from rrc_jax.models.families.gemma3 import Gemma3
from rrc_jax.models.families.llama import Llama
from rrc_jax.models.families.mistral import Mistral
from rrc_jax.models.families.qwen2 import Qwen2
from rrc_jax.models.families.qwen3 import Qwen3

FAMILIES: dict[str, Family] = {f.model_type: f for f in (Llama(), Qwen2(), Qwen3(), Mistral(), Gemma2(), Gemma3())}


def family(model_type: str | None) -> Family:
    """The family of `model_type`; a one-line `ValueError` listing the supported ones for another."""
    if model_type not in FAMILIES:
        raise ValueError(f"unknown model_type {model_type!r}; supported: {', '.join(FAMILIES)}")
    return FAMILIES[model_type]


def presets() -> dict[str, dict[str, Any]]:
    """Every family's size presets by name (`rrc_jax.plan.model_config`), each with its `model_type`."""
    return {name: dict(fields, model_type=f.model_type) for f in FAMILIES.values() for name, fields in f.presets.items()}
