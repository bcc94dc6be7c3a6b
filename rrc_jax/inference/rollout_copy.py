"""The rollout copy: the policy in the inference layout, resharded from the learner's master after every update.

The learner keeps the policy's float32 master weights in the training layout (FSDP: each chip holds a slice of
every weight, gathered layer by layer in the training step). Decoding from that layout would gather every weight
onto every chip at each step. The rollout samples instead from a copy in the inference layout
(`rrc_jax.sharding.Layout`, kind `inference`: tensor-parallel, in the compute dtype, bf16 in the paper's recipe),
which one jitted program refreshes after each optimizer step (`sync`): cast and reshard, the old copy's buffers
donated to the new one (no second copy at the peak). tunix reshards its trainer's weights into its rollout layout
the same way (its docs/performance.md).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from rrc_jax.models import Decoder
from rrc_jax.sharding import Layout, bytes_per_device, model_context


class RolloutCopy:
    """`master` (a `Decoder`, any layout) copied into `layout` with parameters in `dtype`; `model` is the copy.

    `sync(params)` writes `params` (an `nnx.State` of the master's `nnx.Param`s) into the copy and returns the
    bytes each device received (the copy's shard on the most loaded device: an upper bound on what crosses chips).
    """

    def __init__(self, master: Decoder, layout: Layout, dtype: str):
        cfg = master.cfg.replace(param_dtype=dtype)
        with model_context(None):  # abstract, the logical names kept as metadata; placed by `layout` below
            graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))
        self._variables, self._treedef = jax.tree.flatten(abstract, is_leaf=_is_variable)
        shardings = [layout.sharding(v.sharding_names, v.value.shape) for v in self._variables]
        cast = lambda leaves: [x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x for x in leaves]
        self._reshard = jax.jit(lambda master, old: cast(master), out_shardings=shardings, donate_argnums=1,
                                keep_unused=True)
        self._values = jax.jit(cast, out_shardings=shardings)(self._leaves(nnx.state(master, nnx.Param)))
        self.model = nnx.merge(graphdef, self._state())
        self.bytes_per_device = bytes_per_device(self._values)

    def _leaves(self, params) -> list[jax.Array]:
        leaves = jax.tree.leaves(params, is_leaf=_is_variable)
        if len(leaves) != len(self._variables):
            raise ValueError(f"update_weights: {len(leaves)} parameters for a model of {len(self._variables)}")
        return [v.value if _is_variable(v) else v for v in leaves]

    def _state(self) -> nnx.State:
        return jax.tree.unflatten(self._treedef, [v.replace(x) for v, x in zip(self._variables, self._values)])

    def sync(self, params) -> int:
        """Reshard `params` into the copy (one jitted program, the old copy donated) and wait for it (the caller
        times it as `time/weight_sync`); `model` sees the new values."""
        self._values = jax.block_until_ready(self._reshard(self._leaves(params), self._values))
        nnx.update(self.model, self._state())
        return self.bytes_per_device


def _is_variable(x) -> bool:
    return isinstance(x, nnx.Variable)
