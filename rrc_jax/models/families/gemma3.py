"""Gemma 3, text (`model_type` gemma3_text: `Gemma3ForCausalLM`): Gemma 2's embedding scale, `(1 + w)` norms,
sandwich norms and GeGLU (`rrc_jax.models.families.gemma2`), no soft-capping, RMSNorm of each query and key head
(`q_norm`, `k_norm`), and a 5:1 local:global layer pattern (`layer_types`, or `sliding_window_pattern` 6) whose
sliding layers use their own RoPE base (default RoPE) while the global layers keep `rope_theta` and its scaling.

Both `config.json` layouts load: transformers 5's `rope_parameters` keyed by layer type, and 4.x's `rope_theta`,
`rope_local_base_freq` and `rope_scaling`. Multimodal `gemma3` checkpoints (`Gemma3ForConditionalGeneration`,
which nest the text model under `text_config`) are not loaded; their text model exported as `gemma3_text` is.
"""

from __future__ import annotations

from typing import Any

from rrc_jax.models.families.base import rope_fields
from rrc_jax.models.families.gemma2 import Gemma2, alternating

_GEMMA3 = dict(vocab_size=262208, rms_norm_eps=1e-6, rope_theta=1000000.0, rope_type="linear",
               rope_scaling=(("factor", 8.0),), local_rope_theta=10000.0, max_position_embeddings=131072,
               head_dim=256, query_pre_attn_scalar=256, sliding_window=1024, qk_norm=True, tie_word_embeddings=True,
               bos_token_id=2, eos_token_ids=(1, 106), pad_token_id=0)


def _preset(num_layers: int, **fields) -> dict[str, Any]:
    return dict(_GEMMA3, num_layers=num_layers, layer_types=alternating(num_layers, 6), **fields)


class Gemma3(Gemma2):
    model_type = "gemma3_text"
    causal_lm = "Gemma3ForCausalLM"
    sequence_classifier = "Gemma3TextForSequenceClassification"
    period = 6
    attn_softcap = final_softcap = None
    presets = {  # google/gemma-3-*-it/config.json (the text_config of the multimodal ones)
        "gemma3-1b": _preset(26, vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_heads=4,
                             num_kv_heads=1, sliding_window=512, rope_type="default", rope_scaling=(),
                             max_position_embeddings=32768),
        "gemma3-4b": _preset(34, hidden_size=2560, intermediate_size=10240, num_heads=8, num_kv_heads=4),
        "gemma3-12b": _preset(48, hidden_size=3840, intermediate_size=15360, num_heads=16, num_kv_heads=8),
        "gemma3-27b": _preset(62, hidden_size=5376, intermediate_size=21504, num_heads=32, num_kv_heads=16,
                              head_dim=128, query_pre_attn_scalar=168),
    }
    # a sliding then a global layer (two RoPE bases: the global one linearly scaled), window 4, head_dim 16
    examples = {"gemma3_tied": dict(
        head_dim=16, query_pre_attn_scalar=24, sliding_window=4, initializer_range=0.2,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0}})}

    def decoder_fields(self, hf: dict[str, Any]) -> dict[str, Any]:
        rope = hf.get("rope_parameters") or {}
        if "full_attention" in rope:  # transformers 5: one RoPE dict per layer type
            full, local = rope["full_attention"], rope.get("sliding_attention") or {}
        else:  # 4.x: the global RoPE at the top level, the local base beside it
            full, local = hf.get("rope_scaling") or rope, {"rope_theta": hf.get("rope_local_base_freq", 10000.0)}
        if (local.get("rope_type") or "default") != "default":
            raise ValueError(f"{self.model_type}: sliding layers with RoPE type {local['rope_type']!r}; only the "
                             "default RoPE is implemented for them")
        return dict(super().decoder_fields(hf), qk_norm=True, **rope_fields(full, hf.get("rope_theta", 1000000.0)),
                    local_rope_theta=float(local.get("rope_theta", 10000.0)))

    def default_layer_types(self, hf: dict[str, Any], layers: int) -> tuple[str, ...]:
        return alternating(layers, int(hf.get("sliding_window_pattern", self.period)))

    def hf_fields(self, cfg) -> dict[str, Any]:
        full = {"rope_type": cfg.rope_type, "rope_theta": cfg.rope_theta, **dict(cfg.rope_scaling)}
        local = {"rope_type": "default", "rope_theta": cfg.local_rope_theta}
        return dict(super().hf_fields(cfg), rope_parameters={"full_attention": full, "sliding_attention": local},
                    rope_local_base_freq=cfg.local_rope_theta)

    def layer_tensors(self, cfg) -> dict[tuple[str, ...], str]:
        return {**super().layer_tensors(cfg), ("attn", "q_norm", "scale"): "self_attn.q_norm.weight",
                ("attn", "k_norm", "scale"): "self_attn.k_norm.weight"}
