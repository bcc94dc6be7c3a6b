"""Flax NNX decoder models (Llama 3.x, Qwen2 / 2.5) and Hugging Face checkpoint I/O."""

from rrc_jax.models.decoder import Decoder, DecoderConfig, KVCache, init_cache
from rrc_jax.models.hf_io import (format_prompt, load_hf, load_tokenizer, prompt_ids, render_conversation, save_hf,
                                  stop_tokens)

__all__ = ["Decoder", "DecoderConfig", "KVCache", "init_cache", "load_hf", "save_hf", "load_tokenizer",
           "format_prompt", "prompt_ids", "render_conversation", "stop_tokens"]
