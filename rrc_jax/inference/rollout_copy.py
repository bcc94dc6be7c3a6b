"""The rollout copy: the policy in the inference layout, resharded from the learner's master after every update.

The learner keeps the policy's float32 master weights in the training layout (FSDP: each chip holds a slice of
every weight, gathered layer by layer in the training step). Decoding from that layout would gather every weight
onto every chip at each step. The rollout samples instead from a copy in the inference layout
(`rrc_jax.sharding.Layout`, kind `inference`: tensor-parallel, in the compute dtype, bf16 in the paper's recipe),
which one jitted program refreshes after each optimizer step (`sync`): cast and reshard, the old copy's buffers
donated to the new one (no second copy at the peak). tunix reshards its trainer's weights into its rollout layout
the same way (tunix's docs/performance.md, in its repository).

The program moves the stacked layers one layer at a time (a `fori_loop` writing each layer in place into the donated
copy). XLA reshards a tensor between two meshes of different shapes through a replicated copy of it ("involuntary
full rematerialization"): whole, the stacked weights would be replicated on every chip at once; a layer at a time,
the transient is one layer's weights in the copy's dtype (`rrc_jax.plan` counts it in the sync phase). The
embedding and the LM head are resharded whole.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from rrc_jax.models import Decoder
from rrc_jax.models.kv_cache import LAYERS
from rrc_jax.models.lora import trainable
from rrc_jax.sharding import Layout, bytes_per_device, model_context


class RolloutCopy:
    """`master` (a `Decoder`, any layout) copied into `layout` with parameters in `dtype`; `model` is the copy.

    `sync(params)` writes `params` (an `nnx.State` of what the master trains: its `nnx.Param`s, or under LoRA its
    adapters, `rrc_jax.models.lora.trainable`) into the copy and returns the bytes each device received (the synced
    arrays' shard on the most loaded device: an upper bound on what crosses chips). Under LoRA the frozen base is
    copied once, here, and each sync moves the adapters only (a few MB; merging them into a copy of the base would
    move the whole base every step).
    """

    def __init__(self, master: Decoder, layout: Layout, dtype: str):
        cfg = master.cfg.replace(param_dtype=dtype)
        with model_context(None):  # abstract, the logical names kept as metadata; placed by `layout` below
            graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))
        self._variables, self._treedef = jax.tree.flatten(abstract, is_leaf=_is_variable)
        names = [tuple(v.out_sharding or ()) for v in self._variables]
        shapes = [v.shape for v in self._variables]
        shardings = [layout.sharding(n, shape) for n, shape in zip(names, shapes)]
        layer_shardings = {i: layout.sharding(names[i][1:], shapes[i][1:])
                           for i, n in enumerate(names) if n[:1] == (LAYERS,)}
        cast = lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
        params = nnx.state(master, nnx.Param)
        everything = self._leaves(params)
        sources = {i: _layer_sharding(x) for i, x in enumerate(everything) if i in layer_shardings}
        # the leaves a sync moves: those the learner trains (all of them without LoRA)
        self._moving = [i for i, v in enumerate(jax.tree.leaves(params, is_leaf=_is_variable))
                        if isinstance(v, trainable(master))]

        def layer_copy(i, x):
            """A layer of master leaf i cast where it lies, then placed as the copy's layer. The barrier is there so
            that the reshard moves the copy's dtype rather than float32; XLA:CPU, which computes bfloat16 in
            float32, still gathers float32 (not checked on a TPU yet)."""
            x = cast(x)
            if sources[i] is not None:
                x = jax.lax.optimization_barrier(jax.lax.with_sharding_constraint(x, sources[i]))
            return jax.lax.with_sharding_constraint(x, layer_shardings[i])

        def resharder(indices: list[int]):
            """A jitted `(master leaves, old leaves) -> new leaves` for the leaves `indices`, the old ones donated:
            cast and placed as the copy's, the stacked ones a layer at a time."""
            stacked = [j for j, i in enumerate(indices) if i in layer_shardings]

            def reshard(master: list, old: list) -> list:
                out = [old[j] if j in stacked else cast(x) for j, x in enumerate(master)]

                def layer(n, acc):
                    put = lambda j, a: jax.lax.dynamic_update_index_in_dim(a, layer_copy(indices[j], master[j][n]),
                                                                           n, 0)
                    return tuple(put(j, a) for j, a in zip(stacked, acc))

                if stacked:
                    moved = jax.lax.fori_loop(0, shapes[indices[stacked[0]]][0], layer, tuple(out[j] for j in stacked))
                    for j, x in zip(stacked, moved):
                        out[j] = x
                return out

            return jax.jit(reshard, out_shardings=[shardings[i] for i in indices], donate_argnums=1,
                           keep_unused=True)

        zeros = jax.jit(lambda: [jnp.zeros(v.shape, v.dtype) for v in self._variables], out_shardings=shardings)
        self._values = resharder(list(range(len(everything))))(everything, zeros())  # the whole model, once
        self._reshard = resharder(self._moving)
        self.model = nnx.merge(graphdef, self._state())
        self.bytes_per_device = bytes_per_device([self._values[i] for i in self._moving])

    def _leaves(self, params, indices: list[int] | None = None) -> list[jax.Array]:
        leaves = jax.tree.leaves(params, is_leaf=_is_variable)
        expected = len(self._variables) if indices is None else len(indices)
        if len(leaves) != expected:
            raise ValueError(f"update_weights: {len(leaves)} parameters for a model that trains {expected}")
        return [v.value if _is_variable(v) else v for v in leaves]

    def _state(self) -> nnx.State:
        return jax.tree.unflatten(self._treedef, [v.replace(x) for v, x in zip(self._variables, self._values)])

    def sync(self, params) -> int:
        """Reshard `params` (what the master trains) into the copy (one jitted program, the old arrays donated) and
        wait for it (the caller times it as `time/weight_sync`); `model` sees the new values."""
        new = self._reshard(self._leaves(params, self._moving), [self._values[i] for i in self._moving])
        for i, x in zip(self._moving, jax.block_until_ready(new)):
            self._values[i] = x
        nnx.update(self.model, self._state())
        return self.bytes_per_device


def _layer_sharding(x: jax.Array) -> jax.sharding.NamedSharding | None:
    """The sharding of one layer `x[n]` of a stacked array `x` placed on a mesh (its layers axis unsplit), None for
    an array without a mesh."""
    sharding = getattr(x, "sharding", None)
    if not isinstance(sharding, jax.sharding.NamedSharding):
        return None
    spec = tuple(sharding.spec) + (None,) * (x.ndim - len(sharding.spec))
    return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(*spec[1:]))


def _is_variable(x) -> bool:
    return isinstance(x, nnx.Variable)
