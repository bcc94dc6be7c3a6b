"""Llama 3.x (`model_type` llama): optional biases on the attention projections (`attention_bias`) and on the MLP
(`mlp_bias`), the `llama3` RoPE frequency scaling (read by the shared `DecoderConfig.from_hf`)."""

from __future__ import annotations

from typing import Any

from rrc_jax.models.families.base import Family

_LLAMA3 = dict(vocab_size=128256, rms_norm_eps=1e-5, rope_theta=500000.0, rope_type="llama3",
               rope_scaling=(("factor", 8.0), ("high_freq_factor", 4.0), ("low_freq_factor", 1.0),
                             ("original_max_position_embeddings", 8192.0)),
               max_position_embeddings=131072, bos_token_id=128000, eos_token_ids=(128001, 128008, 128009))
_LLAMA32_ROPE = (("factor", 32.0), ("high_freq_factor", 4.0), ("low_freq_factor", 1.0),
                 ("original_max_position_embeddings", 8192.0))
_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32}


class Llama(Family):
    model_type = "llama"
    causal_lm = "LlamaForCausalLM"
    sequence_classifier = "LlamaForSequenceClassification"
    presets = {  # DecoderConfig fields from the public config.json of each model
        "llama3-8b": dict(_LLAMA3, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                          num_kv_heads=8, head_dim=128),  # Llama-3.1-8B
        "llama3-70b": dict(_LLAMA3, hidden_size=8192, intermediate_size=28672, num_layers=80, num_heads=64,
                           num_kv_heads=8, head_dim=128),  # Llama-3.1-70B
        "llama3.2-1b": dict(_LLAMA3, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32,
                            num_kv_heads=8, head_dim=64, tie_word_embeddings=True, rope_scaling=_LLAMA32_ROPE),
        "llama3.2-3b": dict(_LLAMA3, hidden_size=3072, intermediate_size=8192, num_layers=28, num_heads=24,
                            num_kv_heads=8, head_dim=128, tie_word_embeddings=True, rope_scaling=_LLAMA32_ROPE),
        # SmolLM2-135M-Instruct, the real model (`rrc_jax.models.real_model`)
        "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                             num_kv_heads=3, head_dim=64, rms_norm_eps=9.999999747378752e-06, rope_theta=100000.0,
                             max_position_embeddings=8192, tie_word_embeddings=True, bos_token_id=1,
                             eos_token_ids=(2,), pad_token_id=2),
    }
    examples = {
        "llama3_untied": dict(tie_word_embeddings=False, rope_scaling=_LLAMA3_ROPE, rope_theta=500000.0),
        "llama3_tied": dict(tie_word_embeddings=True, rope_scaling=_LLAMA3_ROPE, rope_theta=500000.0),
    }

    def decoder_fields(self, hf: dict[str, Any]) -> dict[str, Any]:
        bias = bool(hf.get("attention_bias", False))
        return dict(tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)), qkv_bias=bias, o_bias=bias,
                    mlp_bias=bool(hf.get("mlp_bias", False)))

    def hf_fields(self, cfg) -> dict[str, Any]:
        return dict(attention_bias=cfg.qkv_bias, mlp_bias=cfg.mlp_bias)
