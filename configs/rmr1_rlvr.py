"""RM-R1's second stage, RLVR (Eq. 7-8): GRPO on the judge itself. Every preference becomes a judge question (A/B
order random) and a judgment earns +1 when its verdict is correct, -1 otherwise; the KL is to the judge before RL.

    python -m rrc_jax.train_rm --config=rmr1_rlvr.py                # the toy GRM on the toy task's pairs
    python -m rrc_jax.train_rm --config=rmr1_rlvr.py:paper --config.models.policy=DISTILLED_JUDGE \
        --config.data.path=hs3.jsonl --config.data.format=helpsteer3

RM-R1 (Appendix E) for every scale-free setting: KL coefficient 1e-3, clip ratio 0.2, 7 responses per question,
temperature 1, top-p 1. `:paper` adds its sizes (1024 questions a step in minibatches of 128, learning rate 1e-6 for
a 7B instruct model, 4096 prompt and 8192 response tokens) and the chain-of-rubrics template; the default keeps
the toy world's sizes. The export (`workdir/hf_export`) is a GRM for `train --config.models.grm=...`.
"""

from rrc_jax.config import base_config


def get_config(arg: str = ""):
    c = base_config("rlvr")
    c.models.policy = "toy:grm"        # the judge being trained (the distilled one, stage 1)
    c.data.format = "pairs"            # with data.path='toy': the toy task's preference pairs
    c.rl.beta = 1e-3                   # RM-R1: KL coefficient 1e-3 to the judge before RL
    c.rl.eps_low = c.rl.eps_high = 0.2  # RM-R1: clip ratio 0.2
    c.rl.group_size = 7                # RM-R1: 7 candidate judgments per question
    c.rl.temperature, c.rl.top_p = 1.0, 1.0
    c.rl.minibatch_size = 56           # 16 questions x 7 judgments in two updates
    c.rl.learning_rate = 3e-5          # toy scale: at the trainer's 2e-4 RLVR lowered the toy GRM's held-out
                                       # accuracy (0.957 -> 0.910 in 40 steps); at 3e-5 it holds (0.953)
    c.rl.max_new_tokens = c.reward.judge.max_new_tokens  # a toy judgment
    c.eval.judge_votes = 0             # no GRM is asked: eval/oracle_quality is the held-out verdict accuracy
    if arg == "paper":
        c.models.policy = ""           # the distilled judge: a Hugging Face directory, required
        c.reward.judge.template = "rmr1_cor"
        c.rl.prompts_per_step, c.rl.minibatch_size = 1024, 128
        c.rl.learning_rate = 1e-6
        c.data.max_prompt_tokens, c.rl.max_new_tokens = 4096, 8192
        c.models.dtype = "bfloat16"
    elif arg:
        raise ValueError(f"rmr1_rlvr.py:{arg}: the only variant is ':paper'")
    return c
