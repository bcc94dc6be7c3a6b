"""Orbax checkpoints of a training run: the learner's parameters and optimizer state, the step and the data
iterator's state.

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

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from rrc_jax.errors import ConfigError
from rrc_jax.models import Decoder
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
