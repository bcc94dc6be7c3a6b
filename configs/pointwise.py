"""GRPO with a pointwise GRM's scores as rewards: how IRPO uses its judge, e.g. one trained by
`irpo.py`. Each response is scored `reward.judge.votes` times with the pointwise template; reward = the mean score.

    python -m rrc_jax.train --config=configs/pointwise.py --config.models.grm=workdir/irpo/hf_export

The default judge is the toy pointwise judge (`toy:pointwise`, IRPO's starting point) with the toy template; for a
real judge set `reward.judge.template=irpo_pointwise` (IRPO Appendix A) or a template file of kind 'pointwise'.
"""

from rrc_jax.config import base_config


def get_config():
    c = base_config("pointwise")
    c.models.grm = "toy:pointwise"
    c.reward.judge.template = "toy_pointwise"
    c.eval.judge_votes = 0  # the judged win rate asks pairwise questions, which a pointwise judge does not answer
    return c
