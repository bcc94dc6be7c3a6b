"""rrc-jax: Ranking-based Reward Construction for GRPO with generative reward models, in JAX / Flax NNX."""

__version__ = "0.1.0"
