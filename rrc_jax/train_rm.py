"""Reward-model training: generative judges by SFT on rationale + verdict (Eq. 2), discriminative reward models
by Bradley-Terry (Eq. 1).

    python -m rrc_jax.train_rm --config=configs/grm_sft.py   # GRM SFT (Eq. 2)
    python -m rrc_jax.train_rm --config=configs/drm_bt.py    # DRM, Bradley-Terry (Eq. 1)

A GRM example is a judge question rendered with a judging template (`rrc_jax.judge.prompts`) exactly as the judge
engine renders it at inference, followed by the target judgment (rationale, then `[[A]]` / `[[B]]`). The A/B order
of every pair is drawn at random, so the verdict letter carries no position prior. A DRM example is a
(prompt + chosen, prompt + rejected) pair scored by the value head at its last token.

The same `fit` loop serves the toy world's bootstrap (`rrc_jax.data.toy.world`) and this command line; it takes any
iterator of batches, so preference-dataset loaders (HelpSteer3, not built yet) plug into it unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import numpy as np

from rrc_jax.judge.prompts import encode_text, get_template, render_parts
from rrc_jax.models import Decoder, prompt_ids
from rrc_jax.progress import Progress
from rrc_jax.sampling import length_bucket, pad_sequences
from rrc_jax.sft import make_optimizer, sft_batch, train_step


@dataclasses.dataclass(frozen=True)
class Preference:
    """One preference example: `chosen` is better than `rejected` for `prompt`; `rationale` (optional) is the
    judge reasoning to imitate before the verdict (GRM SFT)."""

    prompt: str
    chosen: str
    rejected: str
    rationale: str = ""


def grm_example(tokenizer, template: str, pref: Preference, rng: np.random.Generator,
                judgment: Callable[[str, str, bool], str] | None = None) -> tuple[list[int], list[int]]:
    """(question ids, judgment ids + EOS) for one preference with a random A/B order.

    `judgment(a, b, a_is_chosen)` writes the target text; by default `' {rationale} [[A|B]]'`.
    """
    chosen_first = bool(rng.random() < 0.5)
    a, b = (pref.chosen, pref.rejected) if chosen_first else (pref.rejected, pref.chosen)
    prefix, suffix = render_parts(tokenizer, get_template(template), pref.prompt, a=a, b=b)
    if judgment is None:
        verdict = "A" if chosen_first else "B"
        target = f" {pref.rationale} [[{verdict}]]" if pref.rationale else f" [[{verdict}]]"
    else:
        target = judgment(a, b, chosen_first)
    completion = encode_text(tokenizer, target, first=False) + [int(tokenizer.eos_token_id)]
    return encode_text(tokenizer, prefix + suffix, first=True), completion


def sft_batches(examples: Callable[[], tuple[list[int], list[int]]], batch_size: int, pad_id: int
                ) -> Iterator[dict[str, np.ndarray]]:
    """Endless SFT batches from an example factory, padded to a `length_bucket`."""
    while True:
        ex = [examples() for _ in range(batch_size)]
        length = length_bucket(max(len(p) + len(c) for p, c in ex))
        yield sft_batch([p for p, _ in ex], [c for _, c in ex], length, pad_id)


def drm_batches(tokenizer, prefs: Callable[[], Preference], batch_size: int, pad_id: int
                ) -> Iterator[dict[str, np.ndarray]]:
    """Endless Bradley-Terry batches: prompt + chosen vs prompt + rejected (each ending with EOS)."""
    eos = int(tokenizer.eos_token_id)
    while True:
        ps = [prefs() for _ in range(batch_size)]
        rows = {}
        for side in ("chosen", "rejected"):
            rows[side] = [prompt_ids(tokenizer, p.prompt) + encode_text(tokenizer, getattr(p, side), first=False)
                          + [eos] for p in ps]
        length = length_bucket(max(len(r) for side in rows.values() for r in side))
        batch = {}
        for side, seqs in rows.items():
            batch[f"{side}_ids"], batch[f"{side}_mask"] = pad_sequences(seqs, length, pad_id, "right")
        yield batch


def fit(model: Decoder, batches: Iterator[dict[str, np.ndarray]], *, kind: str, steps: int, learning_rate: float,
        warmup: int = 50, desc: str = "train", log: Callable[[int, dict], None] | None = None) -> dict[str, float]:
    """`steps` optimizer steps of `kind` ('sft' | 'bt') with linear warm-up then cosine decay; returns the mean
    metrics of the last 10% of steps."""
    import optax

    if kind not in ("sft", "bt"):
        raise ValueError(f"kind={kind!r}: use 'sft' (GRM / policy SFT, Eq. 2) or 'bt' (DRM, Eq. 1)")
    schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, min(warmup, max(steps // 10, 1)),
                                                  max(steps, 2), end_value=learning_rate * 0.1)
    optimizer = make_optimizer(model, schedule)
    tail: list[dict[str, float]] = []
    with Progress(steps, desc) as bar:
        for step in range(steps):
            metrics = {k: float(v) for k, v in train_step(model, optimizer, next(batches), kind=kind).items()}
            if step >= steps - max(steps // 10, 1):
                tail.append(metrics)
            if log is not None:
                log(step, metrics)
            bar.update(1, loss=metrics["loss"])
    return {k: float(np.mean([m[k] for m in tail])) for k in tail[0]} if tail else {}



# ------------------------------------------------------------------------------------------------------------
# Command line: python -m rrc_jax.train_rm --config=configs/grm_sft.py (or configs/drm_bt.py)
# ------------------------------------------------------------------------------------------------------------

def rm_config(kind: str):
    """Defaults of the reward-model trainer: `kind` 'grm' (SFT, Eq. 2) or 'drm' (Bradley-Terry, Eq. 1)."""
    import ml_collections

    c = ml_collections.ConfigDict()
    c.kind = kind
    c.workdir = f"workdir/{kind}"
    c.seed = 0
    c.data = ml_collections.ConfigDict(dict(path="toy"))  # toy preference pairs (the toy world's task)
    c.toy = ml_collections.ConfigDict(dict(min_len=4, max_len=6, noise=0.3))
    c.model = ml_collections.ConfigDict(dict(hidden=96 if kind == "grm" else 64, layers=3 if kind == "grm" else 2))
    c.train = ml_collections.ConfigDict(dict(steps=1200 if kind == "grm" else 400, batch_size=64,
                                             learning_rate=3e-3))
    c.lock()
    return c


def run_rm(config):
    """Train the configured reward model and export it to `workdir/hf_export` (with its tokenizer)."""
    from pathlib import Path

    from rrc_jax.data.toy import world
    from rrc_jax.data.toy.task import ALPHABET, SortTask
    from rrc_jax.models import save_hf
    from rrc_jax.models.char_tokenizer import make_char_tokenizer

    if config.kind not in ("grm", "drm"):
        raise ValueError(f"config.kind: {config.kind!r}; use 'grm' (SFT on rationale + verdict) or 'drm' "
                         "(Bradley-Terry)")
    if config.data.path != "toy":
        raise ValueError(f"config.data.path: {config.data.path!r}; only the toy world's pairs are supported so far "
                         "(preference-dataset loaders such as HelpSteer3 are not built yet)")
    spec = world.ModelSpec(hidden=config.model.hidden, layers=config.model.layers, steps=config.train.steps,
                           batch_size=config.train.batch_size, learning_rate=config.train.learning_rate)
    task = SortTask(config.toy.min_len, config.toy.max_len, config.toy.noise)
    settings = world.WorldSettings(task=task, grm=spec, drm=spec, seed=config.seed)
    tokenizer = make_char_tokenizer(ALPHABET)
    rng = np.random.default_rng(config.seed)
    model = (world.train_grm if config.kind == "grm" else world.train_drm)(settings, tokenizer, rng)
    out = Path(config.workdir).expanduser() / "hf_export"
    save_hf(model, out, tokenizer=tokenizer)
    return out


def main(argv) -> None:
    import sys

    from absl import app

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    try:
        out = run_rm(_CONFIG.value)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")
    print(f"saved the {_CONFIG.value.kind.upper()} to {out}", file=sys.stderr)


if __name__ == "__main__":
    from absl import app
    from ml_collections import config_flags

    _CONFIG = config_flags.DEFINE_config_file("config", None, "configs/grm_sft.py or configs/drm_bt.py",
                                              lock_config=True)
    app.run(main)
