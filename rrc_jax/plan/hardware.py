"""The accelerators the planner knows (HBM, devices per host, peak FLOP/s and bandwidths: `ACCELERATORS`), a
topology by name (`topology`) and a mesh on it (`resolve_mesh`)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from rrc_jax.errors import ConfigError
from rrc_jax.sharding import dcn_shape, mesh_shape

GiB = 1 << 30


HEADROOM = 0.9  # the share of HBM a plan may use: XLA's scratch, fragmentation and collectives take the rest


# Per device of each accelerator family (a chip; v4 and v5p name TensorCores, 2 per chip, one JAX device per chip):
# HBM (GiB), devices per host (`host`; slices of at most 8 chips of v5e / v6e are one host of 8), and the
# roofline's peak dense bf16 FLOP/s, HBM bytes/s and interconnect bytes/s one way (Cloud TPU system architecture
# pages; NVIDIA's H100 / H200 SXM data sheets, NVLink 900 GB/s both ways), and the data-center network's bytes/s
# a chip sends one way to other slices (`dcn_bw`): v5e 2 x 100 Gbps NICs a host of 8 chips (6.4 Tbps a 256-chip
# pod), v6e 4 x 200 Gbps a host of 8, v5p 50 Gbps a chip (the Cloud TPU v5e, v6e and v5p pages); v4's page gives
# none: "How to Scale Your Model" (the TPU chapter) puts DCN at about 6.25e9 bytes/s a chip; GPUs one 400 Gbps NIC
# each (NVIDIA's DGX H100 / H200 reference design).
ACCELERATORS = {
    "v4": dict(hbm=32, unit="TensorCores", per_chip=2, host=4, flops=275e12, hbm_bw=1.2e12, ici_bw=300e9,
               dcn_bw=6.25e9),
    "v5p": dict(hbm=95, unit="TensorCores", per_chip=2, host=4, flops=459e12, hbm_bw=2.765e12, ici_bw=600e9,
                dcn_bw=6.25e9),
    "v5e": dict(hbm=16, unit="chips", per_chip=1, host=4, flops=197e12, hbm_bw=819e9, ici_bw=200e9,
                dcn_bw=3.125e9),
    "v5litepod": dict(hbm=16, unit="chips", per_chip=1, host=4, flops=197e12, hbm_bw=819e9, ici_bw=200e9,
                      dcn_bw=3.125e9),
    "v6e": dict(hbm=32, unit="chips", per_chip=1, host=4, flops=918e12, hbm_bw=1.64e12, ici_bw=400e9,
                dcn_bw=12.5e9),
    "h100": dict(hbm=80, unit="GPUs", per_chip=1, host=8, flops=989e12, hbm_bw=3.35e12, ici_bw=450e9, dcn_bw=50e9),
    "h200": dict(hbm=141, unit="GPUs", per_chip=1, host=8, flops=989e12, hbm_bw=4.8e12, ici_bw=450e9, dcn_bw=50e9),
    # nominal, for tests (host memory is not HBM; the speeds are placeholders, not a CPU's)
    "cpu": dict(hbm=1024, unit="devices", per_chip=1, host=1 << 20, flops=1e12, hbm_bw=1e11, ici_bw=1e10,
                dcn_bw=1e9),
}


@dataclasses.dataclass(frozen=True)
class Topology:
    """`slices` slices (or hosts) of the same kind: `devices` JAX devices in all (TPU chips, GPUs) of `hbm_bytes`
    each, `host_devices` to a host; per device the peak dense bf16 `flops` (FLOP/s), `hbm_bw`, the one-way
    interconnect `ici_bw` inside a slice and the data-center network's `dcn_bw` between slices (bytes/s)."""

    name: str
    devices: int
    hbm_bytes: int
    host_devices: int = 1
    flops: float = 0.0
    hbm_bw: float = 0.0
    ici_bw: float = 0.0
    dcn_bw: float = 0.0
    slices: int = 1

    @property
    def slice_devices(self) -> int:
        return self.devices // self.slices


def topology(name: str, slices: int = 1) -> Topology:
    """The `Topology` of `slices` slices of a Cloud TPU name (`v4-32`, `v5p-64`: TensorCores, 2 per chip; `v5e-64`,
    `v5litepod-16`, `v6e-8`: chips), a GPU host (`h100-8`, `h200-8`) or `cpu-N` (tests). A multi-host pod is one
    slice: its devices are its chips. Anything else is a `ConfigError` naming the known forms."""
    if slices < 1:
        raise ConfigError(f"--slices={slices}: give the number of slices, >= 1")
    match = re.fullmatch(r"([a-z0-9]+)-(\d+)", name.strip().lower())
    family = ACCELERATORS.get(match.group(1)) if match else None
    count = int(match.group(2)) if match else 0
    if family is None or count < family["per_chip"] or count % family["per_chip"]:
        known = ", ".join(f"{k}-N ({v['unit']}{', 2 per chip' if v['per_chip'] == 2 else ''})"
                          for k, v in ACCELERATORS.items())
        raise ConfigError(f"--topology={name}: unknown topology; known: {known}")
    devices = count // family["per_chip"]
    host = devices if family["unit"] == "chips" and devices <= 8 else min(devices, family["host"])
    return Topology(name if slices == 1 else f"{slices} x {name}", devices * slices, family["hbm"] * GiB, host,
                    family["flops"], family["hbm_bw"], family["ici_bw"], family["dcn_bw"], slices)


def live_topology(devices: Sequence, process: int = 0) -> Topology | None:
    """The topology of a run's JAX `devices` (every host's) when those of host `process` report their memory
    (`memory_stats()['bytes_limit']`: TPUs, GPUs; a host reads only its own), named by their kind and count; None
    when they report none (XLA:CPU). Speeds are not read (0)."""
    local = [d for d in devices if d.process_index == process]
    stats = [d.memory_stats() for d in local]
    if not local or not all(x and x.get("bytes_limit") for x in stats):
        return None
    kind = str(local[0].device_kind).lower().replace(" ", "_")
    return Topology(f"{kind}-{len(devices)}", len(devices), min(x["bytes_limit"] for x in stats), len(local))


def resolve_mesh(data: int, fsdp: int, tensor: int, devices: int) -> tuple[int, int, int]:
    """(data, fsdp, tensor) with a -1 taking the remaining devices, as the trainer's mesh resolves it
    (`rrc_jax.sharding.mesh_shape`)."""
    return mesh_shape(data, fsdp, tensor, devices)


def slice_meshes(mesh, topo: Topology) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(the whole mesh's `(data, fsdp, tensor)`, its sizes across slices) of a run's `mesh` settings on `topo`, as
    `MeshConfig.make` builds it: `mesh.data/fsdp/tensor` inside a slice, `mesh.dcn` across `topo.slices`."""
    if topo.slices == 1 and mesh.dcn == "auto":
        return resolve_mesh(mesh.data, mesh.fsdp, mesh.tensor, topo.devices), (1, 1, 1)
    dcn = dcn_shape(mesh.dcn, topo.slices)
    ici = mesh_shape(mesh.data, mesh.fsdp, mesh.tensor, topo.slice_devices, name="config.mesh (inside a slice)",
                     exact=topo.slices > 1)
    return (ici[0] * dcn[0], ici[1] * dcn[1], ici[2] * dcn[2]), dcn


def split_size(n: int, k: int) -> int:
    """The per-device share of an axis of n split k ways: n / k when k divides n, else n (left whole)."""
    return n // k if n % k == 0 else n
