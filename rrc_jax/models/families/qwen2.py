"""Qwen2 / Qwen2.5 (`model_type` qwen2): biases on q, k and v (none on o or the MLP), tied embeddings by default,
and with `use_sliding_window` a sliding window on the layers from `max_window_layers` on (`windows`)."""

from __future__ import annotations

from typing import Any

from rrc_jax.models.families.base import Family

_QWEN25 = dict(rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=32768, qkv_bias=True,
               eos_token_ids=(151643,))


def windows(hf: dict[str, Any]) -> dict[str, Any]:
    """`sliding_window` and `layer_types` of a Qwen2 / Qwen3 `config.json`: with `use_sliding_window`, the layers
    from `max_window_layers` on slide (transformers' rule) unless `layer_types` lists them; nothing without it."""
    window = hf.get("sliding_window", 4096) if hf.get("use_sliding_window") else None
    first = hf.get("max_window_layers", 28)
    types = hf.get("layer_types") or ["sliding_attention" if i >= first else "full_attention"
                                      for i in range(hf["num_hidden_layers"])]
    if window is None or "sliding_attention" not in types:
        return {}
    return dict(sliding_window=window, layer_types=tuple(types))


def window_fields(cfg) -> dict[str, Any]:
    """`config.json`'s window keys of a Qwen2 / Qwen3 `DecoderConfig` (`windows` reads them back)."""
    if cfg.sliding_window is None:
        return dict(use_sliding_window=False)
    return dict(use_sliding_window=True, sliding_window=cfg.sliding_window, layer_types=list(cfg.layer_types))


class Qwen2(Family):
    model_type = "qwen2"
    causal_lm = "Qwen2ForCausalLM"
    sequence_classifier = "Qwen2ForSequenceClassification"
    presets = {
        "qwen2.5-7b": dict(_QWEN25, vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28,
                           num_heads=28, num_kv_heads=4, head_dim=128, tie_word_embeddings=False),
        "qwen2.5-1.5b": dict(_QWEN25, vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28,
                             num_heads=12, num_kv_heads=2, head_dim=128, tie_word_embeddings=True),
    }
    examples = {"qwen2_tied": dict(tie_word_embeddings=True, rope_theta=1000000.0)}

    def decoder_fields(self, hf: dict[str, Any]) -> dict[str, Any]:
        return dict(tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)), qkv_bias=True, **windows(hf))

    def hf_fields(self, cfg) -> dict[str, Any]:
        return window_fields(cfg)
