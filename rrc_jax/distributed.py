"""Multi-host start-up and the few collectives the host side of a run needs.

A run on a TPU pod (or several GPU hosts) is one JAX program per host: every host runs the same Python, the jitted
steps run as one SPMD program over the global mesh, and the host side keeps in step with these helpers:

- `initialize(settings)` before anything touches a device: `jax.distributed.initialize()` with the
  `DistributedConfig`'s coordinator / process count / process id (the config's `distributed` group), else the
  `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID` environment variables, else, on a Cloud TPU VM,
  JAX's own detection (no arguments); each source gives all three or none. A single process without any of these
  is left alone.
- `is_main()`: process 0, the only one that writes files (metrics, anchors, exports, config.json).
- `barrier(name)`: every host waits here (a host reads what process 0 has just written after one).
- `host_concat(x)`: this host's numpy rows concatenated with every other host's, in process order (`host_gather`
  when the hosts' row counts differ, `gather_texts` for strings).
- `host_max(x)`: the elementwise maximum of a small integer array over hosts: how hosts agree on the shapes of a
  collective call (`agree` for a list of per-chunk shapes; `rrc_jax.models.batches.agreed_chunks` for items cut into
  chunks).
- `any_host(flag)`: whether any host has more work, for loops whose every iteration is a collective call.
- `host_block(n)`: this host's contiguous share of n items (the eval prompts, the anchors' prompts).
- `reduce_metrics(metrics)`: one step's metrics averaged over hosts (counters summed).
- `main_value(x)`: process 0's value of a small host value (a decision every host must take alike).

The host side of a step is split across hosts: each host tokenizes its own prompts, detokenizes its own rows and
judges its own groups; the jitted programs it feeds (`sharding.put_rows`) and reads (`sharding.host_rows`) span the
mesh. Every model call is then collective: each host makes the same calls in the same order, with shapes agreed by
`host_max` / `agree`, a host without rows of its own passing padding.

On one process every helper is the identity (or a no-op), so library code calls them unconditionally.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import math
import os
import zlib
from typing import ClassVar

import jax
import numpy as np
from jax.experimental import multihost_utils

from rrc_jax.errors import ConfigError
from rrc_jax.settings import field_error


def _on_cloud_tpu_vm() -> bool:
    """A Cloud TPU VM: libtpu is installed and TPU chips are visible (`/dev/accel*` or `/dev/vfio/<n>`)."""
    return importlib.util.find_spec("libtpu") is not None and bool(glob.glob("/dev/accel*") or
                                                                      glob.glob("/dev/vfio/[0-9]*"))


# The environment variables of each `DistributedConfig` field, read when the config gives none of them.
ENVIRONMENT = {"coordinator": "JAX_COORDINATOR_ADDRESS", "num_processes": "JAX_NUM_PROCESSES",
               "process_id": "JAX_PROCESS_ID"}
_ALL_THREE = ("a multi-process run gives all three of coordinator HOST:PORT, num_processes >= 1 and "
              "0 <= process_id < num_processes; or none of them on one process or a Cloud TPU VM")


def start_up_problem(coordinator: str, num_processes: int, process_id: int) -> tuple[str, str] | None:
    """(field, what is wrong) of the first setting a multi-process start-up lacks, None when all three or none of
    them are given (none: `coordinator` empty, `num_processes` 0, `process_id` negative)."""
    if not (coordinator or num_processes or process_id >= 0):
        return None
    if not coordinator:
        return "coordinator", "empty; give process 0's HOST:PORT"
    if num_processes < 1:
        return "num_processes", f"{num_processes} must be >= 1"
    if not 0 <= process_id < num_processes:
        return "process_id", f"{process_id} must be in [0, num_processes={num_processes})"
    return None


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """Multi-host start-up (`distributed`): process 0's `coordinator` address, the number of processes and this
    one's id, all three or none (`start_up_problem`). None given: the environment's (`ENVIRONMENT`), else one
    process (on a Cloud TPU VM, JAX's own detection)."""

    GROUP: ClassVar[str] = "distributed"
    coordinator: str = ""  # HOST:PORT of process 0
    num_processes: int = 0  # 0 = not given
    process_id: int = -1  # -1 = not given

    def __post_init__(self):
        problem = start_up_problem(self.coordinator, self.num_processes, self.process_id)
        if problem:
            field, why = problem
            raise field_error("distributed", field, f"{why} ({_ALL_THREE})")

    @property
    def given(self) -> bool:
        """Whether the settings start several processes (all three given)."""
        return bool(self.coordinator)


def environment_settings() -> DistributedConfig:
    """The start-up settings of the `ENVIRONMENT` variables (a `ConfigError` naming the variable when they give
    some but not all three)."""
    coordinator = os.environ.get(ENVIRONMENT["coordinator"], "")
    num = int(os.environ.get(ENVIRONMENT["num_processes"], "0"))
    pid = int(os.environ.get(ENVIRONMENT["process_id"], "-1"))
    problem = start_up_problem(coordinator, num, pid)
    if problem:
        field, why = problem
        raise ConfigError(f"{ENVIRONMENT[field]}: {why} ({_ALL_THREE}; in the config or the environment)")
    return DistributedConfig(coordinator, num, pid)


def initialize(settings: DistributedConfig | None = None) -> None:
    """Start JAX's distributed runtime when this is one of several processes (module docstring): with `settings`
    (a config's `distributed` group, parsed) when they are given, else with the environment's."""
    if jax.distributed.is_initialized():
        return
    if settings is None or not settings.given:
        settings = environment_settings()
    if settings.given:
        jax.distributed.initialize(coordinator_address=settings.coordinator, num_processes=settings.num_processes,
                                   process_id=settings.process_id)
    elif _on_cloud_tpu_vm():
        jax.distributed.initialize()


def is_main() -> bool:
    """Process 0: the one host that writes files."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every host reaches the barrier `name` (nothing on one process)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def host_concat(x: np.ndarray) -> np.ndarray:
    """Every host's `x [n, ...]` (the same shape on each) concatenated along axis 0 in process order
    `[hosts * n, ...]`; `x` itself on one process."""
    x = np.asarray(x)
    if jax.process_count() == 1:
        return x

    return np.asarray(multihost_utils.process_allgather(x)).reshape(-1, *x.shape[1:])


def host_gather(x: np.ndarray) -> np.ndarray:
    """Every host's `x [n_h, ...]` (row counts may differ, other axes equal) concatenated in process order."""
    x = np.asarray(x)
    if jax.process_count() == 1:
        return x
    counts = host_concat(np.asarray([len(x)]))
    padded = np.zeros((int(counts.max()),) + x.shape[1:], x.dtype)
    padded[:len(x)] = x
    rows = host_concat(padded).reshape(len(counts), -1, *x.shape[1:])
    return np.concatenate([rows[h, :int(c)] for h, c in enumerate(counts)])


def gather_texts(texts: list[str]) -> list[str]:
    """Every host's list of strings concatenated in process order (`texts` itself on one process)."""
    if jax.process_count() == 1:
        return list(texts)
    encoded = [t.encode() for t in texts]
    lengths = host_gather(np.asarray([len(b) for b in encoded], np.int64))
    data = host_gather(np.frombuffer(b"".join(encoded), np.uint8)).tobytes()
    ends = np.cumsum(lengths)
    return [data[e - n:e].decode() for e, n in zip(ends, lengths)]


def host_max(x) -> np.ndarray:
    """The elementwise maximum over hosts of an integer array `x` of the same shape on every host."""
    x = np.asarray(x, np.int64)
    return host_concat(x[None]).max(axis=0) if jax.process_count() > 1 else x


def agree(plan: list[tuple[int, ...]], width: int) -> list[tuple[int, ...]]:
    """Per-chunk shapes agreed by all hosts: this host's `plan` (one tuple of `width` ints per chunk of a call),
    padded with zeros to the longest host's number of chunks, and the elementwise maximum over hosts."""
    if jax.process_count() == 1:
        return [tuple(int(v) for v in p) for p in plan]
    n = int(host_max(len(plan)))
    table = np.zeros((n, width), np.int64)
    if plan:
        table[:len(plan)] = np.asarray(plan, np.int64).reshape(len(plan), width)
    return [tuple(int(v) for v in row) for row in host_max(table)]


def any_host(flag: bool) -> bool:
    """Whether `flag` holds on any host."""
    return bool(host_max(int(bool(flag))))


def host_block(n: int) -> np.ndarray:
    """This host's contiguous share of `range(n)` (`np.array_split` order: the first `n % hosts` hosts take one
    more)."""
    return np.array_split(np.arange(n), jax.process_count())[jax.process_index()]


# metrics that are totals over the hosts' work; every other metric is a mean over hosts (NaN left out)
SUMMED_METRICS = ("judge/questions", "judge/tokens", "judge/prefill_tokens_saved", "judge/decode_row_steps",
                  "tokens_per_second",
                  "data/filtered_groups", "data/surplus_groups", "data/unfilled_groups",
                  # a served judge's requests and failures (`rrc_jax.inference.openai_engine.HttpStats`)
                  "judge/requests", "judge/failed_requests", "judge/unanswered_questions", "judge/refused",
                  "judge/timeouts", "judge/dropped", "judge/not_found", "judge/http_errors", "judge/garbled")


def summed(name: str) -> bool:
    """Whether metric `name` is a total over hosts (`SUMMED_METRICS`, or a judge pool's per-server count)."""
    return name in SUMMED_METRICS or name.startswith("judge/endpoint")


def reduce_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """A step's metrics from every host's own (the same keys on every host): totals (`SUMMED_METRICS`) summed,
    the rest averaged, NaN where every host has NaN. Identity on one process."""
    if jax.process_count() == 1:
        return dict(metrics)
    keys = sorted(metrics)
    names = host_concat(np.asarray([[len(keys), zlib.crc32("\n".join(keys).encode())]], np.int64))
    if (names != names[0]).any():
        raise RuntimeError(f"reduce_metrics: the hosts logged different metric names (process "
                           f"{jax.process_index()} has {keys}); every host must log the same keys")
    table = host_concat(np.asarray([[float(metrics[k]) for k in keys]], np.float64))
    out = {}
    for k, column in zip(keys, table.T):
        finite = column[~np.isnan(column)]
        out[k] = float(column.sum()) if summed(k) else float(finite.mean()) if len(finite) else math.nan
    return out


def main_value(x):
    """Process 0's value of `x` (a numpy-compatible scalar or array), on every host; `x` on one process."""
    if jax.process_count() == 1:
        return x

    return np.asarray(multihost_utils.broadcast_one_to_all(np.asarray(x)))
