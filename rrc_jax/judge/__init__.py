"""Generative reward model judge: templates, verdict parsing and the batched judging engine.

* ``prompts``: named judging templates (`rrc_pairwise_cot`, `rrc_pairwise_direct`, `rmr1_cor`, `irpo_pointwise`,
  `toy_pairwise_cot`, `toy_pairwise_direct`) and their prefix / suffix rendering.
* ``verdicts``: `parse_verdict` ('A' | 'B' | None) and `parse_score` (float | None); they never raise.
* ``engine``: `Judge` turns (prompts, responses, anchors) into the vote tensors of `rrc_jax.rewards`.
"""

from rrc_jax.judge.engine import Judge, JudgeConfig, JudgeMetrics, PairVotes, Tournament, Vote, order_rewards
from rrc_jax.judge.prompts import TEMPLATES, JudgeTemplate, get_template, render_parts
from rrc_jax.judge.verdicts import parse_score, parse_verdict

__all__ = ["Judge", "JudgeConfig", "JudgeMetrics", "JudgeTemplate", "PairVotes", "TEMPLATES", "Tournament", "Vote",
           "get_template", "order_rewards", "parse_score", "parse_verdict", "render_parts"]
