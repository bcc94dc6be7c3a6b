"""Inference: the Sampler protocol the trainer and the judge see, and the JAX engine that implements it.

* ``sampler``: `Sampler` (generate, complete shared prefixes, next-token log-probs), `SamplingParams`,
  `SampleOutput`, `SamplerStats`, `response_texts` (a model's stop tokens: `rrc_jax.models.stop_tokens`).
* ``factory``: `make_sampler` (and `role_sampler`, for a run's roles), which builds every sampler with the engine
  `inference` names for its role (`ENGINES`, `ENGINE_ROLES`).
* ``engine``: `JaxSampler`, the protocol on a `rrc_jax.models.Decoder` (prefix reuse, chunking).
* ``sampling``: the engine's jit-compiled kernels (prefill, extend, decode, generate) over a `KVCache`.
* ``openai_engine``: `OpenAISampler`, the protocol over an OpenAI-compatible `/v1/completions` server (a judge on
  another host; failures are counted abstentions): `inference.engine=openai` puts the judge there.
* ``server``: the other side: a Sampler served as an OpenAI-compatible endpoint (Starlette; `python -m
  rrc_jax.serve`), concurrent requests batched into the engine.
"""

from rrc_jax.inference.engine import JaxSampler
from rrc_jax.inference.factory import ENGINES, make_sampler, role_sampler
from rrc_jax.inference.sampler import SampleOutput, Sampler, SamplerStats, SamplingParams, response_texts

__all__ = ["ENGINES", "JaxSampler", "make_sampler", "role_sampler", "SampleOutput", "Sampler", "SamplerStats",
           "SamplingParams", "response_texts"]
