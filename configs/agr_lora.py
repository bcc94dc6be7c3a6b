"""GRPO with AGR rewards, the policy trained through LoRA adapters (`rrc_jax.models.lora`), on the toy world.

The same run as `agr.py` with rank-2 adapters on every projection (q, k, v, o, gate, up, down; alpha 4) and the
base frozen: the learner, the optimizer state, the weight sync and the checkpoints hold the adapters only; the KL's
reference and AGR's anchor policy are the base with the initial (zero) adapters, not a second model. LoRA learns
at a larger step than a full fine-tune (here 5x agr.py's). The adapters hold 4.8% of the toy policy's parameters
(its hidden size is 64); a real model takes rank 16-64.

    python -m rrc_jax.train --config=configs/agr_lora.py [--config.policy.lora.weight_qtype=nf4 ...]
"""

from rrc_jax.config import base_config


def get_config():
    c = base_config("agr")
    c.workdir = "workdir/agr_lora"
    c.policy.lora.rank = 2
    c.policy.lora.alpha = 4.0
    c.rl.learning_rate = 1e-3
    return c
