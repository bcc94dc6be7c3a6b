"""GRPO with SCR rewards on the toy world (override models.* / data.* for real checkpoints and data).

Self-Competitive Ranking (Algorithm 1): all pairs of a group are judged; reward = win count (Eq. 16), or the
position in the Kemeny order with --config.reward.scr.cara=True (Eq. 21).

    python -m rrc_jax.train --config=configs/scr.py [--config.workdir=DIR --config.steps=N ...]
"""

from rrc_jax.config import base_config


def get_config():
    return base_config("scr")
