"""The base of a model family (`rrc_jax.models.families`)."""

from __future__ import annotations

from typing import Any, ClassVar


class Family:
    """The base of every family: the fields all of them read the same way are `DecoderConfig.from_hf`'s."""

    model_type: ClassVar[str]
    causal_lm: ClassVar[str]  # `architectures` of a causal LM checkpoint
    sequence_classifier: ClassVar[str]  # and of a sequence classifier (a `score` head: a DRM)
    presets: ClassVar[dict[str, dict[str, Any]]] = {}  # planner size presets: DecoderConfig fields
    examples: ClassVar[dict[str, dict[str, Any]]] = {}  # tiny transformers config kwargs for the parity tests

    def decoder_fields(self, hf: dict[str, Any]) -> dict[str, Any]:
        """The family's own `DecoderConfig` fields from a `config.json` dict (a `ValueError` for a feature it does
        not implement)."""
        return {}

    def hf_fields(self, cfg) -> dict[str, Any]:
        """The family's own `config.json` keys of `cfg` (a `DecoderConfig`)."""
        return {}

    def layer_tensors(self, cfg) -> dict[tuple[str, ...], str]:
        """Per-layer parameters beyond the shared ones, or named otherwise than Llama names them, each one HF tensor
        in the same layout: the parameter's path in a decoder layer (`Block`) -> the tensor's name after
        `model.layers.N.` (an entry for a shared path replaces the shared name: Gemma's MLP pre-norm)."""
        return {}


def rope_fields(params: dict[str, Any], theta: float) -> dict[str, Any]:
    """`DecoderConfig`'s RoPE fields (`rope_theta`, `rope_type`, `rope_scaling`) from a `config.json` RoPE dict
    (transformers 5.x `rope_parameters`, or 4.x `rope_scaling` beside a top-level `rope_theta`, given as `theta`)."""
    rope = dict(params)
    rope_theta = float(rope.pop("rope_theta", theta))
    rope_type = rope.pop("rope_type", rope.pop("type", "default")) or "default"
    scaling = tuple(sorted((k, float(v)) for k, v in rope.items() if isinstance(v, (int, float))))
    return dict(rope_theta=rope_theta, rope_type=rope_type, rope_scaling=scaling)
