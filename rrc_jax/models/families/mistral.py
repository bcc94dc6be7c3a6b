"""Mistral (`model_type` mistral): Llama's block with no biases, an explicit `head_dim` where the config gives one
(Mistral-Nemo's 128 is not hidden / heads), and an optional sliding window over every layer (`sliding_window`:
4096 in v0.1, null from v0.2 on; transformers' default 4096 when `config.json` leaves it out)."""

from __future__ import annotations

from typing import Any

from rrc_jax.models.families.base import Family


class Mistral(Family):
    model_type = "mistral"
    causal_lm = "MistralForCausalLM"
    sequence_classifier = "MistralForSequenceClassification"
    presets = {  # mistralai/Mistral-7B-v0.3/config.json
        "mistral-7b": dict(vocab_size=32768, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                           num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=1000000.0,
                           max_position_embeddings=32768, bos_token_id=1, eos_token_ids=(2,)),
    }
    examples = {"mistral_window": dict(sliding_window=4, tie_word_embeddings=False)}  # shorter than the test rows

    def decoder_fields(self, hf: dict[str, Any]) -> dict[str, Any]:
        window = hf.get("sliding_window", 4096)
        return dict(tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)), sliding_window=window,
                    layer_types=("sliding_attention",) * hf["num_hidden_layers"] if window else ())

    def hf_fields(self, cfg) -> dict[str, Any]:
        return dict(sliding_window=cfg.sliding_window)
