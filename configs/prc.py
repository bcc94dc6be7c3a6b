"""GRPO with PRC rewards on the toy world (override models.* / data.* for real checkpoints and data).

Probability-based reward construction (baseline, Eq. 5): reward = P(candidate preferred) against the reference
policy's greedy response.

    python -m rrc_jax.train --config=configs/prc.py [--config.workdir=DIR --config.steps=N ...]
"""

from rrc_jax.config import base_config


def get_config():
    return base_config("prc")
