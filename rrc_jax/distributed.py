"""Multi-host start-up and the few collectives the host side of a run needs.

A run on a TPU pod (or several GPU hosts) is one JAX program per host: every host runs the same Python, the jitted
steps run as one SPMD program over the global mesh, and the host side keeps in step with these helpers:

- `initialize(config.distributed)` before anything touches a device: `jax.distributed.initialize()` with the
  config's coordinator / process count / process id, else the `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`,
  `JAX_PROCESS_ID` environment variables, else, on a Cloud TPU VM, JAX's own detection (no arguments). A single
  process without any of these is left alone.
- `is_main()`: process 0, the only one that writes files (metrics, anchors, exports, config.json).
- `barrier(name)`: every host waits here (a host reads what process 0 has just written after one).
- `host_concat(x)`: this host's numpy rows concatenated with every other host's, in process order.
- `main_value(x)`: process 0's value of a small host value (a decision every host must take alike).

On one process every helper is the identity (or a no-op), so library code calls them unconditionally.
"""

from __future__ import annotations

import glob
import importlib.util
import os

import jax
import numpy as np

from rrc_jax.errors import ConfigError


def _on_cloud_tpu_vm() -> bool:
    """A Cloud TPU VM: libtpu is installed and TPU chips are visible (`/dev/accel*` or `/dev/vfio/<n>`)."""
    return importlib.util.find_spec("libtpu") is not None and bool(glob.glob("/dev/accel*") or
                                                                      glob.glob("/dev/vfio/[0-9]*"))


def initialize(cfg=None) -> None:
    """Start JAX's distributed runtime when this is one of several processes (module docstring).

    cfg: a config's `distributed` group (`coordinator`, `num_processes`, `process_id`), or None.
    """
    if jax.distributed.is_initialized():
        return
    coordinator = (cfg.coordinator if cfg is not None else "") or os.environ.get("JAX_COORDINATOR_ADDRESS", "")
    num = (cfg.num_processes if cfg is not None else 0) or int(os.environ.get("JAX_NUM_PROCESSES", "0"))
    pid = cfg.process_id if cfg is not None and cfg.process_id >= 0 else int(os.environ.get("JAX_PROCESS_ID", "-1"))
    if coordinator or num:
        if not (coordinator and num >= 1 and 0 <= pid < num):
            raise ConfigError(f"config.distributed: coordinator={coordinator!r} num_processes={num} process_id={pid}; "
                              "a multi-process run needs all three (coordinator HOST:PORT, num_processes >= 1 and "
                              "0 <= process_id < num_processes), or none of them on a Cloud TPU VM")
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=num, process_id=pid)
    elif _on_cloud_tpu_vm():
        jax.distributed.initialize()


def is_main() -> bool:
    """Process 0: the one host that writes files."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every host reaches the barrier `name` (nothing on one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def host_concat(x: np.ndarray) -> np.ndarray:
    """Every host's `x [n, ...]` (the same shape on each) concatenated along axis 0 in process order
    `[hosts * n, ...]`; `x` itself on one process."""
    x = np.asarray(x)
    if jax.process_count() == 1:
        return x
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x)).reshape(-1, *x.shape[1:])


def main_value(x):
    """Process 0's value of `x` (a numpy-compatible scalar or array), on every host; `x` on one process."""
    if jax.process_count() == 1:
        return x
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.broadcast_one_to_all(np.asarray(x)))
