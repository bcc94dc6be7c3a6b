"""Qwen2 / Qwen2.5 (`model_type` qwen2): biases on q, k and v (none on o or the MLP), tied embeddings by default;
sliding-window attention (`use_sliding_window`) is not implemented."""

from __future__ import annotations

from typing import Any

from rrc_jax.models.families.base import Family

_QWEN25 = dict(rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=32768, qkv_bias=True,
               eos_token_ids=(151643,))


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
        if hf.get("use_sliding_window"):
            raise ValueError(f"{self.model_type} sliding-window attention (use_sliding_window=true) is not supported")
        return dict(tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)), qkv_bias=True)
