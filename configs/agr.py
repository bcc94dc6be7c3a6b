"""GRPO with AGR rewards on the toy world (override models.* / data.* for real checkpoints and data).

Anchor-Guided Ranking (Algorithm 2): each response is judged against n anchors from the reference policy; reward =
anchors beaten (Eq. 22).

    python -m rrc_jax.train --config=configs/agr.py [--config.workdir=DIR --config.steps=N ...]
"""

from rrc_jax.config import base_config


def get_config():
    return base_config("agr")
