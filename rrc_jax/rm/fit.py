"""The supervised training loop of reward models (and of the toy policy): `steps` learner updates on a batch
iterator, with linear warm-up then cosine decay.

Inside `recording(settings, ...)` (what `rrc_jax.train_rm` does, for the toy world's models and the recipes on a
dataset alike) the loop keeps its run in `settings.workdir` as the GRPO trainer keeps its own, with the same pieces:

- every step's `loss`, the loss's metrics (`accuracy` for Bradley-Terry, `tokens` for SFT), `grad_norm`, `skipped`
  (a non-finite update, not applied), `lr` and `examples_per_second` in `metrics.jsonl`, TensorBoard and, with
  `log.wandb`, W&B (`rrc_jax.metrics.MetricsLogger`); `first` at step 0 of a fresh run; `evaluate(model)`'s metrics
  in the last step's line;
- the workdir held against a second writer, a resume refused under a changed config, `config.json` versioned
  (`rrc_jax.workdir`);
- Orbax checkpoints (`rrc_jax.checkpoint.Checkpointer`) every `checkpoint.save_every` steps and at the last, the
  `checkpoint.keep` latest kept; rerunning the same command resumes from the latest exactly: parameters, optimizer
  state and the batch iterator's position (`checkpoint.Replay`), so it ends with an uninterrupted run's parameters;
- Ctrl-C or SIGTERM saves a checkpoint after the current step and exits with 128 + the signal's number
  (`checkpoint.StopSignals`).

Outside it (the toy world's cached builds) the loop shows its progress bar only.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping

import jax
import numpy as np
from etils import epath

from rrc_jax.checkpoint import Checkpointer, Replay, StopSignals
from rrc_jax.metrics import MetricsLogger
from rrc_jax.models import Decoder
from rrc_jax.progress import Progress
from rrc_jax.rl.learner import Learner, learning_rate_schedule, make_optimizer
from rrc_jax.rm.losses import LOSSES
from rrc_jax.workdir import WorkdirLock, check_resume, config_hash, save_config


@dataclasses.dataclass(frozen=True)
class Recording:
    """Where and what a `fit` records (module docstring): `settings` has `workdir`, `metrics`, `checkpoint`,
    `resume` and the run's `record` (an `rrc_jax.config.RMSettings`)."""

    settings: object
    first: Mapping[str, object] = dataclasses.field(default_factory=dict)
    evaluate: Callable[[Decoder], dict[str, float]] | None = None


_RECORDING: contextvars.ContextVar[Recording | None] = contextvars.ContextVar("rrc_jax_fit_recording", default=None)


@contextlib.contextmanager
def recording(settings, *, first: Mapping[str, object] | None = None,
              evaluate: Callable[[Decoder], dict[str, float]] | None = None):
    """`with recording(settings, first=..., evaluate=...):` the `fit` inside keeps its run in `settings.workdir`."""
    token = _RECORDING.set(Recording(settings, dict(first or {}), evaluate))
    try:
        yield
    finally:
        _RECORDING.reset(token)


def fit(model: Decoder, batches: Iterator[dict[str, np.ndarray]], *, objective: str, steps: int,
        learning_rate: float, warmup: int = 50, desc: str = "train", loss: Callable | None = None) -> dict[str, float]:
    """`steps` optimizer steps of `objective` ('sft' | 'bt', `rrc_jax.rm.losses.LOSSES`; `loss` replaces its
    function, e.g. `bt_loss` with reward centering) with linear warm-up then cosine decay to a tenth of
    `learning_rate`; returns the mean metrics of the last 10% of steps (of those this run trained, when it
    resumed)."""
    if objective not in LOSSES:
        raise ValueError(f"objective={objective!r}: use 'sft' (GRM / policy SFT, Eq. 2) or 'bt' (DRM, Eq. 1)")
    schedule = learning_rate_schedule(learning_rate, curve="cosine", warmup_steps=min(warmup, max(steps // 10, 1)),
                                      total_steps=steps, end_fraction=0.1)
    learner = Learner(model, make_optimizer(schedule), loss or LOSSES[objective])
    data = Replay(batches)
    tail: list[dict[str, float]] = []
    with contextlib.ExitStack() as stack:
        run = _RECORDING.get()
        files = _RunFiles(run, learner, data, stack) if run is not None else None
        start = files.start if files else 0
        with Progress(steps, desc, start=start) as bar:
            for step in range(start + 1, steps + 1):
                t0 = time.perf_counter()
                batch = next(data)
                metrics = {k: float(v) for k, v in jax.device_get(learner.update(batch)).items()}
                metrics["lr"] = float(schedule(step - 1))  # the rate of this update (optax counts from 0)
                metrics["examples_per_second"] = len(next(iter(batch.values()))) / (time.perf_counter() - t0)
                if step > steps - max(steps // 10, 1):
                    tail.append(dict(metrics))
                if files:
                    files.end_step(step, metrics, last=step == steps)
                bar.update(1, loss=metrics["loss"])
    return {k: float(np.mean([m[k] for m in tail])) for k in tail[0]} if tail else {}


class _RunFiles:
    """A recorded fit's checkpointer (resumed on creation: `start`), metrics logger and stop signals, closed by
    `stack`."""

    def __init__(self, run: Recording, learner: Learner, data: Replay, stack: contextlib.ExitStack):
        s = run.settings
        workdir = epath.Path(s.workdir).expanduser()
        workdir.mkdir(parents=True, exist_ok=True)
        self.run, self.learner, self.data = run, learner, data
        stack.enter_context(WorkdirLock(workdir))  # one writer; then resume only under the same config
        check_resume(s.record, workdir, s.resume)
        self.ckpt = Checkpointer(workdir / "checkpoints", save_every=s.checkpoint.save_every, keep=s.checkpoint.keep,
                                 record=s.record, config_hash=config_hash(s.record))
        stack.callback(self.ckpt.close)
        self.start = self.ckpt.resume(learner, data)
        save_config(workdir, s.record)
        m = s.metrics
        self.logger = MetricsLogger(workdir, resume_step=self.start, tensorboard=m.tensorboard, wandb=m.wandb,
                                    wandb_project=m.wandb_project, record=s.record, name=workdir.name)
        stack.callback(self.logger.close)
        self.stop = StopSignals()
        stack.callback(self.stop.restore)
        if self.start == 0 and run.first:
            self.logger.log(0, run.first)

    def end_step(self, step: int, metrics: dict[str, float], *, last: bool) -> None:
        """Log `step` (with the evaluation on the `last`), then checkpoint it when due or stopped."""
        if last and self.run.evaluate is not None:
            metrics = {**metrics, **self.run.evaluate(self.learner.model)}
        self.logger.log(step, metrics)
        self.ckpt.end_step(step, self.learner, self.data, self.stop, last=last)
