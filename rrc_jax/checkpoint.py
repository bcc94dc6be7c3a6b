"""Orbax checkpoints of a training run: the learner's parameters and optimizer state, the step and the data
iterator's state; and what every training loop (GRPO's `rrc_jax.rl.trainer`, the reward models' `rrc_jax.rm.fit`)
does around them: resume from the latest (`Checkpointer.resume`), save when due or stopped (`Checkpointer.end_step`
with `StopSignals`: Ctrl-C or SIGTERM, how Cloud TPU preempts a VM, save after the current step and exit).

One composite item per saved step under `directory/<step>/`: `state` (a pytree of arrays: `params`, a pure dict
of the policy's parameters; `opt`, the optimizer state's leaves; `step`) and `data` (the grain iterator state,
JSON). Saves are asynchronous; the `keep` most recent steps are kept. RNG keys are not stored: every random draw
of step s derives from `fold_in(key(seed), s)`, so a resumed run draws exactly what an uninterrupted one would.

Restores place every array as the live one it replaces is placed (abstract targets with the current shardings),
so a checkpoint written on one mesh, or one number of hosts, resumes on another, a single device included. The
directory may be a `gs://` URI (etils `epath`). On several hosts every process calls `save` and `restore` (Orbax
coordinates them; process 0 writes the JSON item).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from rrc_jax import distributed
from rrc_jax.errors import ConfigError
from rrc_jax.models import Decoder
from rrc_jax.progress import say
from rrc_jax.rl.learner import Learner


def _state_tree(learner: Learner, step: int) -> dict:
    return {**learner.state(), "step": jnp.asarray(step, jnp.int32)}


class Checkpointer:
    """Save every `save_every` steps (0: only when forced), keep the last `keep`, resume from the latest."""

    def __init__(self, directory: str | os.PathLike, save_every: int = 0, keep: int = 2):
        directory = epath.Path(directory).expanduser()
        self.directory = directory if "://" in str(directory) else directory.absolute()
        self.save_every = save_every
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "data"))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def maybe_save(self, step: int, learner: Learner, data_iter, force: bool = False) -> bool:
        if not force and not (self.save_every and step % self.save_every == 0):
            return False
        if step in self.manager.all_steps():
            return True
        data = json.loads(json.dumps(data_iter.get_state(), default=int))
        return self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(_state_tree(learner, step)), data=ocp.args.JsonSave(data)), force=True)

    def restore(self, learner: Learner, data_iter, step: int | None = None) -> int:
        """Load the latest (or given) step into `learner` and `data_iter`; returns the step."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _state_tree(learner, step))
        out = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                                 data=ocp.args.JsonRestore()))
        learner.load_state(out["state"])
        data_iter.set_state(out["data"])
        return int(out["state"]["step"])

    def resume(self, learner: Learner, data_iter) -> int:
        """Restore the latest checkpoint, if there is one, into `learner` and `data_iter` (saying so); returns its
        step, 0 when there is none."""
        if self.latest_step() is None:
            return 0
        step = self.restore(learner, data_iter)
        say(f"resumed from the checkpoint of step {step} in {self.directory}")
        return step

    def end_step(self, step: int, learner: Learner, data_iter, stop: StopSignals, *, last: bool) -> None:
        """After `step`: save when due, on the `last` step, or when any host got a stop signal; after a signal, wait
        for the save and exit with 128 + the signal's number."""
        signum = stop.agreed()
        self.maybe_save(step, learner, data_iter, force=last or bool(signum))
        if signum:
            self.wait()
            say(f"interrupted ({signal.Signals(signum).name}): checkpoint of step {step} saved in {self.directory}")
            sys.exit(128 + signum)

    def restore_params(self, model: Decoder) -> int:
        """Only the policy parameters of the latest step, into `model` (`--config.init_from`)."""
        step = self.latest_step()
        if step is None:
            raise ConfigError(f"config.init_from: no checkpoint in {self.directory}")
        params = nnx.state(model, nnx.Param)
        abstract = {"params": jax.tree.map(ocp.utils.to_shape_dtype_struct, nnx.to_pure_dict(params))}
        out = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
            abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract), partial_restore=True)))
        nnx.replace_by_pure_dict(params, out["state"]["params"])
        nnx.update(model, params)
        return step

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()


class StopSignals:
    """SIGINT (Ctrl-C) and SIGTERM (a preempted Cloud TPU VM) noted instead of raised, so the loop finishes its step,
    saves a checkpoint and exits with 128 + the signal's number (`Checkpointer.end_step`). `agreed()` is the signal
    any host got (0 if none): every host stops after the same step."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.received = 0
        self._previous = {s: signal.signal(s, self._note) for s in self.SIGNALS}

    def _note(self, signum, _frame) -> None:
        self.received = self.received or signum

    def agreed(self) -> int:
        return int(distributed.host_concat(np.asarray([self.received])).max())

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


class Replay:
    """An iterator whose checkpointable state is how many items it has given: `set_state` on a fresh one draws (and
    drops) that many, so any deterministic iterator (the reward models' endless batch factories, whose random draws
    are seeded) resumes exactly where it stopped; the replay costs building the items, not training on them."""

    def __init__(self, items: Iterator):
        self.items = items
        self.given = 0

    def __iter__(self) -> Replay:
        return self

    def __next__(self):
        item = next(self.items)
        self.given += 1
        return item

    def get_state(self) -> dict:
        return {"given": self.given}

    def set_state(self, state: dict) -> None:
        if self.given:
            raise ValueError(f"Replay.set_state on an iterator that has already given {self.given} items: "
                             "restore into a fresh one")
        for _ in range(int(state["given"])):
            next(self)
