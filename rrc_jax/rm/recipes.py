"""Reward-model recipes on a preference dataset, fine-tuning a Hugging Face checkpoint (`model.init`):

- `grm`: a generative judge by SFT on its judgment (Eq. 2): each example is a pair rendered with the judging
  template (`judge.template`, A/B order random), the target its rationale (HelpSteer3's annotator reasoning, or a
  pairs file's `rationale`) and verdict `[[A]]` / `[[B]]`; `judge.direct_share` of the examples use the template's
  direct-verdict variant (PRC without thinking). Prompt tokens are masked.
- `drm`: a discriminative reward model by Bradley-Terry (Eq. 1) with a scalar value head (added, zero-initialized,
  when the checkpoint has none), optionally with the pair's preference strength as margin (`train.margin`) and
  reward centering (`train.center_coef`).

`train_on_preferences(settings, mesh)` loads the data (`rrc_jax.data.preferences`), holds out `data.eval_path` or a
`data.eval_fraction` of its examples (whole RM-Bench rows), drops examples longer than `data.max_tokens`
(counted), trains for `train.steps` steps, recording the run as `rrc_jax.rm.fit` does (`metrics.jsonl` and
TensorBoard: the data counts at step 0, every step's losses after, and the held-out evaluation in the last step's
line: `eval/accuracy`, ... from `rrc_jax.rm.accuracy`, greedy, both A/B orders, also in `workdir/eval.json`;
checkpoints, resumed by rerunning the command), and saves `workdir/hf_export` with its tokenizer: the directory
`train --config.models.grm=...` (or `models.drm`) takes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ClassVar

import jax
import numpy as np

from rrc_jax import distributed
from rrc_jax.data.preferences import Preference, load_preferences
from rrc_jax.errors import ConfigError
from rrc_jax.inference import make_sampler
from rrc_jax.judge import Judge, JudgeConfig
from rrc_jax.judge.templates import direct_template, get_template
from rrc_jax.models import load_hf, load_tokenizer, save_hf
from rrc_jax.progress import say
from rrc_jax.rm.accuracy import evaluate, nothing_scored
from rrc_jax.rm.examples import drm_batches, grm_example, scored_ids, sft_batches
from rrc_jax.rm.fit import fit, recording
from rrc_jax.rm.losses import bt_loss
from rrc_jax.rm.scores import DRMScorer
from rrc_jax.settings import at_least, field_error, one_of
from rrc_jax.sharding import Layout, model_context


@dataclasses.dataclass(frozen=True)
class PreferenceDataConfig:
    """The preferences a reward model learns from (`data`): "toy", or a file, folder or hub name in `format`
    (`rrc_jax.data.preferences`: helpsteer3, rmbench, judgebench, pairs). Held out for the final evaluation:
    `eval_path`, else `eval_fraction` of the rows. Examples longer than `max_tokens` (question + judgment, or
    prompt + response) are dropped and counted."""

    GROUP: ClassVar[str] = "data"
    path: str = "toy"
    format: str = "pairs"
    split: str = "train"
    skip_bad_rows: bool = False
    min_strength: int = 0
    limit: int = 0  # rows of the file read; 0 = all
    eval_path: str = ""
    eval_fraction: float = 0.05
    max_tokens: int = 2048

    def __post_init__(self):
        if not 0 <= self.eval_fraction < 1:
            raise field_error("data", "eval_fraction", f"{self.eval_fraction} must be in [0, 1)")
        at_least("data", "max_tokens", self.max_tokens, 1)
        at_least("data", "limit", self.limit, 0, "0 = every row")


@dataclasses.dataclass(frozen=True)
class ToyPairsConfig:
    """The toy world's preference pairs (`toy`, with `data.path = "toy"`): the task's lengths and noise, the
    held-out pairs, and the annotator. Its judgments are the oracle's by default (a clean preference dataset, as the
    recipes assume); `TOY_ANNOTATOR`'s values give the imperfect annotator the toy world's GRM learns from."""

    GROUP: ClassVar[str] = "toy"
    min_len: int = 4
    max_len: int = 6
    noise: float = 0.3
    eval_pairs: int = 256  # held-out toy pairs
    miscount: float = 0.0
    position_bias: float = 0.0
    length_bias: float = 0.0


@dataclasses.dataclass(frozen=True)
class RMModelConfig:
    """The reward model (`model`): the toy world's size (`hidden`, `layers`), or `init`, the Hugging Face directory
    fine-tuned on a dataset; `dtype` its compute dtype (the master weights stay float32)."""

    GROUP: ClassVar[str] = "model"
    hidden: int = 96
    layers: int = 3
    init: str = ""
    dtype: str = "float32"

    def __post_init__(self):
        one_of("model", "dtype", self.dtype, ("float32", "bfloat16"))


@dataclasses.dataclass(frozen=True)
class RMJudgeConfig(JudgeConfig):
    """What a GRM is trained to answer and how its held-out evaluation asks it (`judge`): a `JudgeConfig` (the
    template `train --config.reward.judge.template` will ask with, `max_new_tokens` the bound of a judgment, greedy
    by default; both A/B orders), and the share of training examples rendered with the template's direct-verdict
    variant (PRC without thinking)."""

    GROUP: ClassVar[str] = "judge"
    template: str = "rrc_pairwise_cot"
    max_new_tokens: int = 512
    temperature: float = 0.0
    direct_share: float = 0.0

    def __post_init__(self):
        if not 0 <= self.direct_share <= 1:
            raise field_error("judge", "direct_share", f"{self.direct_share} must be in [0, 1]")
        super().__post_init__()  # the sampling fields


@dataclasses.dataclass(frozen=True)
class RMTrainConfig:
    """The optimization (`train`): steps, batch size and peak learning rate (warm-up, then cosine decay:
    `rrc_jax.rm.fit`). DRM: `margin` uses each pair's preference strength as the Bradley-Terry margin, `center_coef`
    the reward centering term (both off = Eq. 1 exactly)."""

    GROUP: ClassVar[str] = "train"
    steps: int = 1500
    batch_size: int = 64
    learning_rate: float = 3e-3
    margin: bool = False
    center_coef: float = 0.0

    def __post_init__(self):
        at_least("train", "steps", self.steps, 1)
        at_least("train", "batch_size", self.batch_size, 1)


def split_held_out(prefs: Sequence[Preference], fraction: float, seed: int
                   ) -> tuple[list[Preference], list[Preference]]:
    """(train, held out): a `fraction` of the examples' keys (at least one when there are two or more keys and
    `fraction > 0`) drawn at random, every example of a held-out key with it (an RM-Bench row's 9 pairs stay
    together)."""
    keys = sorted({p.key for p in prefs})
    n = min(len(keys) - 1, math.ceil(fraction * len(keys))) if fraction > 0 and len(keys) > 1 else 0
    held = set(np.random.default_rng(seed).permutation(keys)[:n].tolist())
    return [p for p in prefs if p.key not in held], [p for p in prefs if p.key in held]


def grm_examples(prefs: Sequence[Preference], tokenizer, template: str, direct_share: float, max_tokens: int,
                 rng: np.random.Generator) -> tuple[Callable[[], tuple[list[int], list[int]]], int]:
    """(an example factory `() -> (question ids, judgment ids + EOS)` over the preferences that fit `max_tokens`,
    how many did not fit). An example's template is the direct-verdict variant `direct_share` of the time."""
    think, direct = get_template(template), None
    if direct_share > 0:
        direct = direct_template(think)
    fits = [p for p in prefs if sum(map(len, grm_example(tokenizer, think, p, np.random.default_rng(0)))) <= max_tokens]
    if not fits:
        raise ConfigError(f"config.data.max_tokens={max_tokens}: no training example fits; raise it")

    def example():
        pref = fits[rng.integers(len(fits))]
        use_direct = direct is not None and rng.random() < direct_share
        return grm_example(tokenizer, direct if use_direct else think, pref, rng)

    return example, len(prefs) - len(fits)


def drm_pairs(prefs: Sequence[Preference], tokenizer, max_tokens: int, rng: np.random.Generator
              ) -> tuple[Callable[[], Preference], int]:
    """(a factory drawing a preference whose chosen and rejected rows both fit `max_tokens`, how many did not)."""
    fits = [p for p in prefs if max(len(scored_ids(tokenizer, p.prompt, r)) for r in (p.chosen, p.rejected))
            <= max_tokens]
    if not fits:
        raise ConfigError(f"config.data.max_tokens={max_tokens}: no training example fits; raise it")
    return (lambda: fits[rng.integers(len(fits))]), len(prefs) - len(fits)


def load_data(d: PreferenceDataConfig, seed: int) -> tuple[list[Preference], list[Preference], dict[str, int]]:
    """(train, held out, counts): the dataset of `d`, its held-out part (drawn with `seed`) and what happened to
    its rows (`data/*` metrics)."""
    load = functools.partial(load_preferences, format=d.format, split=d.split, skip_bad_rows=d.skip_bad_rows,
                             min_strength=d.min_strength, limit=d.limit or None)
    data = load(d.path)
    counts = {f"data/{k}": v for k, v in data.counts.items()}
    if d.eval_path:
        held = load(d.eval_path)
        counts.update({f"data/eval_{k}": v for k, v in held.counts.items()})
        return list(data.prefs), list(held.prefs), counts
    train, held = split_held_out(data.prefs, d.eval_fraction, seed)
    return train, held, counts


def train_on_preferences(s, mesh) -> Path:
    """Train `s.kind` ('grm' | 'drm') on `s.data` from `s.model.init` (module docstring; `s` an
    `rrc_jax.config.RMSettings`); returns the export directory."""
    if not s.model.init:
        raise ConfigError("config.model.init: a Hugging Face model directory to fine-tune is needed when "
                          f"config.data.path={s.data.path!r} is a dataset (the toy world trains its own)")
    workdir = Path(s.workdir).expanduser()
    train, held_out, counts = load_data(s.data, s.seed)
    if not train:
        raise ConfigError(f"config.data.path={s.data.path}: no training examples left "
                          f"({', '.join(f'{k}={v}' for k, v in counts.items())})")
    rng = np.random.default_rng(s.seed)
    tokenizer = load_tokenizer(s.model.init)
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    t = s.train
    with jax.set_mesh(mesh), model_context(mesh):
        model = load_hf(s.model.init, dtype=s.model.dtype, param_dtype="float32",  # master weights
                        value_head=s.kind == "drm", pad_token_id=pad, layout=Layout(mesh))
        if s.kind == "grm":
            example, too_long = grm_examples(train, tokenizer, s.judge.template, s.judge.direct_share,
                                             s.data.max_tokens, rng)
            batches, loss, objective = sft_batches(example, t.batch_size, pad), None, "sft"
        else:
            pref, too_long = drm_pairs(train, tokenizer, s.data.max_tokens, rng)
            batches = drm_batches(tokenizer, pref, t.batch_size, pad, margin=t.margin)
            loss, objective = functools.partial(bt_loss, center_coef=t.center_coef), "bt"
        counts.update({"data/train_examples": len(train) - too_long, "data/too_long_dropped": too_long,
                       "data/held_out_examples": len(held_out)})
        evaluate = (lambda m: held_out_metrics(s, m, tokenizer, held_out)) if held_out else None
        with recording(s, first=counts, evaluate=evaluate):
            fit(model, batches, objective=objective, steps=t.steps, learning_rate=t.learning_rate, loss=loss,
                desc=f"{s.kind.upper()} ({'Eq. 2' if objective == 'sft' else 'Eq. 1'})")
        out = workdir / "hf_export"
        save_hf(model, out, tokenizer=tokenizer)
    return out


def held_out_metrics(s, model, tokenizer, prefs: Sequence[Preference]) -> dict[str, float]:
    """`held_out_accuracy`, written to `workdir/eval.json` (process 0), as the `eval/*` metrics of the last step
    (`s` an `rrc_jax.config.RMSettings`)."""
    result, records = held_out_accuracy(s, model, tokenizer, prefs)
    why = nothing_scored("drm" if s.kind == "drm" else "pairwise", result, records)
    if why:  # no accuracy from nothing: 0.5 would read as a coin-flip judge
        result["accuracy"] = None
    path = Path(s.workdir).expanduser() / "eval.json"
    if distributed.is_main():
        path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    say(f"warning: held out: no accuracy ({why}) on {result['examples']} pairs ({path})" if why else
        f"held out: accuracy {result['accuracy']:.3f} on {result['examples']} pairs ({path})")
    metrics = {f"eval/{k}": v for k, v in result.items() if isinstance(v, (int, float))}
    return {**metrics, "eval/accuracy": math.nan} if why else metrics  # null in metrics.jsonl


def held_out_accuracy(s, model, tokenizer, prefs: Sequence[Preference]) -> dict:
    """The trained model's figures on held-out preferences and their records (`rrc_jax.rm.accuracy.evaluate`):
    the GRM judging greedily in both A/B orders with its template, the DRM scoring both responses."""
    if s.kind == "drm":
        return evaluate("drm", prefs, drm=DRMScorer(model, tokenizer))
    judge = Judge(make_sampler("grm", model, tokenizer, engine=s.inference), tokenizer,
                  dataclasses.replace(s.judge, seed=s.seed))
    return evaluate("pairwise", prefs, judge=judge)
