"""Gemma 2 (`model_type` gemma2): embeddings scaled by `sqrt(hidden)`, `(1 + w)` RMSNorm (weights 0-centred),
norms before and after both attention and MLP ("sandwich"), GeGLU with tanh GELU, attention logits scaled by
`query_pre_attn_scalar^-1/2` and soft-capped (`attn_logit_softcapping`), the LM head's logits soft-capped too
(`final_logit_softcapping`), and sliding-window attention on alternating layers (`layer_types`, from layer 0;
`sliding_window`). Embeddings are tied.

Gemma 3 (`rrc_jax.models.families.gemma3`) shares all of it but the soft-capping defaults.
"""

from __future__ import annotations

from typing import Any

from rrc_jax.models.families.base import Family


def alternating(num_layers: int, period: int) -> tuple[str, ...]:
    """`layer_types` of a local:global pattern: every `period`-th layer full, the others sliding (transformers'
    default for Gemma 2, period 2, and Gemma 3, period 6)."""
    return tuple("full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(num_layers))


_GEMMA2 = dict(vocab_size=256000, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=8192,
               head_dim=256, query_pre_attn_scalar=256, sliding_window=4096, attn_logit_softcapping=50.0,
               final_logit_softcapping=30.0, tie_word_embeddings=True, bos_token_id=2, eos_token_ids=(1, 107),
               pad_token_id=0)


class Gemma2(Family):
    model_type = "gemma2"
    causal_lm = "Gemma2ForCausalLM"
    sequence_classifier = "Gemma2ForSequenceClassification"
    period = 2  # every period-th layer is global (`alternating`)
    attn_softcap, final_softcap = 50.0, 30.0  # transformers' defaults when config.json leaves them out
    presets = {  # google/gemma-2-*/config.json
        "gemma2-2b": dict(_GEMMA2, hidden_size=2304, intermediate_size=9216, num_layers=26, num_heads=8,
                          num_kv_heads=4),
        "gemma2-9b": dict(_GEMMA2, hidden_size=3584, intermediate_size=14336, num_layers=42, num_heads=16,
                          num_kv_heads=8),
        "gemma2-27b": dict(_GEMMA2, hidden_size=4608, intermediate_size=36864, num_layers=46, num_heads=32,
                           num_kv_heads=16, head_dim=128, query_pre_attn_scalar=144),
    }
    # a window of 4 (shorter than the test sequences), head_dim 16 (not hidden / heads) and a query_pre_attn_scalar
    # that is not head_dim; soft caps small enough to bend the tiny model's logits
    examples = {"gemma2_tied": dict(head_dim=16, query_pre_attn_scalar=24, sliding_window=4,
                                    attn_logit_softcapping=0.5, final_logit_softcapping=2.0, initializer_range=0.2)}

    def decoder_fields(self, hf: dict[str, Any]) -> dict[str, Any]:
        bias = bool(hf.get("attention_bias", False))
        layers = hf["num_hidden_layers"]
        return dict(tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)), qkv_bias=bias, o_bias=bias,
                    hidden_act=hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh",
                    norm_offset=1.0, sandwich_norms=True, embed_scale=True,
                    query_pre_attn_scalar=hf.get("query_pre_attn_scalar", 256),
                    attn_logit_softcapping=hf.get("attn_logit_softcapping", self.attn_softcap),
                    final_logit_softcapping=hf.get("final_logit_softcapping", self.final_softcap),
                    sliding_window=hf.get("sliding_window", 4096),
                    layer_types=tuple(hf.get("layer_types") or self.default_layer_types(hf, layers)))

    def default_layer_types(self, hf: dict[str, Any], layers: int) -> tuple[str, ...]:
        return alternating(layers, self.period)

    def hf_fields(self, cfg) -> dict[str, Any]:
        return dict(attention_bias=cfg.qkv_bias, hidden_activation=cfg.hidden_act,
                    query_pre_attn_scalar=cfg.query_pre_attn_scalar,
                    attn_logit_softcapping=cfg.attn_logit_softcapping,
                    final_logit_softcapping=cfg.final_logit_softcapping, sliding_window=cfg.sliding_window,
                    layer_types=list(cfg.layer_types))

    def layer_tensors(self, cfg) -> dict[tuple[str, ...], str]:
        # Gemma's post_attention_layernorm follows attention; the MLP's pre-norm is pre_feedforward_layernorm
        return {("mlp_norm", "scale"): "pre_feedforward_layernorm.weight",
                ("post_attn_norm", "scale"): "post_attention_layernorm.weight",
                ("post_mlp_norm", "scale"): "post_feedforward_layernorm.weight"}
