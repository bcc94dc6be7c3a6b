"""rrc-jax: Ranking-based Reward Construction for GRPO with generative reward models, in JAX / Flax NNX."""

import logging as _logging

__version__ = "0.1.0"


class _TorchIsNotNeeded(_logging.Filter):
    """Drops transformers' advice that PyTorch was not found, which it logs when imported without torch: this
    project runs every model in JAX and reads checkpoints with safetensors, so a user has nothing to act on (torch is
    the test extra's reference implementation only)."""

    def filter(self, record: _logging.LogRecord) -> bool:
        return not record.getMessage().startswith("PyTorch was not found")


_logging.getLogger("transformers").addFilter(_TorchIsNotNeeded())
