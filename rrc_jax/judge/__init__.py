"""The generative reward model as a judge: templates, verdict parsing, the judge and the matches it plays.

* ``templates``: judging templates as data (`rrc_pairwise_cot`, `rrc_pairwise_direct`, `rmr1_cor`, `irpo_pointwise`,
  `toy_pairwise_cot`, `toy_pairwise_direct`, or a `.json` / `.yaml` file), rendered into a shared prefix and a
  per-question suffix.
* ``verdicts``: `parse_verdict` ('A' | 'B' | None) and `parse_score` (float | None); they never raise.
* ``judge``: `Judge` turns (prompts, responses, anchors) into questions for a Sampler and its answers into the
  vote tensors of `rrc_jax.rewards`.
* ``matches``: SCR's adaptive orderings (`merge_sort`, `knockout`) and the rounds of the tournament rewards
  (`play`), with the judge as comparator.
"""

from rrc_jax.judge.judge import Judge, JudgeConfig, JudgeMetrics, PairVotes, Vote
from rrc_jax.judge.templates import TEMPLATES, JudgeTemplate, direct_template, get_template, load_template, render_parts
from rrc_jax.judge.matches import Ordering, knockout, merge_sort
from rrc_jax.judge.verdicts import parse_score, parse_verdict

__all__ = ["Judge", "JudgeConfig", "JudgeMetrics", "JudgeTemplate", "PairVotes", "TEMPLATES", "Ordering", "Vote",
           "direct_template", "get_template", "knockout", "load_template", "merge_sort", "parse_score",
           "parse_verdict", "render_parts"]
