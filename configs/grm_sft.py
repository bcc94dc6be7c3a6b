"""Reward-model training on the toy world's preference pairs: a generative judge by SFT on rationale + verdict (Eq.
2), A/B order random.

    python -m rrc_jax.train_rm --config=configs/grm_sft.py [--config.workdir=DIR --config.train.steps=N ...]
"""

from rrc_jax.config import rm_config


def get_config():
    return rm_config("grm")
