"""The accelerators the planner knows (HBM, devices per host, peak FLOP/s and bandwidths: `ACCELERATORS`), a
topology by name (`topology`) and a mesh on it (`resolve_mesh`)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from rrc_jax.errors import ConfigError
from rrc_jax.sharding import mesh_shape

GiB = 1 << 30


HEADROOM = 0.9  # the share of HBM a plan may use: XLA's scratch, fragmentation and collectives take the rest


# Per device of each accelerator family (a chip; v4 and v5p name TensorCores, 2 per chip, one JAX device per chip):
# HBM (GiB), devices per host (`host`; slices of at most 8 chips of v5e / v6e are one host of 8), and the
# roofline's peak dense bf16 FLOP/s, HBM bytes/s and interconnect bytes/s one way (Cloud TPU system architecture
# pages; NVIDIA's H100 / H200 SXM data sheets, NVLink 900 GB/s both ways).
ACCELERATORS = {
    "v4": dict(hbm=32, unit="TensorCores", per_chip=2, host=4, flops=275e12, hbm_bw=1.2e12, ici_bw=300e9),
    "v5p": dict(hbm=95, unit="TensorCores", per_chip=2, host=4, flops=459e12, hbm_bw=2.765e12, ici_bw=600e9),
    "v5e": dict(hbm=16, unit="chips", per_chip=1, host=4, flops=197e12, hbm_bw=819e9, ici_bw=200e9),
    "v5litepod": dict(hbm=16, unit="chips", per_chip=1, host=4, flops=197e12, hbm_bw=819e9, ici_bw=200e9),
    "v6e": dict(hbm=32, unit="chips", per_chip=1, host=4, flops=918e12, hbm_bw=1.64e12, ici_bw=400e9),
    "h100": dict(hbm=80, unit="GPUs", per_chip=1, host=8, flops=989e12, hbm_bw=3.35e12, ici_bw=450e9),
    "h200": dict(hbm=141, unit="GPUs", per_chip=1, host=8, flops=989e12, hbm_bw=4.8e12, ici_bw=450e9),
    # nominal, for tests (host memory is not HBM; the speeds are placeholders, not a CPU's)
    "cpu": dict(hbm=1024, unit="devices", per_chip=1, host=1 << 20, flops=1e12, hbm_bw=1e11, ici_bw=1e10),
}


@dataclasses.dataclass(frozen=True)
class Topology:
    """A slice or host: `devices` JAX devices (TPU chips, GPUs) of `hbm_bytes` each, `host_devices` to a host; per
    device the peak dense bf16 `flops` (FLOP/s), `hbm_bw` and one-way interconnect `ici_bw` (bytes/s)."""

    name: str
    devices: int
    hbm_bytes: int
    host_devices: int = 1
    flops: float = 0.0
    hbm_bw: float = 0.0
    ici_bw: float = 0.0


def topology(name: str) -> Topology:
    """The `Topology` of a Cloud TPU name (`v4-32`, `v5p-64`: TensorCores, 2 per chip; `v5e-64`, `v5litepod-16`,
    `v6e-8`: chips), a GPU host (`h100-8`, `h200-8`) or `cpu-N` (tests). A multi-host pod is one topology: its
    devices are its chips. Anything else is a `ConfigError` naming the known forms."""
    match = re.fullmatch(r"([a-z0-9]+)-(\d+)", name.strip().lower())
    family = ACCELERATORS.get(match.group(1)) if match else None
    count = int(match.group(2)) if match else 0
    if family is None or count < family["per_chip"] or count % family["per_chip"]:
        known = ", ".join(f"{k}-N ({v['unit']}{', 2 per chip' if v['per_chip'] == 2 else ''})"
                          for k, v in ACCELERATORS.items())
        raise ConfigError(f"--topology={name}: unknown topology; known: {known}")
    devices = count // family["per_chip"]
    host = devices if family["unit"] == "chips" and devices <= 8 else min(devices, family["host"])
    return Topology(name, devices, family["hbm"] * GiB, host, family["flops"], family["hbm_bw"], family["ici_bw"])


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


def split_size(n: int, k: int) -> int:
    """The per-device share of an axis of n split k ways: n / k when k divides n, else n (left whole)."""
    return n // k if n % k == 0 else n
