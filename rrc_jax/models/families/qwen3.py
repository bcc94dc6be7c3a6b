"""Qwen3 (dense; `model_type` qwen3): RMSNorm of each query and key head before RoPE (`q_norm`, `k_norm`, one
`[head_dim]` weight each), an explicit `head_dim` (128 at every size, not hidden / heads), no q/k/v bias unless
`attention_bias` (then on o too), Qwen2's sliding-window rule (`use_sliding_window`, `max_window_layers`).

The example of docs/models.md ("Adding a family"): the config fields it reads, the two tensors it adds per layer,
its presets and its test configs are all there is.
"""

from __future__ import annotations

from typing import Any

from rrc_jax.models.families.base import Family
from rrc_jax.models.families.qwen2 import window_fields, windows

_QWEN3 = dict(vocab_size=151936, rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=40960,
              head_dim=128, qk_norm=True, bos_token_id=151643, eos_token_ids=(151645,))


class Qwen3(Family):
    model_type = "qwen3"
    causal_lm = "Qwen3ForCausalLM"
    sequence_classifier = "Qwen3ForSequenceClassification"
    presets = {  # Qwen/Qwen3-*/config.json
        "qwen3-8b": dict(_QWEN3, hidden_size=4096, intermediate_size=12288, num_layers=36, num_heads=32,
                         num_kv_heads=8, tie_word_embeddings=False),
        "qwen3-1.7b": dict(_QWEN3, hidden_size=2048, intermediate_size=6144, num_layers=28, num_heads=16,
                           num_kv_heads=8, tie_word_embeddings=True),
        "qwen3-0.6b": dict(_QWEN3, hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16,
                           num_kv_heads=8, tie_word_embeddings=True),
    }
    # head_dim 16 with hidden 32 and 4 heads: a head_dim that hidden / heads (8) would get wrong
    examples = {"qwen3_tied": dict(tie_word_embeddings=True, head_dim=16, rope_theta=1000000.0),
                "qwen3_untied": dict(tie_word_embeddings=False, head_dim=16, attention_bias=True)}

    def decoder_fields(self, hf: dict[str, Any]) -> dict[str, Any]:
        bias = bool(hf.get("attention_bias", False))
        return dict(tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)), qkv_bias=bias, o_bias=bias,
                    qk_norm=True, **windows(hf))

    def hf_fields(self, cfg) -> dict[str, Any]:
        return dict(attention_bias=cfg.qkv_bias, **window_fields(cfg))

    def layer_tensors(self, cfg) -> dict[tuple[str, ...], str]:
        return {("attn", "q_norm", "scale"): "self_attn.q_norm.weight",
                ("attn", "k_norm", "scale"): "self_attn.k_norm.weight"}
