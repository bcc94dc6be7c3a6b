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
        """Per-layer parameters beyond the shared ones, each one HF tensor in the same layout: the parameter's path
        in a decoder layer (`Block`) -> the tensor's name after `model.layers.N.`."""
        return {}
