"""GRPO with DRM rewards on the toy world (override models.* / data.* for real checkpoints and data).

Discriminative reward model (baseline, Eq. 1): reward = the Bradley-Terry value head's score.

    python -m rrc_jax.train --config=configs/drm.py [--config.workdir=DIR --config.steps=N ...]
"""

from rrc_jax.config import base_config


def get_config():
    return base_config("drm")
