"""Meshes and logical-axis rules: the only module that names mesh axes.

Every parameter of the models carries *logical* axis names (`vocab`, `embed`, `mlp`, `heads`, `kv_heads`,
`head_dim`); this module maps them onto the mesh axes `data`, `fsdp` and `tensor`, in the spirit of MaxText's
logical axis rules. Models are built inside `model_context(mesh)`:

- `mesh=None` (single device, tests, laptops): flax's eager sharding is switched off, so the logical names stay as
  metadata and arrays live on the default device.
- a mesh: the rules below translate logical names to mesh axes and flax shards every variable as it is created.

Axis types: meshes are built with **Auto** axes (`jax.sharding.AxisType.Auto`), deliberately. The parameters,
batches and caches are placed by the logical rules and every jitted step keeps its inputs' shardings; inside a
step XLA's sharding propagation (GSPMD) places the intermediates, steered by `constrain` on logical names. With
Explicit axes (`jax.make_mesh`'s default) every gather, scatter and dynamic update whose operands are sharded on
different axes must be resharded by hand: the embedding lookup (`vocab` over `tensor`, ids over `batch`) and the
KV-cache update raise `ShardingTypeError`, and each fix would be a special case in model code that must also run
on one device.

Several slices (`MeshConfig.dcn`): a TPU slice's chips are joined by ICI, slices by the data-center network (DCN), an
order of magnitude slower. The mesh is then JAX's hybrid mesh (`hybrid_mesh`): `mesh.data/fsdp/tensor` are the axes'
sizes inside a slice, `mesh.dcn` their sizes across slices, each mesh axis slices-outermost. By default (`auto`) the
slices are `data` replicas: the parameters and optimizer state are sharded inside each slice (FSDP, tensor), a row's
activations never leave its slice, and the one collective over DCN is the gradients' all-reduce, once per update
(where `replica_sums`). The inference layout (the rollout copy, the GRM, the DRM) keeps `tensor` inside a host of one
slice and spreads rows across slices (`inference_mesh`), so that decoding sends nothing over DCN and resharding the
master into the rollout copy gathers from the copy each slice holds.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
from collections.abc import Iterator, Sequence
from typing import ClassVar

import jax
import numpy as np
from absl import logging
from flax import nnx
from jax.experimental import mesh_utils, multihost_utils

from rrc_jax import distributed
from rrc_jax.errors import ConfigError

MESH_AXES = ("data", "fsdp", "tensor")

# Logical axis -> mesh axis (or None: replicated). Parameters are sharded over `fsdp` along their embedding axis
# and over `tensor` along heads / mlp / vocab (Megatron-style); activations' batch axis over data and fsdp.
LOGICAL_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("norm", None),
    ("layers", None),  # stacked decoder layers: every device holds every layer's part
    ("lora_rank", "fsdp"),  # a LoRA adapter's rank axis (`rrc_jax.models.lora`); in A, after embed: replicated
)


# The inference layout (the policy's rollout copy, the GRM, the DRM): parameters over `tensor` only (heads, kv heads,
# mlp, vocab) and replicated over the row axes, so that no decoding step gathers a weight; what crosses chips per
# token is activations (an all-reduce of `[rows, embed]` after the attention and MLP outputs of each layer).
INFERENCE_RULES = tuple((name, None if name in ("embed", "lora_rank") else axes) for name, axes in LOGICAL_RULES)
LAYOUTS = {"train": LOGICAL_RULES, "inference": INFERENCE_RULES}

# The roles a run's models play: the policy (trained), and the frozen reference, GRM and DRM, each held in a layout
# of its own (`MeshConfig`: the policy's master in `train`, a frozen role in its `mesh.<role>` field's). Samplers
# (`rrc_jax.inference.factory`), the run's models (`rrc_jax.rl.roles.Roles`) and the reward constructions name them.
ROLES = ("policy", "reference", "grm", "drm")
FROZEN_ROLES = ROLES[1:]
REWARD_ROLES = ("grm", "drm")  # the reward's models: on devices of their own with `mesh.judge_devices`


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where one role's parameters live: a `mesh` (None: one device, unsharded) and the logical-axis rules of
    `kind` that place them on it (`LAYOUTS`: `train`, FSDP x tensor, or `inference`, tensor-parallel only).

    An axis whose size its mesh axes do not divide is replicated (kv heads fewer than `tensor`: Llama-3-8B's 8 kv
    heads on 16-way tensor parallelism), as is an axis whose mesh axis an earlier axis of the array already uses.
    """

    mesh: jax.sharding.Mesh | None = None
    name: str = "train"  # a key of LAYOUTS

    def __post_init__(self):
        if self.name not in LAYOUTS:
            raise ValueError(f"layout {self.name!r}: known layouts are {', '.join(LAYOUTS)}")

    @property
    def rules(self) -> tuple:
        return LAYOUTS[self.name]

    def spec(self, names: Sequence[str | None] | None, shape: Sequence[int]) -> jax.sharding.PartitionSpec:
        """The PartitionSpec of an array of `shape` whose axes carry the logical `names`."""
        sizes = dict(self.mesh.shape) if self.mesh is not None else {}
        return _partition_spec(partition(names, shape, self.rules, sizes))

    def sharding(self, names: Sequence[str | None] | None, shape: Sequence[int]) -> jax.sharding.NamedSharding:
        """The NamedSharding of an array of `shape` with logical axis `names` (needs a mesh)."""
        return jax.sharding.NamedSharding(self.mesh, self.spec(names, shape))

    @property
    def devices(self) -> int:
        return 1 if self.mesh is None else self.mesh.size


def partition(names: Sequence[str | None] | None, shape: Sequence[int], rules: tuple,
              sizes: dict[str, int]) -> list[tuple[str, ...]]:
    """The mesh axes each axis of an array of `shape` with logical `names` is split over, by `rules`, on a mesh of
    axis `sizes`: none where its mesh axes do not divide it (replicated) or an earlier axis already uses them."""
    rules, used, out = dict(rules), set(), []
    for size, name in zip(shape, tuple(names or ()) + (None,) * (len(shape) - len(names or ()))):
        axes = rules.get(name) if name is not None else None
        parts = tuple(a for a in ((axes,) if isinstance(axes, str) else tuple(axes or ())) if a not in used
                      and (not sizes or a in sizes))  # (an axis the mesh lacks, or holds manually: none)
        n = 1
        for a in parts:
            n *= sizes.get(a, 1)
        keep = bool(parts) and size % n == 0
        out.append(parts if keep else ())
        used.update(parts if keep else ())
    return out


def _partition_spec(parts: list[tuple[str, ...]]) -> jax.sharding.PartitionSpec:
    """The PartitionSpec of `partition`'s mesh axes per array axis."""
    return jax.sharding.PartitionSpec(*[(p if len(p) > 1 else p[0]) if p else None for p in parts])


def inference_tensor(devices: int, host_devices: int, num_heads: int) -> int:
    """`auto`'s tensor size: the most devices that divide `devices`, fit on one host and divide `num_heads`."""
    return max(t for t in range(1, max(1, host_devices) + 1) if devices % t == 0 and num_heads % t == 0)


def inference_mesh(mesh: jax.sharding.Mesh, shape: str = "auto", num_heads: int = 1) -> jax.sharding.Mesh:
    """The mesh of the inference layout over the devices of `mesh`, in their order (so that arrays of both layouts
    meet in one program): `shape` `DATA,FSDP,TENSOR` (-1: the remaining devices; the product must be the mesh's
    size, `inference_shape`), or `auto`: tensor over the largest number of devices that divides the mesh, fits on
    one host (a host's chips share the fastest links) and divides `num_heads`, rows over the rest (`data`).

    On several slices (the devices' `slice_index`) it is a hybrid mesh, rows across slices and each slice's rows and
    tensor inside it; a shape whose `tensor` or rows within a slice do not divide a slice's devices is refused."""
    devices = list(mesh.devices.flat)
    if shape != "auto":
        data, fsdp, tensor = inference_shape(shape, len(devices))
    else:
        tensor = inference_tensor(len(devices), len(devices) // jax.process_count(), num_heads)
        data, fsdp = len(devices) // tensor, 1
    groups = device_slices(devices, by_process=False)
    if len(groups) == 1:
        return make_mesh(data, fsdp, tensor, devices=devices)
    per = len(devices) // len(groups)
    if per % (tensor * fsdp):
        raise ConfigError(f"config.mesh.inference={shape}: tensor={tensor} x fsdp={fsdp} must divide a slice's "
                          f"{per} devices, so that no decoding step crosses the data-center network")
    return hybrid_mesh((per // (tensor * fsdp), fsdp, tensor), (len(groups), 1, 1), devices, by_process=False)


def inference_shape(shape: str, devices: int) -> tuple[int, int, int]:
    """`mesh.inference`'s `DATA,FSDP,TENSOR` resolved on the training mesh's `devices`: its product must be exactly
    `devices` (the inference layout spans the same devices), else a one-line `ConfigError`."""
    try:
        data, fsdp, tensor = (int(v) for v in shape.split(","))
    except ValueError:
        raise ConfigError(f"config.mesh.inference: {shape!r}; give 'auto' or three sizes DATA,FSDP,TENSOR, e.g. "
                          "-1,1,4") from None
    return mesh_shape(data, fsdp, tensor, devices, name="config.mesh.inference", exact=True)


def use_mesh(mesh: jax.sharding.Mesh | None):
    """`jax.set_mesh(mesh)` (a program's activations are then placed by the logical rules on `mesh`), or nothing
    without one."""
    return jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext()


def mesh_shape(data: int, fsdp: int, tensor: int, devices: int, *, name: str = "mesh",
               exact: bool = False, unit: str = "devices") -> tuple[int, int, int]:
    """`(data, fsdp, tensor)` on `devices` devices (or other `unit`s: slices), a -1 (at most one) taking the
    remaining ones. A one-line `ConfigError` naming `name` when a size is not >= 1, when the other sizes' product
    does not divide the devices a -1 shares, or when the product exceeds `devices` (with `exact`, differs from
    it)."""
    shape = [data, fsdp, tensor]
    given = f"{name} data={data} fsdp={fsdp} tensor={tensor}"
    if shape.count(-1) > 1 or any(n == 0 or n < -1 for n in shape):
        raise ConfigError(f"{given}: sizes are >= 1, and at most one is -1 (the remaining {unit})")
    if -1 in shape:
        known = math.prod(n for n in shape if n != -1)
        if devices % known:
            raise ConfigError(f"{given}: the -1 axis takes the {unit} the others leave, but their product {known} "
                              f"does not divide the {devices} {unit}; make it a divisor of {devices}")
        shape[shape.index(-1)] = devices // known
    total = math.prod(shape)
    if total > devices or (exact and total != devices):
        where = "available" if total > devices else ("in the training mesh" if unit == "devices" else "found")
        raise ConfigError(f"{given} needs {total} {unit}, but {devices} are {where}; make their product {devices} "
                          "(or set one of them to -1)")
    return shape[0], shape[1], shape[2]


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1, devices: Sequence[jax.Device] | None = None
              ) -> jax.sharding.Mesh:
    """A `(data, fsdp, tensor)` mesh with Auto axes over `data * fsdp * tensor` devices (all local and remote
    devices by default).

    Use -1 for at most one axis to take the remaining devices (`mesh_shape`). A mesh of fewer devices than there are
    uses the first ones (with a warning).
    """
    devices = list(devices) if devices is not None else jax.devices()
    shape = mesh_shape(data, fsdp, tensor, len(devices))
    total = math.prod(shape)
    if total < len(devices):
        logging.warning("mesh data=%d fsdp=%d tensor=%d uses %d of the %d devices", *shape, total, len(devices))
        devices = devices[:total]
    return jax.make_mesh(shape, MESH_AXES, devices=devices,
                         axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES))


def device_slice(device, by_process: bool) -> int:
    """The slice of `device`: a TPU's `slice_index`; elsewhere (CPU, GPU hosts, whose index is always 0) its process
    with `by_process` (each host a slice of its own, joined by the data-center network), else 0 (one slice)."""
    if device.platform == "tpu":
        return int(getattr(device, "slice_index", 0))
    return device.process_index if by_process else 0


def device_slices(devices: Sequence, by_process: bool) -> list[list]:
    """`devices` grouped by slice (`device_slice`), slices in index order, each in the devices' order."""
    groups: dict[int, list] = collections.defaultdict(list)
    for d in devices:
        groups[device_slice(d, by_process)].append(d)
    return [groups[k] for k in sorted(groups)]


def dcn_shape(value: str, slices: int) -> tuple[int, int, int]:
    """`mesh.dcn` resolved on `slices` slices: `auto` is `(slices, 1, 1)` (data parallel across slices); else
    DATA,FSDP,TENSOR with a -1 taking the remaining slices, whose product must be `slices` (a `ConfigError` naming
    what was found otherwise)."""
    if value == "auto":
        return slices, 1, 1
    data, fsdp, tensor = (int(v) for v in value.split(","))
    return mesh_shape(data, fsdp, tensor, slices, name=f"config.mesh.dcn={value}: across slices,", exact=True,
                      unit="slices")


def hybrid_devices(ici: Sequence[int], dcn: Sequence[int], devices: Sequence, by_process: bool) -> np.ndarray:
    """`[ici[0] * dcn[0], ici[1] * dcn[1], ici[2] * dcn[2]]` devices: `ici` sizes inside each slice and `dcn` sizes
    across slices, slices outermost on every axis (`mesh_utils.create_hybrid_device_mesh`, each slice's block laid
    out by its own physical topology): index `i` of axis `a` lies in slice block `i // ici[a]`. Slices are the
    devices' `slice_index` on TPU, else with `by_process` their processes. A `ConfigError` when the slices are not
    `prod(dcn)` of `prod(ici)` devices each."""
    groups = device_slices(devices, by_process)
    sizes = sorted({len(g) for g in groups})
    if len(sizes) > 1:
        raise ConfigError(f"config.mesh.dcn: the slices hold {', '.join(str(len(g)) for g in groups)} devices; a mesh "
                          "across slices needs slices of one shape (create them with the same accelerator type)")
    if len(groups) != math.prod(dcn) or sizes[0] != math.prod(ici):
        raise ConfigError(f"config.mesh.dcn: {tuple(dcn)} across slices x {tuple(ici)} inside each needs "
                          f"{math.prod(dcn)} slices of {math.prod(ici)} devices, but the devices are {len(groups)} "
                          f"slices of {sizes[0]}")
    return mesh_utils.create_hybrid_device_mesh(ici, dcn, list(devices),
                                                process_is_granule=devices[0].platform != "tpu")


def hybrid_mesh(ici: Sequence[int], dcn: Sequence[int], devices: Sequence, by_process: bool) -> jax.sharding.Mesh:
    """The `(data, fsdp, tensor)` mesh with Auto axes of `hybrid_devices`."""
    return jax.sharding.Mesh(hybrid_devices(ici, dcn, devices, by_process), MESH_AXES,
                             axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES))


def replica_sums(data: int, tensor: int, rows: int, n_micro: int) -> bool:
    """Whether the learner's update of `rows` rows in `n_micro` micro-batches sums each of `data` replicas' rows on
    its own and reduces the sums over `data` once (`rrc_jax.rl.learner`): with data replicas, no tensor parallelism
    (with `tensor` > 1 XLA's SPMD partitioner fails a check partitioning the embedding's gather inside a program
    manual over `data` alone, jax 0.10) and a replica's rows dividing into the micro-batches. Otherwise XLA reduces
    every micro-batch's gradients over `data`."""
    return data > 1 and tensor == 1 and rows % (data * n_micro) == 0


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """A run's device mesh (`mesh`): parameters over fsdp x tensor, batches over data x fsdp; -1 (at most one
    axis) takes the remaining devices."""

    GROUP: ClassVar[str] = "mesh"
    data: int = 1
    fsdp: int = -1
    tensor: int = 1
    # The inference layout's mesh over the same devices: 'auto' (tensor over a host's devices, as many as divide
    # the heads; rows over the rest) or DATA,FSDP,TENSOR (`inference_mesh`). The policy's rollout copy uses it
    # (unless rl.share_weights), and each frozen role below whose layout is 'inference'.
    inference: str = "auto"
    reference: str = "train"  # its log-prob passes run beside the learner's, on the same rows
    grm: str = "inference"
    drm: str = "inference"
    # > 0: the last `judge_devices` devices hold the reward's models (GRM, DRM; `auto` inference layout) and the
    # training mesh the others, so that the judge's programs run beside the policy's (`rl.max_staleness`,
    # `rrc_jax.rl.pipeline`); 0: every model spans every device. One host only: on several slices the judge is
    # served from slices of its own (launch/README.md).
    judge_devices: int = 0
    # The axes' sizes across slices (`hybrid_mesh`; data, fsdp and tensor above are then inside each slice):
    # 'auto' = data parallel over every slice the devices report (TPU `slice_index`; one slice elsewhere), or
    # DATA,FSDP,TENSOR (-1: the remaining slices; on devices without a slice index each process is a slice).
    # Tensor stays inside a slice; FSDP across slices gathers every layer's weights over DCN (the planner's
    # `--slices` counts it).
    dcn: str = "auto"

    def __post_init__(self):
        sizes = (self.data, self.fsdp, self.tensor)
        if sizes.count(-1) > 1 or any(n == 0 or n < -1 for n in sizes):
            raise ConfigError(f"config.mesh: data={self.data} fsdp={self.fsdp} tensor={self.tensor}: sizes are >= 1, "
                              "and at most one is -1 (the remaining devices)")
        for role in FROZEN_ROLES:
            if getattr(self, role) not in LAYOUTS:
                raise ConfigError(f"config.mesh.{role}: {getattr(self, role)!r}; use one of {', '.join(LAYOUTS)}")
        if self.inference != "auto" and not _is_shape(self.inference):
            raise ConfigError(f"config.mesh.inference: {self.inference!r}; give 'auto' or three sizes "
                              "DATA,FSDP,TENSOR, e.g. -1,1,4")
        if self.judge_devices < 0:
            raise ConfigError(f"config.mesh.judge_devices: {self.judge_devices} must be >= 0 (0: the judge shares "
                              "every device)")
        if self.dcn != "auto" and not _is_shape(self.dcn):
            raise ConfigError(f"config.mesh.dcn: {self.dcn!r}; give 'auto' (data parallel across slices) or three "
                              "sizes DATA,FSDP,TENSOR across slices, e.g. 2,1,1")
        if self.dcn != "auto" and int(self.dcn.split(",")[2]) != 1:
            raise ConfigError(f"config.mesh.dcn: {self.dcn!r} puts tensor parallelism across slices, whose "
                              "all-reduces run twice a layer on every forward pass: keep tensor 1 across slices "
                              "(data or fsdp there)")

    def _split(self) -> tuple[list[jax.Device], list[jax.Device]]:
        """(the training mesh's devices, the judge's): `judge_devices` of its own last, on one host."""
        devices, n = jax.devices(), self.judge_devices
        if not n:
            return devices, []
        if jax.process_count() > 1:
            raise ConfigError("config.mesh.judge_devices: the judge on devices of its own runs on one host; on "
                              "several hosts or slices, serve it on slices of its own (launch/README.md) and set "
                              "inference.engine='openai'")
        if n >= len(devices):
            raise ConfigError(f"config.mesh.judge_devices={n} leaves none of the {len(devices)} devices to the "
                              f"policy; give at most {len(devices) - 1}")
        return devices[:-n], devices[-n:]

    def slices(self, devices: Sequence) -> list[list]:
        """The slices of `devices` this config's mesh spans (`device_slices`; by process only with `dcn` given)."""
        return device_slices(devices, by_process=self.dcn != "auto")

    def make(self) -> jax.sharding.Mesh:
        """The training mesh (without the judge's own devices): on one slice `data x fsdp x tensor`, on several the
        hybrid mesh of those sizes inside each slice and `dcn`'s across (`hybrid_mesh`); with `inference` checked
        against its devices (on one device too, where no layout uses it), so that a shape that cannot span them is
        refused before anything loads."""
        devices = self._split()[0]
        groups = self.slices(devices)
        dcn = dcn_shape(self.dcn, len(groups))
        if math.prod(dcn) == 1:
            mesh = make_mesh(self.data, self.fsdp, self.tensor, devices=devices)
        else:
            ici = mesh_shape(self.data, self.fsdp, self.tensor, len(groups[0]), name="config.mesh (inside a slice)",
                             exact=True)
            mesh = hybrid_mesh(ici, dcn, devices, by_process=self.dcn != "auto")
        if self.inference != "auto":
            inference_shape(self.inference, mesh.size)
        return mesh

    def judge_mesh(self) -> jax.sharding.Mesh | None:
        """The devices of the reward's models with `judge_devices` (one axis, `fsdp`), else None."""
        own = self._split()[1]
        return make_mesh(1, len(own), 1, devices=own) if own else None

    def layout_name(self, role: str, devices: int) -> str:
        """The name of `role`'s layout on `devices` devices: the policy's master `train`, a frozen role its field;
        on one device `train` (the layouts place nothing differently there)."""
        return "train" if role == "policy" or devices == 1 else getattr(self, role)

    def layout(self, role: str, mesh: jax.sharding.Mesh, num_heads: int, name: str | None = None) -> Layout:
        """The layout of `role` (`layout_name(role)`) or the layout `name`, over the devices of the training `mesh`
        (the reward's models with `judge_devices`: the `inference` layout on theirs); `num_heads` (the model's
        attention heads) bounds `auto` tensor sizes."""
        if role in REWARD_ROLES and self.judge_devices and name is None:  # on its own devices
            mesh, name = self.judge_mesh(), "inference"
        name = name or self.layout_name(role, mesh.size)
        if name == "train" or mesh.size == 1:
            return Layout(mesh, name)
        return Layout(inference_mesh(mesh, self.inference, num_heads), name)


def _is_shape(value: str) -> bool:
    parts = value.split(",")
    return len(parts) == 3 and all(p.strip().lstrip("-").isdigit() for p in parts)


def mesh_from_flag(value: str) -> jax.sharding.Mesh:
    """The mesh of a command-line flag `DATA,FSDP,TENSOR` (e.g. `1,-1,1`: every device over fsdp)."""
    try:
        data, fsdp, tensor = (int(v) for v in value.split(","))
    except ValueError:
        raise ConfigError(f"--mesh={value!r}: give three sizes DATA,FSDP,TENSOR, e.g. 1,-1,1 (-1: the remaining "
                          "devices)") from None
    return make_mesh(data, fsdp, tensor)


@contextlib.contextmanager
def model_context(mesh: jax.sharding.Mesh | None = None) -> Iterator[None]:
    """Context in which models are created: sharded over `mesh` by the logical rules, or unsharded if None (the
    logical names kept as metadata only, whatever mesh is set around it)."""
    if mesh is None:
        with jax.set_mesh(None), nnx.use_eager_sharding(False):
            yield
    else:
        with jax.set_mesh(mesh), nnx.logical_axis_rules(LOGICAL_RULES):
            yield


def param(value: jax.Array, names: Sequence[str | None], kind: type[nnx.Param] = nnx.Param) -> nnx.Param:
    """A parameter (of `kind`: `nnx.Param`, or `nnx.LoRAParam` for an adapter) carrying logical axis `names`;
    sharded eagerly only when created under a mesh (`model_context`), so that models can also be built plainly,
    without a mesh, on one device."""
    eager = nnx.using_eager_sharding() and not jax.sharding.get_abstract_mesh().empty
    return kind(value, sharding_names=tuple(names), eager_sharding=eager)


def logical_spec(names: Sequence[str | None] | None) -> jax.sharding.PartitionSpec:
    """The PartitionSpec of an array whose axes carry the logical `names` (None or empty: replicated)."""
    rules = dict(LOGICAL_RULES)
    return jax.sharding.PartitionSpec(*[rules.get(n) if n is not None else None for n in (names or ())])


def logical_to_sharding(names: Sequence[str | None] | None, mesh: jax.sharding.Mesh
                        ) -> jax.sharding.NamedSharding:
    """NamedSharding for an array whose axes carry the logical `names` (None or empty: replicated)."""
    return jax.sharding.NamedSharding(mesh, logical_spec(names))


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
    """`x` with its axes constrained to the logical `names` inside a jitted step under a mesh (`jax.set_mesh`); the
    identity without one (single device).

    Activations use the parameters' names: a mesh axis already taken by an earlier axis of `x` is not used again
    (activations `("batch", "length", "embed")` are rows over `(data, fsdp)`, embed replicated, while the `embed` of
    a parameter is over `fsdp`), and an axis whose size the mesh axes do not divide is left to XLA."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    sizes = {a: n for a, n in mesh.shape.items() if a not in mesh.manual_axes}  # (inside shard_map: its auto axes)
    parts = partition(names, x.shape, LOGICAL_RULES, sizes)
    split = [p if math.prod(sizes[a] for a in p) > 1 else () for p in parts]  # over one device: left to XLA
    return jax.lax.with_sharding_constraint(x, _partition_spec(split))


def batch_sharding(mesh: jax.sharding.Mesh, ndim: int = 1) -> jax.sharding.NamedSharding:
    """Rows over `(data, fsdp)`, the other axes replicated: the sharding of every batch array."""
    return logical_to_sharding(("batch",) + (None,) * (ndim - 1), mesh)


def put_batch(tree, mesh: jax.sharding.Mesh | None):
    """Host arrays (numpy) holding the whole batch, the same on every host, as global arrays with their rows over
    `(data, fsdp)`: each device takes its rows from its own host's copy (`jax.make_array_from_callback`), so
    nothing is sent between hosts. On one device (no mesh), plain device arrays."""
    if mesh is None:
        return jax.tree.map(jax.numpy.asarray, tree)

    def put(x):
        return jax.make_array_from_callback(x.shape, batch_sharding(mesh, x.ndim), lambda index: x[index])

    return jax.tree.map(put, tree)


def mesh_of(model) -> jax.sharding.Mesh | None:
    """The mesh a model's parameters are sharded over (None for a model on one device without a mesh)."""
    leaf = jax.tree.leaves(nnx.state(model, nnx.Param))[0]
    sharding = getattr(leaf, "sharding", None)
    return sharding.mesh if isinstance(sharding, jax.sharding.NamedSharding) else None


def _batch_shards(mesh: jax.sharding.Mesh) -> int:
    return mesh.shape["data"] * mesh.shape["fsdp"]


def _split_by_host(mesh: jax.sharding.Mesh) -> bool:
    """Whether the batch axis is split between the hosts, each host's devices holding rows of their own (else the
    hosts' devices hold the same rows, e.g. with `tensor` spanning hosts)."""
    local = mesh.local_mesh
    return _batch_shards(mesh) == _batch_shards(local) * jax.process_count()


def host_row_multiple(mesh: jax.sharding.Mesh | None) -> int:
    """A host's part of a batch (`put_rows`) must have a multiple of this many rows, so that every host's rows
    times the hosts divide over the batch shards `data x fsdp`. 1 on one process."""
    if mesh is None or jax.process_count() == 1:
        return 1
    return _batch_shards(mesh) // math.gcd(_batch_shards(mesh), jax.process_count())


def put_rows(tree, mesh: jax.sharding.Mesh | None):
    """This host's own rows `[n, ...]` (numpy; the same n on every host, a multiple of `host_row_multiple`) as
    global arrays `[n x hosts, ...]`, rows over `(data, fsdp)`: what a host feeds a program over the whole mesh.
    `host_rows` reads a result back in the same order. On one process, `put_batch` (plain device arrays when the
    rows do not divide over the batch shards; the jitted program places them).

    When the batch axis is split between the hosts, each host's rows go to its own devices
    (`multihost_utils.host_local_array_to_global_array`, nothing sent); otherwise the hosts' rows are gathered
    first and the global batch is in process order."""
    if mesh is None or jax.process_count() == 1:
        whole = all(x.shape[0] % _batch_shards(mesh) == 0 for x in jax.tree.leaves(tree)) if mesh else False
        return put_batch(tree, mesh if whole else None)

    if _split_by_host(mesh):
        spec = lambda x: logical_spec(("batch",) + (None,) * (x.ndim - 1))
        return jax.tree.map(lambda x: multihost_utils.host_local_array_to_global_array(x, mesh, spec(x)), tree)

    return put_batch(jax.tree.map(distributed.host_concat, tree), mesh)


def host_rows(x: jax.Array, mesh: jax.sharding.Mesh | None):
    """This host's own rows of a global batch array built from `put_rows` (or computed row-wise from one), as
    numpy; the whole array on one process."""
    if mesh is None or jax.process_count() == 1:
        return to_host(x)

    if _split_by_host(mesh):
        local = multihost_utils.global_array_to_host_local_array(x, mesh, logical_spec(("batch",) + (None,) *
                                                                                      (x.ndim - 1)))
        return to_host(local)
    n = x.shape[0] // jax.process_count()
    return to_host(x)[jax.process_index() * n:(jax.process_index() + 1) * n]


def to_host(x: jax.Array):
    """A global array as a numpy array on this host: its own data when fully addressable, else gathered from every
    process (`multihost_utils.process_allgather`). Every host-side read of a possibly global array goes through
    here."""
    if isinstance(x, jax.Array) and x.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(jax.device_get(x))


def bytes_per_device(tree) -> int:
    """The most bytes the arrays of `tree` hold on any one of this process's devices (their addressable shards)."""
    per_device: collections.Counter = collections.Counter()
    for x in jax.tree.leaves(tree):
        for shard in getattr(x, "addressable_shards", ()):
            per_device[shard.device] += shard.data.nbytes
    return max(per_device.values(), default=0)
