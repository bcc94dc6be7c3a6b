"""IRPO (seed 002): a pointwise judge trained by GRPO. Every preference becomes two pointwise questions (its chosen
and its rejected response, asked in the same step); each score is rewarded against the other group's scores
(`reward.irpo.rule`, median by default) plus the format reward, and advantages stay within each group.

    python -m rrc_jax.train --config=irpo.py --config.models.policy=JUDGE_DIR --config.data.path=hs3.jsonl \
        --config.data.format=helpsteer3

IRPO's Table 6 settings: batch 96 (48 preferences x 2 questions), mini-batch 96, 4 rollouts per question,
learning rate 5e-6, KL coefficient 1e-3; its prompt (Appendix A, `irpo_pointwise`). The judge must already write
the template's `<critique>` and `<score>` blocks; the toy world has no pointwise judge yet, so this recipe needs a
checkpoint.
"""

from rrc_jax.config import base_config


def get_config():
    c = base_config("irpo")
    c.data.format = "helpsteer3"
    c.reward.judge.template = "irpo_pointwise"
    c.rl.prompts_per_step, c.rl.minibatch_size = 96, 96 * 4  # IRPO: batch 96 questions, 4 rollouts each
    c.rl.group_size = 4
    c.rl.learning_rate = 5e-6
    c.rl.beta = 1e-3
    c.rl.max_new_tokens = 1024
    c.eval.judge_votes = 0             # no GRM is asked: eval/oracle_quality is the held-out pair accuracy
    return c
