"""The divergence guard: stop a run that has stopped training, before it saves or exports a broken model.

Checked after every step, before its checkpoint (`Trainer._run`), so a step that fails is never saved and the
workdir's latest checkpoint is the last good state:

- **skipped updates**: more than `rl.max_skipped_fraction` of the optimizer updates of the last `rl.guard_window`
  steps were skipped for a non-finite loss or gradient (judged once that many steps, or every step of a shorter
  run, have run);
- **exploded parameters**: a non-finite policy parameter, or a global parameter norm above `rl.max_param_growth`
  times its value when the run (or its resume) started (`rl.learning_rate=1e30` gets there in one update);
- **an abstaining judge** (`log.abstain_abort`, 0.9 by default; 0 turns it off): the judge abstained on more than
  `log.abstain_abort` of its questions for `log.flat_alarm_steps` steps in a row, so the rewards were (nearly) all
  ties and the run learned nothing (the alarm of `rrc_jax.rl.alarms` warns from `log.abstain_alarm` on);
- **a failing judge server** (`inference.max_failed_fraction`, 0.5 by default; 1 turns it off): more than that share
  of the requests of a step's judging (`judge/requests`, `judge/failed_requests`) or of its held-out evaluation
  (`eval/judge_*`) went unanswered, checked at step 0's evaluation too (`check_requests`). The line names the
  server and the failures by kind (connection refused, timed out, HTTP 404, ...); the step is not saved, so a rerun
  once the server answers resumes where an uninterrupted run would be.

A tripped guard raises `Diverged` with one line naming the cause and the step; the command line prints it and
exits non-zero, leaving no `hf_export`.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from typing import ClassVar

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from rrc_jax.errors import Diverged
from rrc_jax.inference.openai_engine import failure_text
from rrc_jax.models.lora import trainable
from rrc_jax.settings import field_error


@dataclasses.dataclass(frozen=True)
class GuardConfig:
    """When the guard stops a run (`rl`): more than `max_skipped_fraction` of the last `guard_window` steps'
    updates skipped (non-finite), or the parameter norm grown `max_param_growth` times."""

    GROUP: ClassVar[str] = "rl"
    max_skipped_fraction: float = 0.5
    guard_window: int = 10
    max_param_growth: float = 10.0

    def __post_init__(self):
        if not 0 <= self.max_skipped_fraction <= 1 or self.guard_window < 1 or not self.max_param_growth > 1:
            raise field_error("rl", "max_skipped_fraction", f"the guard needs 0 <= max_skipped_fraction <= 1 (got "
                              f"{self.max_skipped_fraction}), guard_window >= 1 (got {self.guard_window}) and "
                              f"max_param_growth > 1 (got {self.max_param_growth})")


@jax.jit
def _norm_and_finite(params) -> tuple[jax.Array, jax.Array]:
    leaves = jax.tree.leaves(params)
    return optax.global_norm(leaves), jnp.all(jnp.array([jnp.all(jnp.isfinite(x)) for x in leaves]))


def parameter_health(model: nnx.Module) -> tuple[float, bool]:
    """(global norm, all finite) of the parameters a model trains (under LoRA its adapters: the base is frozen),
    read back once."""
    norm, finite = jax.device_get(_norm_and_finite(nnx.state(model, trainable(model))))
    return float(norm), bool(finite)


class DivergenceGuard:
    """`check(step, metrics, model)` after each step (module docstring). `updates_per_step`: optimizer updates a
    step makes (`mu` x minibatches); `steps`: the run's length (a shorter run is judged over all its steps);
    `abstain_abort` (0: off) and `abstain_steps`: `log.abstain_abort` and `log.flat_alarm_steps`; `server` and
    `max_failed_fraction`: a served judge's URL and `inference.max_failed_fraction` (1: off)."""

    def __init__(self, guard: GuardConfig, updates_per_step: int, steps: int, model: nnx.Module, *,
                 abstain_abort: float = 0.0, abstain_steps: int = 1, server: str = "",
                 max_failed_fraction: float = 1.0):
        self.server, self.max_failed = server, max_failed_fraction
        self.max_skipped, self.max_growth = guard.max_skipped_fraction, guard.max_param_growth
        self.window = max(1, min(guard.guard_window, steps))
        self.skipped: deque[int] = deque(maxlen=self.window)
        self.updates_per_step = updates_per_step
        self.abstain_abort, self.abstain_steps = abstain_abort, max(1, abstain_steps)
        self.abstaining = 0
        self.initial_norm, _ = parameter_health(model)

    def check_requests(self, step: int, metrics: dict) -> None:
        """Raise `Diverged` when the judge server left more than `max_failed_fraction` of the requests of the
        step's judging (`judge/*`) or of its held-out evaluation (`eval/judge_*`) unanswered."""
        for prefix, what in (("judge/", "judging"), ("eval/judge_", "held-out evaluation")):
            sent, failed = metrics.get(f"{prefix}requests", 0), metrics.get(f"{prefix}failed_requests", 0)
            if sent and failed > self.max_failed * sent:
                kinds = failure_text({k[len(prefix):]: v for k, v in metrics.items() if k.startswith(prefix)})
                raise Diverged(f"step {step}: the judge server {self.server} left {int(failed)} of {int(sent)} "
                               f"requests of the step's {what} unanswered ({kinds}), more than "
                               f"inference.max_failed_fraction={self.max_failed:g}; the step is not saved: once the "
                               "server answers, rerun the same command to resume from the last checkpoint")

    def check(self, step: int, metrics: dict, model: nnx.Module) -> None:
        """Raise `Diverged` when a guard trips at `step`."""
        self.check_requests(step, metrics)
        norm, finite = parameter_health(model)
        if not finite:
            raise Diverged(f"step {step}: the policy has non-finite parameters")
        if norm > self.max_growth * self.initial_norm:
            raise Diverged(f"step {step}: the policy's parameter norm grew from {self.initial_norm:.4g} to {norm:.4g} "
                           f"(more than rl.max_param_growth={self.max_growth:g} times); lower rl.learning_rate")
        self.skipped.append(int(metrics.get("skipped_updates", 0)))
        if len(self.skipped) == self.window:
            share = sum(self.skipped) / (self.window * self.updates_per_step)
            if share > self.max_skipped:
                raise Diverged(f"step {step}: {share:.0%} of the updates of the last {self.window} steps were skipped "
                               f"for a non-finite loss or gradient (rl.max_skipped_fraction={self.max_skipped:g}); "
                               "lower rl.learning_rate or check the rewards for NaN")
        rate = metrics.get("judge/abstain_rate", math.nan)
        self.abstaining = self.abstaining + 1 if self.abstain_abort and rate > self.abstain_abort else 0
        if self.abstaining >= self.abstain_steps:
            raise Diverged(f"step {step}: the judge abstained on more than log.abstain_abort={self.abstain_abort:g} "
                           f"of its questions for {self.abstaining} steps in a row; read workdir/samples/")
