"""Reward-model training: generative judges by SFT on rationale + verdict (Eq. 2), discriminative reward models
by Bradley-Terry (Eq. 1), and judges trained by GRPO (RM-R1's RLVR, IRPO). The command line of every recipe.

    python -m rrc_jax.train_rm --config=grm_sft.py   # GRM SFT (Eq. 2) -> workdir/hf_export
    python -m rrc_jax.train_rm --config=drm_bt.py    # DRM, Bradley-Terry (Eq. 1)
    python -m rrc_jax.train_rm --config=rmr1_rlvr.py # RLVR on the toy GRM (RM-R1 Eq. 8)
    python -m rrc_jax.train_rm --config=irpo.py      # IRPO on the toy pointwise judge
    python -m rrc_jax.train_rm --config=grm_sft.py --config.data.path=hs3.jsonl --config.data.format=helpsteer3 \
        --config.model.init=DIR                       # on a preference dataset, from a Hugging Face checkpoint

With `data.path = "toy"` (default) the pairs are the toy world's: the GRM learns both the toy judge's reasoning
template and its direct-verdict variant as the toy world's GRM does, from the oracle's judgments unless
`toy.miscount` / `toy.position_bias` / `toy.length_bias` set an imperfect annotator (the DRM learns its verdicts);
the result is evaluated on `toy.eval_pairs` pairs of evaluation-split prompts (`workdir/eval.json`). Any other
`data.path` is a preference dataset (`rrc_jax.data.preferences`) and `rrc_jax.rm.recipes` fine-tunes `model.init` on
it. Both keep their run as the GRPO trainer does (`rrc_jax.rm.fit`): every step's metrics in `workdir/metrics.jsonl`
and TensorBoard (W&B with `log.wandb`), the held-out evaluation in the last step's line, a progress bar, checkpoints
every `checkpoint.save_every` steps and at the last; rerunning the same command resumes from the latest checkpoint
(exactly: the same final parameters as an uninterrupted run), and Ctrl-C or SIGTERM saves one and exits.

RLVR and IRPO are GRPO runs whose policy is the judge: their configs are trainer configs (`rrc_jax.config.base_config`,
with `reward.kind` 'rlvr' or 'irpo'), run by `rrc_jax.rl.trainer` exactly as `python -m rrc_jax.train` would.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rrc_jax import cli
from rrc_jax.config import check_finite
from rrc_jax.errors import ConfigError

CONFIG = cli.config_flag("grm_sft.py, drm_bt.py, rmr1_distill.py, rmr1_rlvr.py, irpo.py", "Reward-model recipe")


def run_rm(config) -> Path:
    """Train the configured reward model and export it to `workdir/hf_export` (with its tokenizer)."""
    if "rl" in config:  # a GRPO recipe: the trainer, whose policy is the judge
        from rrc_jax.rl.trainer import run

        cli.join_processes(config)
        return Path(run(config)) / "hf_export"
    import jax
    import numpy as np

    from rrc_jax.data.toy import world
    from rrc_jax.data.toy.task import ALPHABET, Annotator, SortTask, toy_preferences
    from rrc_jax.inference.factory import InferenceConfig
    from rrc_jax.models import save_hf
    from rrc_jax.models.char_tokenizer import make_char_tokenizer
    from rrc_jax.rm.fit import recording
    from rrc_jax.rm.recipes import held_out_metrics
    from rrc_jax.settings import parse
    from rrc_jax.sharding import MeshConfig, model_context

    check_finite(config)
    parse(InferenceConfig, config)
    if config.kind not in ("grm", "drm"):
        raise ConfigError(f"config.kind: {config.kind!r}; use 'grm' (SFT on rationale + verdict) or 'drm' "
                          "(Bradley-Terry)")
    cli.join_processes(config)
    mesh = parse(MeshConfig, config).make()
    if config.data.path != "toy":
        from rrc_jax.rm.recipes import train_on_preferences

        return train_on_preferences(config, mesh)
    spec = world.ModelSpec(hidden=config.model.hidden, layers=config.model.layers, steps=config.train.steps,
                           batch_size=config.train.batch_size, learning_rate=config.train.learning_rate)
    t = config.toy
    task = SortTask(t.min_len, t.max_len, t.noise)
    settings = world.WorldSettings(task=task, grm=spec, drm=spec, seed=config.seed,
                                   annotator=Annotator(t.miscount, t.position_bias, t.length_bias))
    tokenizer = make_char_tokenizer(ALPHABET)
    # held out: pairs on evaluation-split prompts, labelled by the oracle, judged greedily with the toy template
    held_out = toy_preferences(task, t.eval_pairs, np.random.default_rng(40_000 + config.seed),
                                     held_out=True, name="toy-eval")
    toy_judge = config.copy_and_resolve_references()
    toy_judge.judge.template, toy_judge.judge.max_new_tokens = "toy_pairwise_cot", 24
    evaluate = lambda model: held_out_metrics(toy_judge, model, tokenizer, held_out)
    # parameters, optimizer state and batches over the mesh; metrics, checkpoints and resume in the workdir
    with jax.set_mesh(mesh), model_context(mesh), recording(config, evaluate=evaluate):
        model = (world.train_grm if config.kind == "grm" else world.train_drm)(settings, tokenizer)
    out = Path(config.workdir).expanduser() / "hf_export"
    save_hf(model, out, tokenizer=tokenizer)
    return out


def main(argv) -> None:
    out = cli.exit_on_user_error(run_rm, cli.config_value(CONFIG, argv, "grm_sft.py"))
    print(f"saved the reward model to {out}", file=sys.stderr)


if __name__ == "__main__":
    cli.start(main)
