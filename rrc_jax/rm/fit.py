"""The supervised training loop of reward models (and of the toy policy): `steps` learner updates on a batch
iterator, with linear warm-up then cosine decay."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import jax
import numpy as np

from rrc_jax.models import Decoder
from rrc_jax.progress import Progress
from rrc_jax.rl.learner import Learner, learning_rate_schedule, make_optimizer
from rrc_jax.rm.losses import LOSSES


def fit(model: Decoder, batches: Iterator[dict[str, np.ndarray]], *, kind: str, steps: int, learning_rate: float,
        warmup: int = 50, desc: str = "train", log: Callable[[int, dict], None] | None = None,
        loss: Callable | None = None) -> dict[str, float]:
    """`steps` optimizer steps of `kind` ('sft' | 'bt', `rrc_jax.rm.losses.LOSSES`; `loss` replaces its function,
    e.g. `bt_loss` with reward centering) with linear warm-up then cosine decay to a tenth of `learning_rate`;
    returns the mean metrics of the last 10% of steps."""
    if kind not in LOSSES:
        raise ValueError(f"kind={kind!r}: use 'sft' (GRM / policy SFT, Eq. 2) or 'bt' (DRM, Eq. 1)")
    schedule = learning_rate_schedule(learning_rate, kind="cosine", warmup_steps=min(warmup, max(steps // 10, 1)),
                                      total_steps=steps, end_fraction=0.1)
    learner = Learner(model, make_optimizer(schedule), loss or LOSSES[kind])
    tail: list[dict[str, float]] = []
    with Progress(steps, desc) as bar:
        for step in range(steps):
            metrics = {k: float(v) for k, v in jax.device_get(learner.update(next(batches))).items()}
            if step >= steps - max(steps // 10, 1):
                tail.append(metrics)
            if log is not None:
                log(step, metrics)
            bar.update(1, loss=metrics["loss"])
    return {k: float(np.mean([m[k] for m in tail])) for k in tail[0]} if tail else {}
