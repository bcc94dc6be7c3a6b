"""Meshes and logical-axis rules: the only module that names mesh axes.

Every parameter of the models carries *logical* axis names (`vocab`, `embed`, `mlp`, `heads`, `kv_heads`,
`head_dim`); this module maps them onto the mesh axes `data`, `fsdp` and `tensor`, in the spirit of MaxText's
logical axis rules. Models are built inside `model_context(mesh)`:

- `mesh=None` (single device, tests, laptops): flax's eager sharding is switched off, so the logical names stay as
  metadata and arrays live on the default device.
- a mesh: the rules below translate logical names to mesh axes and flax shards every variable as it is created.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import jax
from flax import nnx

MESH_AXES = ("data", "fsdp", "tensor")

# Logical axis -> mesh axis (or None: replicated). Parameters are sharded over `fsdp` along their embedding axis
# and over `tensor` along heads / mlp / vocab (Megatron-style); activations' batch axis over data and fsdp.
LOGICAL_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("norm", None),
)


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1, devices: Sequence[jax.Device] | None = None
              ) -> jax.sharding.Mesh:
    """A `(data, fsdp, tensor)` mesh over `data * fsdp * tensor` devices (all local+remote devices by default).

    Use -1 for at most one axis to take the remaining devices.
    """
    devices = list(devices) if devices is not None else jax.devices()
    shape = [data, fsdp, tensor]
    if shape.count(-1) > 1:
        raise ValueError(f"mesh shape {tuple(shape)}: at most one axis may be -1")
    if -1 in shape:
        known = 1
        for s in shape:
            known *= s if s != -1 else 1
        shape[shape.index(-1)] = len(devices) // known
    total = shape[0] * shape[1] * shape[2]
    if total != len(devices):
        raise ValueError(f"mesh shape data={shape[0]} fsdp={shape[1]} tensor={shape[2]} needs {total} devices, "
                         f"but {len(devices)} are available; change the mesh sizes so their product is {len(devices)}")
    return jax.make_mesh(tuple(shape), MESH_AXES, devices=devices)


@contextlib.contextmanager
def model_context(mesh: jax.sharding.Mesh | None = None) -> Iterator[None]:
    """Context in which models are created: sharded over `mesh` by the logical rules, or unsharded if None."""
    if mesh is None:
        with nnx.use_eager_sharding(False):
            yield
    else:
        with jax.set_mesh(mesh), nnx.logical_axis_rules(LOGICAL_RULES):
            yield


def param(value: jax.Array, names: Sequence[str | None]) -> nnx.Param:
    """A parameter carrying logical axis `names`; sharded eagerly only when created under a mesh (`model_context`),
    so that models can also be built plainly, without a mesh, on one device."""
    eager = nnx.using_eager_sharding() and not jax.sharding.get_abstract_mesh().empty
    return nnx.Param(value, sharding_names=tuple(names), eager_sharding=eager)


def logical_to_sharding(names: Sequence[str | None] | None, mesh: jax.sharding.Mesh
                        ) -> jax.sharding.NamedSharding:
    """NamedSharding for an array whose axes carry the logical `names` (None or empty: replicated)."""
    rules = dict(LOGICAL_RULES)
    spec = [rules.get(n) if n is not None else None for n in (names or ())]
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))
