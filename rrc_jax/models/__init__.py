"""Flax NNX decoder models (the families of `rrc_jax.models.families`) and Hugging Face checkpoint I/O: the
architecture (`decoder_config`), RoPE (`rope`), the KV cache (`kv_cache`), attention kernels (`attention`), a layer
(`block`), the decoder (`decoder`), LoRA (`lora`), padding into batches (`batches`), checkpoints (`hf_io`)."""

from rrc_jax.models.decoder import Decoder
from rrc_jax.models.decoder_config import DecoderConfig
from rrc_jax.models.kv_cache import KVCache, init_cache
from rrc_jax.models.hf_io import (format_prompt, load_hf, load_tokenizer, prompt_ids, render_conversation, save_hf,
                                  stop_tokens)

__all__ = ["Decoder", "DecoderConfig", "KVCache", "init_cache", "load_hf", "save_hf", "load_tokenizer",
           "format_prompt", "prompt_ids", "render_conversation", "stop_tokens"]
