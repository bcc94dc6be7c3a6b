"""IRPO ("IRPO: Scaling the Bradley-Terry Model via Reinforcement Learning"): a pointwise judge trained by GRPO.
Every preference becomes two pointwise questions (its chosen and its rejected response, asked in the same step);
each score is rewarded against the other group's scores (`reward.irpo.rule`, median by default) plus the format
reward, and advantages stay within each group.

    python -m rrc_jax.train_rm --config=irpo.py          # the toy pointwise judge on the toy task's pairs
    python -m rrc_jax.train_rm --config=irpo.py:paper --config.models.policy=JUDGE_DIR \
        --config.data.path=hs3.jsonl --config.data.format=helpsteer3 --config.data.min_strength=2

IRPO's settings for every scale-free choice: 4 rollouts per question, KL coefficient 1e-3, the median rule.
`:paper` adds its sizes (Table 6: batch 96 questions = 48 preferences x 2, mini-batch 96, learning rate 5e-6) and
its prompt (Appendix A, `irpo_pointwise`). The default starts from the toy pointwise judge (`toy:pointwise`: SFT
on `toy_pointwise` judgments, built on first use). `eval/oracle_quality` is the held-out pairs' accuracy (the
greedy score of the chosen response above the rejected one's); `reward/score_std` is the within-group spread of
the scores, the collapse signal of IRPO's Figure 3. The export (`workdir/hf_export`) is a pointwise GRM for
`train --config.reward.kind=pointwise --config.models.grm=...`.
"""

from rrc_jax.config import base_config


def get_config(arg: str = ""):
    c = base_config("irpo")
    c.workdir = "workdir/irpo"
    c.models.policy = "toy:pointwise"  # the judge being trained
    c.data.format = "pairs"            # with data.path='toy': the toy task's preference pairs
    c.reward.judge.template = "toy_pointwise"
    c.rl.group_size = 4                # IRPO: 4 rollouts per question
    c.rl.beta = 1e-3                   # IRPO: KL coefficient 1e-3
    c.rl.prompts_per_step = 16         # 8 preferences x 2 questions
    c.rl.minibatch_size = 32           # two updates per step
    c.rl.learning_rate = 3e-5          # toy scale (as RLVR's toy GRM)
    c.rl.max_new_tokens = c.reward.judge.max_new_tokens  # a toy judgment
    c.eval.judge_votes = 0             # no GRM is asked: eval/oracle_quality is the held-out pair accuracy
    if arg == "paper":
        c.models.policy = ""           # the judge to train: a Hugging Face directory, required
        c.data.format = "helpsteer3"
        c.reward.judge.template = "irpo_pointwise"
        c.rl.prompts_per_step, c.rl.minibatch_size = 96, 96 * 4  # Table 6: batch 96 questions, 4 rollouts each
        c.rl.learning_rate = 5e-6
        c.rl.max_new_tokens = 1024
        c.models.dtype = "bfloat16"
    elif arg:
        raise ValueError(f"irpo.py:{arg}: the only variant is ':paper'")
    return c
