"""The learner: one jit-compiled, donated optimizer update per minibatch, for any loss over a `Decoder`.

A loss function is `loss_fn(model, batch) -> (loss, metrics)`: a scalar loss to minimise and a dict of scalar
metrics. `metrics` may hold `"weight"`, the denominator of the loss's mean over the batch (tokens, sequences,
pairs); a minibatch split into micro-batches (`micro_batch_size`) then gets exactly the loss, gradient and metrics
of the whole minibatch: the micro-batches' gradients and losses are accumulated weighted by it, in one `lax.scan`
inside the step, and so is each metric unless the loss function's `reductions` attribute (a dict) names another
way for it: `"sum"`, `"min"`, `"max"`, or the name of the metric that weighs its mean (a token mean weighed by the
micro-batch's token count). Without `"weight"` micro-batches weigh by their rows.

One `update(batch)` call is one jitted program: forward, backward, accumulation, the skip of a non-finite update
(loss or gradient NaN / inf: parameters and optimizer state stay as they were, `skipped` = 1), the optax update.
Parameter and optimizer buffers are donated (updated in place) and keep their shardings (the optimizer state is
sharded like the parameters, gradients follow); the model object is pointed at the new parameters, so samplers
holding it see them. Batches come as arrays with their rows over `(data, fsdp)` (`rrc_jax.sharding.put_batch`).
Metrics stay on device until the caller reads them.

On a mesh with `data` replicas (across slices by default, `rrc_jax.sharding.MeshConfig.dcn`), where
`rrc_jax.sharding.replica_sums` allows (no tensor parallelism, micro-batches that divide a replica's rows), each
replica computes (and accumulates) its own rows' sums (`jax.shard_map` over `data`, `fsdp` and `tensor` left to XLA),
a micro-batch taking every device's share of the replica's rows, and the replicas' sums are reduced once per update:
each gradient shard crosses the data axis (the data-center network) once per update, whatever the micro-batches.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import ClassVar

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from rrc_jax.models import Decoder
from rrc_jax.models.lora import trainable
from rrc_jax.settings import at_least, field_error, one_of, unset
from rrc_jax.sharding import constrain, mesh_of, replica_sums

LossFn = Callable[[Decoder, dict], tuple[jax.Array, dict]]
SCHEDULES = ("constant", "cosine")


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    """How a step's rollouts are learned from (`rl`): `mu` passes of minibatch AdamW updates, their memory
    (micro-batches, remat, log-prob chunks) and the learning rate."""

    GROUP: ClassVar[str] = "rl"
    mu: int = 1  # passes over each step's rollouts
    minibatch_size: int = 64  # sequences per optimizer update
    micro_batch_size: int = 0  # > 0: gradient accumulation and log-prob passes in micro-batches of this many rows
    # recompute each decoder block in the backward pass (activation memory ~ 1 layer); unset: the plan chooses
    # (`rrc_jax.plan.remat_choice`: off unless the run does not fit its devices without it)
    remat: bool | None = unset(bool)
    logprob_chunk: int = 128  # positions per chunk of the LM head + log-softmax ([rows, chunk, vocab] at a time)
    learning_rate: float = 2e-4  # toy scale; the paper: 1e-6
    lr_schedule: str = "constant"  # or "cosine"
    warmup_steps: int = 0
    grad_clip: float = 1.0

    def __post_init__(self):
        at_least("rl", "mu", self.mu, 1)
        at_least("rl", "minibatch_size", self.minibatch_size, 1)
        if self.micro_batch_size < 0 or (self.micro_batch_size and self.minibatch_size % self.micro_batch_size):
            raise field_error("rl", "micro_batch_size", f"{self.micro_batch_size} must divide rl.minibatch_size="
                              f"{self.minibatch_size} (0 = no gradient accumulation)")
        at_least("rl", "logprob_chunk", self.logprob_chunk, 1)
        one_of("rl", "lr_schedule", self.lr_schedule, SCHEDULES)
        for name in ("learning_rate", "grad_clip"):
            if not getattr(self, name) > 0:  # also NaN
                raise field_error("rl", name, f"{getattr(self, name)} must be > 0")
        at_least("rl", "warmup_steps", self.warmup_steps, 0)

    def updates(self, rows: int, steps: int = 1) -> int:
        """Optimizer updates of `steps` steps of `rows` rollouts each."""
        return steps * self.mu * (rows // self.minibatch_size)


def learning_rate_schedule(peak: float, *, curve: str = "constant", warmup_steps: int = 0, total_steps: int = 1,
                           end_fraction: float = 0.0) -> optax.Schedule | float:
    """`curve` 'constant' (after a linear warm-up of `warmup_steps`, if any) or 'cosine' (linear warm-up, then
    cosine decay to `end_fraction * peak` at `total_steps`)."""
    if curve == "cosine":
        return optax.warmup_cosine_decay_schedule(0.0, peak, max(warmup_steps, 1), max(total_steps, 2),
                                                  end_value=peak * end_fraction)
    if curve != "constant":
        raise ValueError(f"learning-rate schedule {curve!r}: use 'constant' or 'cosine'")
    return optax.linear_schedule(0.0, peak, warmup_steps) if warmup_steps else peak


def make_optimizer(learning_rate: float | optax.Schedule, *, grad_clip: float = 1.0, weight_decay: float = 0.0
                   ) -> optax.GradientTransformation:
    """AdamW after global-norm gradient clipping: the optimizer of every trainer (GRPO, SFT, Bradley-Terry)."""
    return optax.chain(optax.clip_by_global_norm(grad_clip), optax.adamw(learning_rate, weight_decay=weight_decay))


def _rows(batch: dict) -> int:
    return jax.tree.leaves(batch)[0].shape[0]


def _weighted_loss_and_grads(params, rest, batch, *, graphdef, loss_fn):
    def f(p):
        return loss_fn(nnx.merge(graphdef, p, rest), batch)

    (loss, metrics), grads = jax.value_and_grad(f, has_aux=True)(params)
    metrics = dict(metrics)
    weight = jnp.asarray(metrics.pop("weight", _rows(batch)), jnp.float32)
    return weight, loss, metrics, grads


def _accumulate(step, params, rest, micro, reductions: dict[str, str], reduce=None):
    """The loss, metrics and gradients of a minibatch from those of its micro-batches `micro` (`[n, rows, ...]`
    arrays), each combined as the module docstring says; `reduce(sums, how)` ('sum', 'min', 'max') combines the
    accumulated sums with other replicas' before the means (`_replica_accumulate`)."""
    def init(name, shape):
        fill = {"min": jnp.inf, "max": -jnp.inf}.get(reductions.get(name), 0.0)
        return jnp.full(shape.shape, fill, shape.dtype)

    def body(carry, mb):
        total, loss_acc, grad_acc, sums, weights = carry
        w, loss, metrics, grads = step(params, rest, mb)
        sums, weights = dict(sums), dict(weights)
        for name, v in metrics.items():
            how = reductions.get(name)
            if how == "sum":
                sums[name] = sums[name] + v
            elif how in ("min", "max"):
                sums[name] = (jnp.minimum if how == "min" else jnp.maximum)(sums[name], v)
            else:
                mw = w if how is None else metrics[how]
                sums[name], weights[name] = sums[name] + mw * v, weights[name] + mw
        return (total + w, loss_acc + w * loss, jax.tree.map(lambda a, g: a + w * g, grad_acc, grads), sums,
                weights), None

    first = jax.tree.map(lambda x: x[0], micro)
    _, loss_shape, metric_shapes, grad_shapes = jax.eval_shape(lambda mb: step(params, rest, mb), first)
    zeros = lambda tree: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), tree)
    sums = {k: init(k, v) for k, v in metric_shapes.items()}
    weights = {k: jnp.zeros((), jnp.float32) for k in metric_shapes if reductions.get(k) not in ("sum", "min", "max")}
    (total, loss, grads, sums, weights), _ = jax.lax.scan(
        body, (jnp.zeros((), jnp.float32), zeros(loss_shape), zeros(grad_shapes), sums, weights), micro)
    if reduce is not None:  # one reduction of every replica's sums
        total, loss, grads, weights = reduce((total, loss, grads, weights), "sum")
        sums = {k: reduce(v, reductions.get(k) if reductions.get(k) in ("min", "max") else "sum")
                for k, v in sums.items()}
    mean = lambda a, t: jnp.where(t > 0, a / jnp.maximum(t, 1e-30), 0.0)
    metrics = {k: mean(v, weights[k]) if k in weights else v for k, v in sums.items()}
    return mean(loss, total), metrics, jax.tree.map(lambda g: mean(g, total), grads)


def _replica_accumulate(step, params, rest, batch, reductions: dict[str, str], n_micro: int, mesh):
    """`_accumulate` inside each of `mesh`'s `data` replicas (`jax.shard_map` manual over `data` only): a replica's
    rows `[rows / data, ...]` cut into `n_micro` strided micro-batches (micro-batch i: its rows i, i + n_micro, ...,
    so that each takes every device's share), their sums reduced over the replicas once (`psum`, `pmin`, `pmax`)."""
    ops = {"sum": jax.lax.psum, "min": jax.lax.pmin, "max": jax.lax.pmax}

    def local(params, rest, rows):
        micro = jax.tree.map(lambda x: jnp.swapaxes(x.reshape(-1, n_micro, *x.shape[1:]), 0, 1), rows)
        return _accumulate(step, params, rest, micro, reductions, lambda x, how: ops[how](x, "data"))

    P = jax.sharding.PartitionSpec
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P("data")), out_specs=P(), axis_names={"data"},
                         check_vma=False)(params, rest, batch)


def _update(params, opt_state, rest, batch, *, graphdef, tx, loss_fn, n_micro, mesh=None):
    step = functools.partial(_weighted_loss_and_grads, graphdef=graphdef, loss_fn=loss_fn)
    reductions = getattr(loss_fn, "reductions", {})
    if mesh is not None and replica_sums(mesh.shape["data"], mesh.shape["tensor"], _rows(batch), n_micro):
        loss, metrics, grads = _replica_accumulate(step, params, rest, batch, reductions, n_micro, mesh)
    elif n_micro == 1:
        _, loss, metrics, grads = step(params, rest, batch)
    else:
        micro = jax.tree.map(lambda x: x.reshape(n_micro, -1, *x.shape[1:]), batch)
        loss, metrics, grads = _accumulate(step, params, rest, micro, reductions)
    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

    def apply(_):
        updates, new_opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new_opt_state

    params, opt_state = jax.lax.cond(finite, apply, lambda _: (params, opt_state), None)
    return params, opt_state, {"loss": loss, **metrics, "grad_norm": grad_norm,
                               "skipped": (~finite).astype(jnp.int32)}


class Learner:
    """Trains `model`'s `nnx.Param`s (under LoRA its adapters only, `rrc_jax.models.lora.trainable`: the frozen base
    is neither differentiated nor updated, nor held by the optimizer) with `tx` on `loss_fn`.

    Args:
      model: the `Decoder` (updated in place: it always holds the current parameters).
      tx: an optax transformation (`make_optimizer`).
      loss_fn: `loss_fn(model, batch) -> (loss, metrics)` (module docstring).
      micro_batch_size: rows per micro-batch (gradient accumulation); 0 = the whole minibatch at once. It must
        divide every minibatch given to `update`.
    """

    def __init__(self, model: Decoder, tx: optax.GradientTransformation, loss_fn: LossFn, *,
                 micro_batch_size: int = 0):
        if micro_batch_size < 0:
            raise ValueError(f"micro_batch_size={micro_batch_size} must be >= 0 (0 = no accumulation)")
        self.model = model
        self.micro_batch_size = micro_batch_size
        self.trainable = trainable(model)
        graphdef, params, self._rest = nnx.split(model, self.trainable, ...)
        # committed to the devices they are on, as the update's outputs are: otherwise the first call (uncommitted
        # inputs) and every later one (committed) would be two programs, compiled twice
        commit = lambda tree: jax.tree.map(lambda x: jax.device_put(x, x.sharding), tree)
        params = commit(params)
        nnx.update(model, params)
        self.opt_state = commit(tx.init(params))  # each moment sharded like its parameter
        shardings = lambda tree: jax.tree.map(lambda x: x.sharding, tree)
        self._update = jax.jit(functools.partial(_update, graphdef=graphdef, tx=tx, loss_fn=loss_fn,
                                                 mesh=mesh_of(model)),
                               static_argnames=("n_micro",), donate_argnums=(0, 1),
                               out_shardings=(shardings(params), shardings(self.opt_state), None))

    @property
    def params(self) -> nnx.State:
        return nnx.state(self.model, self.trainable)

    def update(self, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
        """One optimizer step on `batch` (a dict of `[rows, ...]` arrays); returns its metrics on device: the
        loss, the loss function's metrics, `grad_norm` and `skipped` (1 when the update was not finite)."""
        rows, micro = _rows(batch), self.micro_batch_size or _rows(batch)
        if rows % micro:
            raise ValueError(f"micro_batch_size={micro} must divide the minibatch of {rows} rows")
        params, self.opt_state, metrics = self._update(self.params, self.opt_state, self._rest, batch,
                                                       n_micro=rows // micro)
        nnx.update(self.model, params)
        return metrics

    def state(self) -> dict:
        """What a checkpoint holds: `params` (a pure dict) and `opt` (the optimizer state's leaves, in order)."""
        return {"params": nnx.to_pure_dict(self.params), "opt": jax.tree.leaves(self.opt_state)}

    def load_state(self, state: dict) -> None:
        """Set parameters and optimizer state from `state()`'s layout (e.g. restored by Orbax)."""
        params = self.params
        nnx.replace_by_pure_dict(params, state["params"])
        nnx.update(self.model, params)
        treedef = jax.tree.structure(self.opt_state)
        if treedef.num_leaves != len(state["opt"]):
            raise ValueError(f"the optimizer state holds {treedef.num_leaves} arrays, the checkpoint "
                             f"{len(state['opt'])}: it was written with another optimizer")
        self.opt_state = jax.tree.unflatten(treedef, list(state["opt"]))


@functools.partial(jax.jit, static_argnums=(0,), static_argnames=("temperature", "chunk_size", "n_micro"))
def _token_logprobs(graphdef, state, ids, mask, *, temperature, chunk_size, n_micro):
    model = nnx.merge(graphdef, state)
    rows = lambda x: x.reshape(n_micro, -1, *x.shape[1:])
    out = jax.lax.map(lambda mb: model.token_logprobs(*mb, temperature=temperature, chunk_size=chunk_size),
                      (rows(ids), rows(mask)))
    return constrain(out.reshape(ids.shape), ("batch", None))


def token_logprobs(model: Decoder, ids: jax.Array, mask: jax.Array, temperature: float = 1.0, *,
                   micro_batch_size: int = 0, chunk_size: int = 128) -> jax.Array:
    """`model.token_logprobs(ids, mask, temperature=...)` `[B, T]`, jit-compiled (no gradient), over micro-batches
    of `micro_batch_size` rows one after another (0: all rows at once; it must divide B) so that only one
    micro-batch's activations are live."""
    b = ids.shape[0]
    micro = micro_batch_size or b
    if b % micro:
        raise ValueError(f"micro_batch_size={micro} must divide the {b} rows")
    graphdef, state = nnx.split(model)
    return _token_logprobs(graphdef, state, jnp.asarray(ids), jnp.asarray(mask), temperature=float(temperature),
                           chunk_size=int(chunk_size), n_micro=b // micro)
