"""Reward-model training: generative judges by SFT on rationale + verdict (Eq. 2), discriminative reward models
by Bradley-Terry (Eq. 1).

(The `python -m rrc_jax.train_rm --config=...` entry point comes with the ml_collections configs, issue 5.)

A GRM example is a judge question rendered with a judging template (`rrc_jax.judge.prompts`) exactly as the judge
engine renders it at inference, followed by the target judgment (rationale, then `[[A]]` / `[[B]]`). The A/B order
of every pair is drawn at random, so the verdict letter carries no position prior. A DRM example is a
(prompt + chosen, prompt + rejected) pair scored by the value head at its last token.

The same `fit` loop serves the toy world's bootstrap (`rrc_jax.data.toy.world`) and real preference data.
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

