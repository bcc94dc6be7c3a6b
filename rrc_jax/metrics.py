"""Training metrics: one JSON object per line in `workdir/metrics.jsonl` and TensorBoard event files.

The TensorBoard writer is a minimal, dependency-free encoder of scalar `Event` records in the TFRecord format
(length, masked CRC32C, payload, masked CRC32C), readable by TensorBoard and `tensorboard.backend.event_processing`.
Only process 0 writes.
"""

from __future__ import annotations

import json
import math
import os
import socket
import struct
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import jax
import numpy as np
from etils import epath


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(num: int, wire: int) -> bytes:
    return _varint((num << 3) | wire)


def _bytes_field(num: int, payload: bytes) -> bytes:
    return _field(num, 2) + _varint(len(payload)) + payload


def _event(wall_time: float, step: int, *, file_version: str | None = None,
           scalars: Mapping[str, float] | None = None) -> bytes:
    """Serialized `tensorflow.Event` (wall_time=1 double, step=2 int64, file_version=3, summary=5)."""
    msg = _field(1, 1) + struct.pack("<d", wall_time) + _field(2, 0) + _varint(step)
    if file_version is not None:
        msg += _bytes_field(3, file_version.encode())
    if scalars:
        summary = b"".join(
            _bytes_field(1, _bytes_field(1, tag.encode()) + _field(2, 5) + struct.pack("<f", float(value)))
            for tag, value in scalars.items())
        msg += _bytes_field(5, summary)
    return msg


class TensorBoardWriter:
    """Appends scalar summaries to `logdir/events.out.tfevents.<time>.<host>`."""

    def __init__(self, logdir: str | os.PathLike):
        Path(logdir).mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}"
        self._f = open(Path(logdir) / name, "ab")
        self._write(_event(time.time(), 0, file_version="brain.Event:2"))

    def _write(self, data: bytes) -> None:
        header = struct.pack("<Q", len(data))
        self._f.write(header + struct.pack("<I", _masked_crc(header)) + data + struct.pack("<I", _masked_crc(data)))

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        finite = {k: v for k, v in values.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        if finite:
            self._write(_event(time.time(), step, scalars=finite))
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def to_python(value):
    """JSON-able Python scalars from numpy / jax scalars."""
    if isinstance(value, (jax.Array, np.ndarray, np.generic)):
        value = np.asarray(value)
        return value.item() if value.size == 1 else value.tolist()
    return value


class MetricsLogger:
    """`log(step, {name: value})` -> a line of `workdir/metrics.jsonl` (with `step`) and TensorBoard scalars.

    Only process 0 writes. `resume_step`: a run resumed from the checkpoint of that step first drops the lines of
    later steps (logged after the checkpoint, before the run was killed), so that every step has one line; 0 (no
    checkpoint yet) drops them all. A
    `workdir` URI (`gs://...`, which cannot append) is written through a local mirror copied to it after each
    `log`.
    """

    def __init__(self, workdir: str | os.PathLike, *, tensorboard: bool = True, resume_step: int | None = None):
        self.enabled = jax.process_index() == 0
        self.remote = epath.Path(workdir) if "://" in str(workdir) else None
        local = Path(tempfile.mkdtemp(prefix="rrc_jax_metrics_")) if self.remote else Path(workdir)
        self.path = local / "metrics.jsonl"
        if not self.enabled:
            return
        local.mkdir(parents=True, exist_ok=True)
        if self.remote is not None and (self.remote / "metrics.jsonl").exists():
            self.path.write_text((self.remote / "metrics.jsonl").read_text())
        if resume_step is not None and self.path.exists():
            rows = [line for line in self.path.read_text().splitlines(keepends=True)
                    if line.strip() and 0 < resume_step and json.loads(line)["step"] <= resume_step]
            self.path.write_text("".join(rows))
        self._jsonl = open(self.path, "a")
        self._tb = TensorBoardWriter(local / "tensorboard") if tensorboard else None

    def log(self, step: int, metrics: Mapping[str, object]) -> None:
        if not self.enabled:
            return
        row = {"step": int(step), **{k: to_python(v) for k, v in metrics.items()}}
        self._jsonl.write(json.dumps(row, sort_keys=False) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            self._tb.scalars(int(step), {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float))})
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
            self._sync()
