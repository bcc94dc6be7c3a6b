"""Inference: the Sampler protocol the trainer and the judge see, and the JAX engine that implements it.

* ``sampler``: `Sampler` (generate, complete shared prefixes, next-token log-probs), `SamplingParams`,
  `SampleOutput`, `SamplerStats`, `stop_tokens`, `response_texts`.
* ``engine``: `JaxSampler`, the protocol on a `rrc_jax.models.Decoder` (prefix reuse, chunking).
* ``sampling``: the engine's jit-compiled kernels (prefill, extend, decode, generate) over a `KVCache`.
"""

from rrc_jax.inference.engine import JaxSampler
from rrc_jax.inference.sampler import (SampleOutput, Sampler, SamplerStats, SamplingParams, response_texts,
                                       stop_tokens)

__all__ = ["JaxSampler", "SampleOutput", "Sampler", "SamplerStats", "SamplingParams", "response_texts",
           "stop_tokens"]
