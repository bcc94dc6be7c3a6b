"""Training metrics: one JSON object per line in `workdir/metrics.jsonl`, TensorBoard, and optionally W&B.

- `metrics.jsonl` is strict JSON: a non-finite float (the mean of nothing, an overflow) is written `null`, also
  inside lists, and the dump refuses NaN (`allow_nan=False`), so a value that slips past this fails loudly instead
  of writing a line that strict readers reject.
- TensorBoard event files (`workdir/tensorboard/`) are written by `tensorboardX.SummaryWriter`: the finite numbers
  of each row as scalars. A resumed run writes a purge event (`purge_step`), so TensorBoard hides the steps logged
  after the checkpoint, as `metrics.jsonl` drops their lines.
- Weights & Biases (`wandb=True`, the `wandb` package installed) gets the same scalars as TensorBoard.

Only process 0 writes. A `gs://...` workdir (which cannot append) is written through a local mirror that is copied
to it after each `log`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import jax
import numpy as np
from etils import epath

from rrc_jax.errors import ConfigError
from rrc_jax.progress import say


@dataclasses.dataclass(frozen=True)
class MetricsConfig:
    """Where a run's metrics go beside `metrics.jsonl` (`log`): TensorBoard event files, Weights & Biases."""

    GROUP: ClassVar[str] = "log"
    tensorboard: bool = True
    wandb: bool = False  # needs the `wandb` package
    wandb_project: str = "rrc-jax"


def json_value(value):
    """`value` as strict JSON: numpy / jax arrays as Python scalars or lists, a non-finite float (also inside a
    list) as None."""
    if isinstance(value, (jax.Array, np.ndarray, np.generic)):
        value = np.asarray(value)
        value = value.item() if value.size == 1 else value.tolist()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    return value


def scalars(row: Mapping[str, object]) -> dict[str, float]:
    """The numbers of a `json_value` row but its step (non-finite ones are None there): what TensorBoard and W&B
    plot."""
    return {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float))}


def first_step_again(resume_step: int | None) -> int | None:
    """The first step a run resumed from the checkpoint of `resume_step` logs again, from which earlier lines and
    events are dropped: the next one, or 0 when there was no checkpoint yet (`resume_step=0`: the run starts over);
    None for a logger that is not resuming."""
    if resume_step is None:
        return None
    return resume_step + 1 if resume_step > 0 else 0


def step_of(line: str) -> int | None:
    """The `step` of a `metrics.jsonl` line, None when it is not a JSON object with an integer step (a line cut
    short)."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    step = row.get("step") if isinstance(row, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def lines_before(text: str, first: int, name: str) -> tuple[list[str], bool]:
    """(the lines of a `metrics.jsonl` text logged before step `first`, each ending in a newline; whether its last
    line was torn). A torn last line (not a metrics line: a write cut short by a full disk or a kill) is dropped; a
    malformed line before it is a `ConfigError` naming `name:LINE`. Blank lines are dropped."""
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    kept, torn = [], False
    for k, (n, line) in enumerate(lines):
        step = step_of(line)
        if step is None:
            if k < len(lines) - 1:
                raise ConfigError(f"{name}:{n}: not a metrics line (a JSON object with an integer step); delete "
                                  "that line, or move the file away to start the log afresh")
            torn = True
        elif step < first:
            kept.append(line + "\n")
    return kept, torn


def import_wandb():
    """The `wandb` module, or a `ConfigError` saying how to get it or turn it off."""
    try:
        import wandb  # the wandb extra
    except ImportError as e:
        raise ConfigError("log.wandb=True needs the wandb package: pip install wandb, "
                          "or set --config.log.wandb=False") from e
    return wandb


def tensorboard_writer(path: Path, purge_step: int | None):
    """A `tensorboardX.SummaryWriter` into `path`, hiding the events of steps from `purge_step` on. tensorboardX
    imports torch when it is installed (2 seconds of start-up), only to accept torch tensors (its `import torch` is
    optional); we log Python numbers, so a process that has not imported torch yet imports tensorboardX without it."""
    if "torch" in sys.modules:
        from tensorboardX import SummaryWriter  # heavy (1.7 s): only with log.tensorboard
    else:
        sys.modules["torch"] = None  # `import torch` raises ImportError while tensorboardX is imported
        try:
            from tensorboardX import SummaryWriter  # heavy (1.7 s): only with log.tensorboard
        finally:
            del sys.modules["torch"]

    # tensorboardX names event files by the second and truncates an existing name: the suffix keeps a writer
    # reopened within the same second (a quick resume) from erasing the previous file, and sorts after it.
    return SummaryWriter(str(path), purge_step=purge_step, filename_suffix=f".{time.time_ns()}")


class MetricsLogger:
    """`log(step, {name: value})` -> a line of `workdir/metrics.jsonl` (with `step`), TensorBoard scalars and, with
    `wandb=True`, a W&B run (`wandb_project`, `name`, `record`: the run's config as its JSON dict).

    Only process 0 writes. `resume_step`: a run resumed from the checkpoint of that step first drops the lines of
    later steps (logged after the checkpoint, before the run was killed), so that every step has one line, and
    TensorBoard hides their events; 0 (no checkpoint yet) drops them all. A torn last line (`lines_before`) is
    dropped and said.
    """

    def __init__(self, workdir: str | os.PathLike, *, tensorboard: bool = True, resume_step: int | None = None,
                 wandb: bool = False, wandb_project: str = "rrc-jax", record: dict | None = None,
                 name: str | None = None):
        wandb_module = import_wandb() if wandb else None  # every process: a missing package fails them all
        self.enabled = jax.process_index() == 0
        self.remote = epath.Path(workdir) if "://" in str(workdir) else None
        local = Path(tempfile.mkdtemp(prefix="rrc_jax_metrics_")) if self.remote else Path(workdir)
        self.path = local / "metrics.jsonl"
        if not self.enabled:
            return
        local.mkdir(parents=True, exist_ok=True)
        if self.remote is not None and (self.remote / "metrics.jsonl").exists():
            self.path.write_text((self.remote / "metrics.jsonl").read_text())
        first = first_step_again(resume_step)
        if first is not None and self.path.exists():
            text = self.path.read_bytes().decode("utf-8", errors="replace")  # a torn write may end mid-character
            rows, torn = lines_before(text, first, str(self.path))
            if torn:
                say(f"metrics: dropped the torn last line of {self.path} (a write cut short, e.g. by a full disk)")
            self.path.write_text("".join(rows))
        self._jsonl = open(self.path, "a")
        self._tb = tensorboard_writer(local / "tensorboard", first) if tensorboard else None
        self._wandb = wandb_module.init(project=wandb_project, config=record, name=name, dir=str(local),
                                        resume="allow") if wandb_module else None

    def log(self, step: int, metrics: Mapping[str, object]) -> None:
        if not self.enabled:
            return
        row = {"step": int(step), **{k: json_value(v) for k, v in metrics.items()}}
        self._jsonl.write(json.dumps(row, allow_nan=False) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            for tag, value in scalars(row).items():
                self._tb.add_scalar(tag, value, row["step"])
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars(row), step=row["step"])
        self._sync()

    def _sync(self) -> None:
        """Copy the local mirror to a remote workdir (nothing for a local one)."""
        if self.remote is None:
            return
        local = self.path.parent
        for f in [self.path, *sorted((local / "tensorboard").glob("*"))]:
            target = self.remote / f.relative_to(local)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(f.read_bytes())

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            if self._tb is not None:
                self._tb.close()
            if self._wandb is not None:
                self._wandb.finish()
            self._sync()
