"""RM-R1's first stage, distillation: SFT of the judge on chain-of-rubrics reasoning traces (the `rationale` of a
pairs file, or HelpSteer3's annotator reasoning) before RLVR (`rmr1_rlvr.py`).

    python -m rrc_jax.train_rm --config=rmr1_distill.py             # the toy world's GRM (toy judgments)
    python -m rrc_jax.train_rm --config=rmr1_distill.py:paper --config.model.init=INSTRUCT_MODEL \
        --config.data.path=traces.jsonl --config.data.format=pairs

`:paper` takes RM-R1's settings (Appendix E: batch 128, learning rate 5e-6 for a 7B model; one epoch, which is
`train.steps` = rows / 128) and its chain-of-rubrics template `rmr1_cor`.
"""

from rrc_jax.config import rm_config


def get_config(arg: str = ""):
    c = rm_config("grm")
    c.workdir = "workdir/rmr1_distill"
    if arg == "paper":
        c.judge.template = "rmr1_cor"
        c.train.batch_size, c.train.learning_rate = 128, 5e-6
        c.data.max_tokens = 4096 + 8192
        c.model.dtype = "bfloat16"
    elif arg:
        raise ValueError(f"rmr1_distill.py:{arg}: the only variant is ':paper'")
    return c
