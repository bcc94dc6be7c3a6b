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

import dataclasses
import sys
from pathlib import Path

import jax
import numpy as np

from rrc_jax import cli
from rrc_jax.config import TrainerSettings
from rrc_jax.data.toy import world
from rrc_jax.data.toy.task import ALPHABET, Annotator, SortTask, toy_preferences
from rrc_jax.models import save_hf
from rrc_jax.models.char_tokenizer import make_char_tokenizer
from rrc_jax.rl.trainer import run
from rrc_jax.rm.fit import recording
from rrc_jax.rm.recipes import held_out_metrics, train_on_preferences
from rrc_jax.sharding import model_context

CONFIG = cli.config_flag("grm_sft.py, drm_bt.py, rmr1_distill.py, rmr1_rlvr.py, irpo.py", "Reward-model recipe")


def train_toy(s, mesh) -> Path:
    """Train `s.kind` (an `rrc_jax.config.RMSettings` with `data.path = "toy"`) on the toy world's preference pairs,
    evaluate it on held-out pairs and export it; returns the export directory."""
    m, t, toy = s.model, s.train, s.toy
    spec = world.ModelSpec(hidden=m.hidden, layers=m.layers, steps=t.steps, batch_size=t.batch_size,
                           learning_rate=t.learning_rate)
    task = SortTask(toy.min_len, toy.max_len, toy.noise)
    settings = world.WorldSettings(task=task, grm=spec, drm=spec, seed=s.seed,
                                   annotator=Annotator(toy.miscount, toy.position_bias, toy.length_bias))
    tokenizer = make_char_tokenizer(ALPHABET)
    # held out: pairs on evaluation-split prompts, labelled by the oracle, judged greedily with the toy template
    held_out = toy_preferences(task, toy.eval_pairs, np.random.default_rng(40_000 + s.seed), held_out=True,
                               name="toy-eval")
    toy_judge = dataclasses.replace(s, judge=dataclasses.replace(s.judge, template="toy_pairwise_cot",
                                                                 max_new_tokens=24))
    evaluate = lambda model: held_out_metrics(toy_judge, model, tokenizer, held_out)
    # parameters, optimizer state and batches over the mesh; metrics, checkpoints and resume in the workdir
    with jax.set_mesh(mesh), model_context(mesh), recording(s, evaluate=evaluate):
        model = (world.train_grm if s.kind == "grm" else world.train_drm)(settings, tokenizer)
    out = Path(s.workdir).expanduser() / "hf_export"
    save_hf(model, out, tokenizer=tokenizer)
    return out


def train_reward_model(s) -> Path:
    """Train the reward model of settings `s` and export it to `workdir/hf_export` (with its tokenizer): a GRPO
    recipe (`rrc_jax.config.TrainerSettings`: RLVR, IRPO) by the trainer, whose policy is the judge; an
    `RMSettings` recipe on the toy world's pairs or a preference dataset (`rrc_jax.rm.recipes`)."""
    if isinstance(s, TrainerSettings):
        return Path(run(s)) / "hf_export"
    mesh = s.mesh.make()
    if s.data.path != "toy":
        return train_on_preferences(s, mesh)
    return train_toy(s, mesh)


def main(argv) -> None:
    settings = cli.settings_value(CONFIG, argv, "grm_sft.py")
    cli.join_processes(settings)
    out = cli.exit_on_user_error(train_reward_model, settings)
    print(f"saved the reward model to {out}", file=sys.stderr)


if __name__ == "__main__":
    cli.start(main)
