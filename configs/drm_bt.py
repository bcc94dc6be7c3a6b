"""Reward-model training on the toy world's preference pairs: a discriminative reward model with a scalar value
head, Bradley-Terry (Eq. 1).

    python -m rrc_jax.train_rm --config=configs/drm_bt.py [--config.workdir=DIR --config.train.steps=N ...]
"""

from rrc_jax.config import rm_config


def get_config():
    return rm_config("drm")
