"""Orbax checkpoints of a training run: policy parameters, optimizer state, step and the data iterator's state.

One composite item per saved step under `directory/<step>/`: `state` (a pytree of arrays: `params`, `opt`,
`step`) and `data` (the grain iterator state, JSON). Saves are asynchronous; `keep` most recent steps are kept.
RNG keys are not stored: every random draw of step s derives from `fold_in(key(seed), s)`, so a resumed run draws
exactly what an uninterrupted one would.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from flax import nnx

from rrc_jax.models import Decoder


def _state_tree(model: Decoder, optimizer: nnx.Optimizer, step: int) -> dict:
    return {"params": nnx.to_pure_dict(nnx.state(model, nnx.Param)),
            "opt": nnx.to_pure_dict(nnx.state(optimizer)),
            "step": jnp.asarray(step, jnp.int32)}


class Checkpointer:
    """Save every `save_every` steps (0: only when forced), keep the last `keep`, resume from the latest."""

    def __init__(self, directory: str | Path, save_every: int = 0, keep: int = 2):
        self.directory = Path(directory).expanduser().absolute()
        self.save_every = save_every
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "data"))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def maybe_save(self, step: int, model: Decoder, optimizer: nnx.Optimizer, data_iter, force: bool = False
                   ) -> bool:
        if not force and not (self.save_every and step % self.save_every == 0):
            return False
        if step in self.manager.all_steps():
            return True
        state = _state_tree(model, optimizer, step)
        data = json.loads(json.dumps(data_iter.get_state(), default=int))
        return self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                               data=ocp.args.JsonSave(data)), force=True)

    def restore(self, model: Decoder, optimizer: nnx.Optimizer, data_iter, step: int | None = None) -> int:
        """Load the latest (or given) step into `model`, `optimizer` and `data_iter`; returns the step."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _state_tree(model, optimizer, step))
        out = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                                 data=ocp.args.JsonRestore()))
        self._assign(model, nnx.Param, out["state"]["params"])
        opt_state = nnx.state(optimizer)
        nnx.replace_by_pure_dict(opt_state, out["state"]["opt"])
        nnx.update(optimizer, opt_state)
        data_iter.set_state(out["data"])
        return int(out["state"]["step"])

    def restore_params(self, model: Decoder) -> int:
        """Only the policy parameters of the latest step (`--config.init_from`)."""
        step = self.latest_step()
        if step is None:
            raise FileNotFoundError(f"config.init_from: no checkpoint in {self.directory}")
        abstract = {"params": jax.tree.map(ocp.utils.to_shape_dtype_struct,
                                           nnx.to_pure_dict(nnx.state(model, nnx.Param)))}
        out = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
            abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract), partial_restore=True)))
        self._assign(model, nnx.Param, out["state"]["params"])
        return step

    @staticmethod
    def _assign(model: Decoder, kind, pure: dict) -> None:
        state = nnx.state(model, kind)
        nnx.replace_by_pure_dict(state, pure)
        nnx.update(model, state)

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()
