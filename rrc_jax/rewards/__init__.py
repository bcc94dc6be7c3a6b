"""Reward construction for GRPO with generative reward models.

* ``win_counts``: SCR (Eq. 15-17, Algorithm 1) and AGR (Eq. 22, Algorithm 2) majority-vote win counting on device,
  plus per-group diagnostics.
* ``kemeny``: CARA, greedy and exact Kemeny aggregation on host (Eq. 19-21), and Eq. 21's order rewards.
* ``prc``: probability-based rewards (Eq. 5) and the saturation statistic of Table 6.
* ``drm``: the Bradley-Terry loss for discriminative reward models (Eq. 1).
* ``irpo``: intergroup rewards for pointwise judges (IRPO Eq. 5-6, Section 3.2) and the format reward.
"""

from rrc_jax.rewards.drm import bradley_terry_loss
from rrc_jax.rewards.irpo import auc_rewards, format_reward, preference_strength, rule_rewards
from rrc_jax.rewards.kemeny import cara_order, cara_rewards, kemeny_disagreement, kemeny_exact, order_rewards
from rrc_jax.rewards.prc import prc_rewards, prc_saturation
from rrc_jax.rewards.win_counts import agr_diagnostics, agr_rewards, scr_diagnostics, scr_rewards

__all__ = [
    "agr_diagnostics",
    "agr_rewards",
    "auc_rewards",
    "bradley_terry_loss",
    "cara_order",
    "cara_rewards",
    "format_reward",
    "kemeny_disagreement",
    "kemeny_exact",
    "order_rewards",
    "prc_rewards",
    "prc_saturation",
    "preference_strength",
    "rule_rewards",
    "scr_diagnostics",
    "scr_rewards",
]
