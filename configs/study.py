"""The reproduction study: every reward construction on the toy world, several seeds each, one report.

    python -m rrc_jax.study --config=study.py          # every construction x 5 seeds x 40 steps
    python -m rrc_jax.study --config=study.py --quick  # 2 seeds x 5 steps: the smoke version
    python -m rrc_jax.study --config=study.py --config.shard=1/2   # this process's half of the runs

Runs already finished (a summary in `out/runs/`) are not repeated; an interrupted run resumes from its checkpoint.
`constructions` picks a comma-separated subset of `rrc_jax.study.runs.RUNS` ('all': every one);
`overrides` ("FIELD=VALUE,FIELD=VALUE") set trainer config fields of every run, after the construction's own.
"""

import ml_collections


def get_config(arg: str = ""):
    c = ml_collections.ConfigDict()
    c.out = "results/study"          # summaries (runs/), study.json, report.md and the plots
    c.workdir = "workdir/study"      # one trainer workdir per run: <construction>/seed<k>
    c.constructions = "all"
    c.seeds = 5
    c.steps = 40
    c.eval_every = 5
    c.eval_prompts = 256
    c.shard = "0/1"                  # INDEX/COUNT: this process runs the runs i with i % COUNT == INDEX
    c.report = True                  # write the report from every summary present once this shard is done
    c.audit_pairs, c.audit_groups = 512, 64  # the toy judge's audit (rrc_jax.data.toy.audit), once per study
    c.overrides = ""                 # "FIELD=VALUE,...": trainer config fields for every run, e.g. toy.cache_dir=DIR
    c.compilation_cache = True       # keep compiled programs in workdir/xla_cache for the next runs (rrc_jax.study)
    if arg == "quick":
        c = quick(c)
    elif arg:
        raise ValueError(f"study.py:{arg}: the only variant is ':quick'")
    return c


def quick(c):
    """The smoke version of a study config (`:quick`, or `--quick`): 2 seeds of 5 steps on 64 held-out prompts and
    256 training prompts (fewer AGR anchors to make), into its own folders."""
    c.out, c.workdir = f"{c.out}_quick", f"{c.workdir}_quick"
    c.seeds, c.steps, c.eval_every, c.eval_prompts = 2, 5, 5, 64
    c.overrides = ",".join(x for x in ("toy.train_prompts=256", c.overrides) if x)
    return c
