"""Orbax checkpoints of a training run: the learner's parameters and optimizer state, the step and the data
iterator's state; and what every training loop (GRPO's `rrc_jax.rl.trainer`, the reward models' `rrc_jax.rm.fit`)
does around them: resume from the latest usable one (`Checkpointer.resume`), save when due or stopped
(`Checkpointer.end_step` with `StopSignals`: Ctrl-C or SIGTERM, how Cloud TPU preempts a VM, save after the current
step and exit).

One composite item per saved step under `directory/<step>/`: `state` (a pytree of arrays: `params`, a pure dict of
the policy's parameters; `opt`, the optimizer state's leaves; `step`), `data` (the grain iterator state, JSON) and
`manifest` (JSON: the step, the run's config and its hash (`rrc_jax.workdir.config_hash`), and per array of `state`
its name, shape, dtype, whether it is finite and a checksum of its bits; a CRC-32 of `data`; under LoRA, where
`params` holds the adapters only, the hash of the frozen base they were trained on, `base_hash`, which a resume
checks). The manifest is
written by the same asynchronous save as the arrays and committed with them (Orbax finalizes a step directory as a
whole), so it never describes a partial checkpoint. RNG keys are not stored: every random draw of step s derives
from `fold_in(key(seed), s)`, so a resumed run draws exactly what an uninterrupted one would.

Integrity. A restore checks every restored array finite and its checksum against the manifest (the checksum is an
exact integer digest of the array's bits, `_digests`, so it does not depend on the mesh it is computed on). A step
that fails to restore (a missing or truncated file, any Orbax / TensorStore error) or fails the check is moved to
`directory/bad/<step>` (never deleted) with one line saying why, and the step before it is tried. When no step is
usable, nothing is moved and `resume` raises a one-line `ConfigError` listing each step's fault: starting from
scratch would silently throw away the run's progress, and a fault on every step at once is more likely the storage
(or the workdir) than the checkpoints, so a person should look (the message says how to start over). A checkpoint
whose arrays do not fit the live model and optimizer (another model or optimizer in the same workdir) is a
`ConfigError` too, never set aside. Checkpoints written before manifests existed are checked finite only.

Rotation is ours (Orbax's `max_to_keep` is off): after a save of this run has finished, the `keep` newest steps and
the `keep` newest finite steps are kept and older ones deleted, so a run that resumed from step N (a newer one set
aside) or that saves non-finite parameters never loses N before `keep` newer finite checkpoints exist; a resume that
fails deletes nothing.

Restores place every array as the live one it replaces is placed (abstract targets with the current shardings),
so a checkpoint written on one mesh, or one number of hosts, resumes on another, a single device included. The
directory may be a `gs://` URI (etils `epath`). On several hosts every process calls `save`, `restore`, `resume`
and `wait` (Orbax coordinates them; process 0 writes the JSON items, moves bad steps aside and deletes old ones;
every decision about a step is taken alike on every host).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import signal
import sys
import zlib
from collections.abc import Iterator
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from rrc_jax import distributed, fault_points
from rrc_jax.errors import ConfigError
from rrc_jax.models import Decoder
from rrc_jax.models.lora import trainable
from rrc_jax.progress import say
from rrc_jax.rl.learner import Learner


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """When a run saves (`checkpoint`): every `save_every` steps (0: only at the end) and at the last, the `keep`
    latest kept."""

    GROUP: ClassVar[str] = "checkpoint"
    save_every: int = 10
    keep: int = 2

    def __post_init__(self):
        if self.save_every < 0 or self.keep < 1:
            raise ConfigError("config.checkpoint: save_every must be >= 0 (0 = only at the end) and keep >= 1")

MANIFEST_FORMAT = 1


def _state_tree(learner: Learner, step: int) -> dict:
    return {**learner.state(), "step": jnp.asarray(step, jnp.int32)}


def _leaf_digest(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(checksum, finite) of one array: the sum, wrapping mod 2**32, of its values' bit patterns (uint32) times
    odd weights that depend on the position; exact and independent of the reduction order (hence of sharding), and
    any change to one element changes it. `finite`: no NaN or inf (always true for integer arrays)."""
    narrow = jnp.issubdtype(x.dtype, jnp.integer) and jnp.iinfo(x.dtype).bits < 8  # 4-bit codes (an nf4 base)
    if x.dtype == jnp.bool_ or narrow:  # their values, which a bit pattern of their byte size would not hold
        bits = x.astype(jnp.uint32)
    else:
        width = jnp.dtype(x.dtype).itemsize * 8
        bits = jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{width}"))
        if width == 64:
            bits = bits ^ (bits >> 32)
        bits = bits.astype(jnp.uint32)
    position, stride = jnp.zeros(x.shape, jnp.uint32), 1  # the row-major index, from per-axis iotas (shardable)
    for axis in reversed(range(x.ndim)):
        position = position + jax.lax.broadcasted_iota(jnp.uint32, x.shape, axis) * jnp.uint32(stride % 2**32)
        stride *= x.shape[axis]
    weights = position * jnp.uint32(0x9E3779B1) | jnp.uint32(1)
    finite = jnp.isfinite(x).all() if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.asarray(True)
    return jnp.sum(bits * weights, dtype=jnp.uint32), finite


_digest_tree = jax.jit(lambda tree: jax.tree.map(_leaf_digest, tree))


def _name(path) -> str:
    """`params/layers/attn/o` for a tree path."""
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def _digests(tree) -> dict[str, tuple[int, bool]]:
    """Every array of `tree` by name: (checksum, finite), computed where the arrays live (one jitted reduction; on
    several hosts a collective call, the results replicated)."""
    out = jax.device_get(_digest_tree(tree))
    leaves = jax.tree_util.tree_flatten_with_path(out, is_leaf=lambda v: isinstance(v, tuple))[0]
    return {_name(path): (int(c), bool(f)) for path, (c, f) in leaves}


def _data_crc(data) -> int:
    return zlib.crc32(json.dumps(data, sort_keys=True).encode())


def base_hash(model: Decoder) -> str:
    """A hash of the parameters `model` does not train (under LoRA its frozen base: the checksums of its arrays,
    computed where they live), which a LoRA checkpoint records: its adapters mean nothing on another base."""
    frozen = nnx.state(model, lambda path, v: isinstance(v, nnx.Param) and not isinstance(v, trainable(model)))
    digests = _digests(nnx.to_pure_dict(frozen))
    return hashlib.sha256(json.dumps(sorted(digests.items())).encode()).hexdigest()[:16]


def _manifest(step: int, state: dict, data, record: dict | None, config_hash: str, model_hash: str = "") -> dict:
    digests = _digests(state)
    arrays = {}
    for path, x in jax.tree_util.tree_flatten_with_path(state)[0]:
        checksum, finite = digests[_name(path)]
        arrays[_name(path)] = {"shape": list(x.shape), "dtype": str(x.dtype), "checksum": checksum,
                               "finite": finite}
    return {"format": MANIFEST_FORMAT, "step": step, "config_hash": config_hash, "config": record,
            "data_crc32": _data_crc(data), "arrays": arrays, **({"model_hash": model_hash} if model_hash else {})}


def _some(names: list[str]) -> str:
    return names[0] + (f" and {len(names) - 1} other arrays" if len(names) > 1 else "")


def _fault(state, data, manifest: dict | None) -> str:
    """What is wrong with a restored `state` (and `data`, when not None) against its `manifest` (None: written
    without one; finiteness only), or "" when nothing is."""
    digests = _digests(state)
    non_finite = [name for name, (_, finite) in digests.items() if not finite]
    if non_finite:
        return f"non-finite values in {_some(non_finite)}"
    if manifest is None:
        return ""
    saved = manifest["arrays"]
    dtypes = {_name(path): str(x.dtype) for path, x in jax.tree_util.tree_flatten_with_path(state)[0]}
    changed = [name for name, (checksum, _) in digests.items()
               if name in saved and saved[name]["dtype"] == dtypes[name] and saved[name]["checksum"] != checksum]
    if changed:
        return f"checksum mismatch against its manifest in {_some(changed)}"
    if data is not None and _data_crc(data) != manifest["data_crc32"]:
        return "the data iterator's state does not match its manifest's CRC-32"
    return ""


def _why(error: BaseException) -> str:
    """One line for an exception: its innermost cause's first line (TensorStore's `OUT_OF_RANGE: ...` rather than
    Orbax's wrapper with the whole spec), at most 300 characters."""
    inner = error
    for _ in range(20):
        if (inner.__cause__ or inner.__context__) is None:
            break
        inner = inner.__cause__ or inner.__context__
    lines = str(inner).strip().splitlines() or str(error).strip().splitlines() or [""]
    line = f"{type(inner).__name__}: {lines[0]}"
    return line if len(line) <= 300 else line[:297] + "..."


def steps_on_disk(directory: str | os.PathLike) -> list[int]:
    """The finished step directories of a checkpoint directory (digit names; Orbax's temporary ones are not),
    ascending; none when it does not exist. A listing of the storage, without Orbax."""
    directory = epath.Path(directory)
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


class CheckpointWriteError(ConfigError):
    """A checkpoint that could not be written (a full disk, lost permissions: the storage's fault, reported in one
    line). `last_saved` is the newest step on disk (None: none), the step a rerun resumes from."""

    def __init__(self, step: int, directory, error: BaseException | str, last_saved: int | None):
        chain, inner = [], error
        for _ in range(20):
            if inner is None or isinstance(inner, str):
                break
            chain.append(str(inner))
            inner = inner.__cause__ or inner.__context__
        text = " ".join(chain)
        full = "No space left on device" in text or "os_error_code='28'" in text or "[Errno 28]" in text
        cause = error if isinstance(error, str) else ("no space left on device (the disk is full)" if full
                                                       else _why(error))
        then = (f"the run resumes from the checkpoint of step {last_saved}" if last_saved is not None
                else "the run starts over")
        super().__init__(f"the checkpoint of step {step} could not be written to {directory}: {cause}; free space "
                         f"there (or fix its permissions) and rerun: {then}")
        self.last_saved = last_saved


class _OrbaxErrors(logging.Filter):
    """Drops Orbax's own error logs (a failed background save logs one traceback per thread): every such error
    reaches the caller as an exception, which `Checkpointer` reports in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno >= logging.ERROR and f"{os.sep}orbax{os.sep}" in record.pathname)


_ORBAX_ERRORS = _OrbaxErrors()


class _Unusable(Exception):
    """A step that does not restore or does not pass the check; the message says why."""


def _move(src: epath.Path, dst: epath.Path) -> None:
    """Move a directory: a rename on a local file system, a copy then a delete on an object store (`gs://`), where
    renaming a directory is not one operation."""
    if "://" not in str(src):
        src.rename(dst)
        return

    def copy(a: epath.Path, b: epath.Path) -> None:
        b.mkdir(parents=True, exist_ok=True)
        for child in a.iterdir():
            copy(child, b / child.name) if child.is_dir() else child.copy(b / child.name, overwrite=True)

    copy(src, dst)
    src.rmtree()


class Checkpointer:
    """Save every `save_every` steps (0: only when forced), keep the last `keep` (and the last `keep` finite ones),
    resume from the latest usable one (module docstring). `record` (the run's config as a JSON dict,
    `rrc_jax.config.config_record`) and `config_hash` are recorded in each step's manifest: what `trained_config`
    reads back. `create=False` reads a directory that must exist (another run's) without ever creating it."""

    def __init__(self, directory: str | os.PathLike, save_every: int = 0, keep: int = 2,
                 record: dict | None = None, config_hash: str = "", create: bool = True, model_hash: str = ""):
        directory = epath.Path(directory).expanduser()
        self.directory = directory if "://" in str(directory) else directory.absolute()
        self.save_every = save_every
        self.keep = keep
        self.record, self.config_hash, self.model_hash = record, config_hash, model_hash
        # steps known to hold non-finite arrays (False) or checked / saved finite (True); others count as finite
        self._finite: dict[int, bool] = {}
        self._saved = False  # nothing is rotated before this checkpointer has saved (a failed resume deletes nothing)
        options = ocp.CheckpointManagerOptions(max_to_keep=None, create=create, enable_async_checkpointing=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options,
                                             item_names=("state", "data", "manifest"))
        self._in_flight: int | None = None  # the step whose asynchronous save may still be running
        self._failed = False  # a save failed (and was reported)
        if _ORBAX_ERRORS not in logging.getLogger("absl").filters:
            logging.getLogger("absl").addFilter(_ORBAX_ERRORS)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def steps(self) -> list[int]:
        """The saved steps, newest first, as process 0 lists them (every host gets the same list)."""
        steps = sorted(self.manager.all_steps(), reverse=True)
        if jax.process_count() == 1:
            return steps
        n = int(distributed.main_value(np.int64(len(steps))))
        padded = np.full(n, -1, np.int64)
        padded[:min(n, len(steps))] = steps[:n]
        return [int(s) for s in distributed.main_value(padded)]

    def manifest(self, step: int) -> dict | None:
        """The manifest of `step` (module docstring), None for a checkpoint written without one; raises `_Unusable`
        when it is there but unreadable."""
        if not (self.directory / str(step) / "manifest").exists():
            return None
        try:
            out = self.manager.restore(step, args=ocp.args.Composite(manifest=ocp.args.JsonRestore()))
            manifest = dict(out["manifest"])
            if manifest.get("format") != MANIFEST_FORMAT or not isinstance(manifest.get("arrays"), dict):
                raise ValueError(f"not a format-{MANIFEST_FORMAT} manifest")
            return manifest
        except Exception as e:  # noqa: BLE001 - any read error is a fault of this step
            raise _Unusable(f"its manifest is unreadable ({_why(e)})") from e

    def trained_config(self) -> dict | None:
        """The config (as a JSON dict) recorded in the newest readable manifest that has one, None when no
        checkpoint records one (none saved yet, or written before manifests held the config)."""
        for step in self.steps():
            try:
                manifest = self.manifest(step)
            except _Unusable:
                continue
            if manifest is not None and isinstance(manifest.get("config"), dict):
                return manifest["config"]
        return None

    def maybe_save(self, step: int, learner: Learner, data_iter, force: bool = False) -> bool:
        if not force and not (self.save_every and step % self.save_every == 0):
            return False
        self.wait()  # what Orbax's save does first anyway; then rotate what has finished
        if step in self.manager.all_steps():
            return True
        state = _state_tree(learner, step)
        data = json.loads(json.dumps(data_iter.get_state(), default=int))
        manifest = _manifest(step, state, data, self.record, self.config_hash, self.model_hash)
        non_finite = [name for name, a in manifest["arrays"].items() if not a["finite"]]
        self._finite[step] = not non_finite
        if non_finite:
            say(f"the checkpoint of step {step} holds non-finite values ({_some(non_finite)}); rotation keeps the "
                f"last {self.keep} finite checkpoints besides it")
        self._saved = True
        self._check_space(step, state)
        self._in_flight = step
        with self._writing():
            saved = self.manager.save(step, args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data),
                manifest=ocp.args.JsonSave(manifest)), force=True)
        fault_points.reached("save", step)
        return saved

    @contextlib.contextmanager
    def _writing(self):
        """Any failure of the save in flight (raised by Orbax when it starts, is waited for or checked) as a
        one-line `CheckpointWriteError`."""
        try:
            yield
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001 - TensorStore, OS and Orbax errors alike: the storage failed
            step, self._in_flight, self._failed = self._in_flight, None, True
            raise CheckpointWriteError(step, self.directory, e, self._on_disk(exclude=step)) from None

    def _check_space(self, step: int, state: dict) -> None:
        """A `CheckpointWriteError` before the save starts when the local disk has less room than the checkpoint's
        arrays take (their bytes, plus 64 KiB of metadata): a save that fails half-written makes Orbax's and
        TensorStore's background threads print their own tracebacks, and leaves a partial directory behind."""
        if "://" in str(self.directory):
            return
        need = sum(x.nbytes for x in jax.tree.leaves(state)) + 2**16
        free = shutil.disk_usage(self.directory).free if self.directory.exists() else need
        if distributed.main_value(np.asarray(free < need)):
            self._failed = True
            raise CheckpointWriteError(step, self.directory, f"no space left on device (the disk is full: "
                                       f"{free / 2**20:.1f} MiB free, the checkpoint needs {need / 2**20:.1f} MiB)",
                                       self._on_disk())

    def _on_disk(self, exclude: int | None = None) -> int | None:
        """The newest finished step directory (not `exclude`), None when there is none."""
        return max((s for s in steps_on_disk(self.directory) if s != exclude), default=None)

    def check(self) -> None:
        """Raise `CheckpointWriteError` now if the save in flight has already failed (before a step is logged, so
        that no step past a failed save is)."""
        if self._in_flight is not None:
            with self._writing():
                self.manager.check_for_errors()

    def _read(self, step: int, target: dict, params_only: bool = False) -> tuple[dict, object, dict | None]:
        """`step`'s state restored onto `target`'s shapes and shardings (`params_only`: `target` is `{"params":
        ...}`, the rest is not read), its data iterator state (None with `params_only`) and its manifest, checked;
        raises `_Unusable` (saying why) or, for arrays that do not fit `target`, `ConfigError`."""
        manifest = self.manifest(step)
        if manifest is not None:
            self._check_layout(step, manifest, target, params_only)
            saved = manifest.get("model_hash", "")
            if saved and self.model_hash and saved != self.model_hash:
                raise ConfigError(f"the checkpoint of step {step} in {self.directory} holds adapters trained on "
                                  f"another base model (model hash {saved}, this run's base {self.model_hash}): "
                                  "point config.models.policy at the base it was trained on, or give this run "
                                  "another workdir")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
        if params_only:
            items = dict(state=ocp.args.PyTreeRestore(
                abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract), partial_restore=True))
        else:
            items = dict(state=ocp.args.StandardRestore(abstract), data=ocp.args.JsonRestore())
        try:
            out = self.manager.restore(step, args=ocp.args.Composite(**items))
        except Exception as e:  # noqa: BLE001 - a missing / truncated file, any Orbax or TensorStore error
            raise _Unusable(f"it does not restore ({_why(e)})") from e
        state = {"params": out["state"]["params"]} if params_only else out["state"]
        data = None if params_only else out["data"]
        fault = _fault(state, data, manifest)
        if fault:
            raise _Unusable(fault)
        return state, data, manifest

    def _check_layout(self, step: int, manifest: dict, target: dict, params_only: bool) -> None:
        """A `ConfigError` unless the manifest's arrays are `target`'s (`params_only`: its `params/...` ones), by
        name and shape."""
        live = {_name(path): list(x.shape) for path, x in jax.tree_util.tree_flatten_with_path(target)[0]}
        saved = {name: a["shape"] for name, a in manifest["arrays"].items()
                 if not params_only or name.startswith("params/")}
        if live == saved:
            return
        differ = [f"{n} {saved.get(n, 'absent')} vs {live.get(n, 'absent')}"
                  for n in sorted(set(live) | set(saved)) if saved.get(n) != live.get(n)]
        raise ConfigError(f"the checkpoint of step {step} in {self.directory} holds other arrays than this run's "
                          f"model and optimizer (saved vs live: {'; '.join(differ[:3])}"
                          f"{f'; {len(differ) - 3} more' if len(differ) > 3 else ''}): resume with the config it was "
                          "written with, or give this run another workdir")

    def restore(self, learner: Learner, data_iter, step: int | None = None) -> int:
        """Load the latest (or given) step into `learner` and `data_iter`, checked; returns the step. Unlike
        `resume`, a faulty step is a `ConfigError` (nothing is moved)."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        try:
            state, data, _ = self._read(step, _state_tree(learner, step))
        except _Unusable as e:
            raise ConfigError(f"the checkpoint of step {step} in {self.directory} is unusable: {e}") from None
        learner.load_state(state)
        data_iter.set_state(data)
        return int(state["step"])

    def resume(self, learner: Learner, data_iter) -> int:
        """Restore the newest usable checkpoint, if there is one, into `learner` and `data_iter` (saying so);
        returns its step, 0 when there is none. Newer faulty steps are set aside (`set_aside`); when every step is
        faulty, nothing is moved and a `ConfigError` lists them (module docstring)."""
        faults: list[tuple[int, str]] = []
        for step in self.steps():
            try:
                state, data, manifest = self._read(step, _state_tree(learner, step))
                fault = ""
            except _Unusable as e:
                state, data, manifest, fault = None, None, None, str(e)
            if distributed.any_host(bool(fault)):
                faults.append((step, fault or "it failed the check on another host"))
                continue
            for bad, why in faults:
                self.set_aside(bad, why)
            learner.load_state(state)
            data_iter.set_state(data)
            self._finite[step] = True
            unchecked = "" if manifest is not None else " (written without a manifest: checked finite only)"
            say(f"resumed from the checkpoint of step {step} in {self.directory}{unchecked}")
            return int(state["step"])
        if faults:
            listed = "; ".join(f"step {s}: {why}" for s, why in faults)
            raise ConfigError(f"no usable checkpoint in {self.directory} ({listed}); nothing was moved: if the "
                              f"storage is fine, move the step directories to {self.directory / 'bad'} (or use "
                              "another workdir) to start this run from scratch")
        return 0

    def set_aside(self, step: int, why: str) -> None:
        """Move `step` to `directory/bad/<step>` (`<step>.1`, ... when taken), saying so and why; on every host
        (process 0 moves)."""
        self.manager.wait_until_finished()
        if distributed.is_main():
            bad = self.directory / "bad"
            bad.mkdir(parents=True, exist_ok=True)
            dest, n = bad / str(step), 0
            while dest.exists():
                n += 1
                dest = bad / f"{step}.{n}"
            _move(self.directory / str(step), dest)
            say(f"set aside the checkpoint of step {step} to {dest}: {why}")
        distributed.barrier(f"checkpoint_set_aside_{step}")
        self.manager.reload()
        self._finite.pop(step, None)

    def end_step(self, step: int, learner: Learner, data_iter, stop: StopSignals, *, last: bool) -> None:
        """After `step`: save when due, on the `last` step, or when any host got a stop signal; after a signal, wait
        for the save and exit with 128 + the signal's number."""
        signum = stop.agreed()
        self.maybe_save(step, learner, data_iter, force=last or bool(signum))
        if signum:
            self.wait()
            say(f"interrupted ({signal.Signals(signum).name}): checkpoint of step {step} saved in {self.directory}")
            sys.exit(128 + signum)

    def restore_params(self, model: Decoder) -> int:
        """Only the policy parameters of the latest step, into `model` (`--config.init_from`), checked (a faulty
        step is a `ConfigError`; nothing is moved in another run's directory)."""
        step = self.latest_step()
        if step is None:
            raise ConfigError(f"config.init_from: no checkpoint in {self.directory}")
        params = nnx.state(model, trainable(model))  # under LoRA the adapters: what a LoRA run's checkpoint holds
        try:
            restored, _, _ = self._read(step, {"params": nnx.to_pure_dict(params)}, params_only=True)
        except _Unusable as e:
            raise ConfigError(f"config.init_from: the checkpoint of step {step} in {self.directory} is unusable: "
                              f"{e}") from None
        nnx.replace_by_pure_dict(params, restored["params"])
        nnx.update(model, params)
        return step

    def wait(self) -> None:
        """Wait for the save in flight (a `CheckpointWriteError` if it failed), then rotate (module docstring)."""
        with self._writing():
            self.manager.wait_until_finished()
        self._in_flight = None
        self._rotate()

    def _rotate(self) -> None:
        """Delete every finished step but the `keep` newest and the `keep` newest finite ones."""
        if not self.keep or not self._saved:
            return
        steps = sorted(self.manager.all_steps(), reverse=True)
        finite = [s for s in steps if self._finite.get(s, True)]
        kept = set(steps[:self.keep]) | set(finite[:self.keep])
        for step in steps:
            if step not in kept:
                self.manager.delete(step)
                self._finite.pop(step, None)

    def close(self) -> None:
        """Wait for the save in flight and rotate, then release Orbax's threads; after a failed save (already
        reported), only the release."""
        if self._failed:  # let Orbax's other background writes of the failed save end before its threads close
            with contextlib.suppress(Exception):
                self.manager.wait_until_finished()
            with contextlib.suppress(Exception):
                self.manager.close()
            return
        try:
            self.wait()
        finally:
            self.manager.close()


class StopSignals:
    """SIGINT (Ctrl-C) and SIGTERM (a preempted Cloud TPU VM) noted instead of raised, so the loop finishes its step,
    saves a checkpoint and exits with 128 + the signal's number (`Checkpointer.end_step`). `agreed()` is the signal
    any host got (0 if none): every host stops after the same step."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.received = 0
        self._previous = {s: signal.signal(s, self._note) for s in self.SIGNALS}

    def _note(self, signum, _frame) -> None:
        self.received = self.received or signum

    def agreed(self) -> int:
        return int(distributed.host_concat(np.asarray([self.received])).max())

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


class Replay:
    """An iterator whose checkpointable state is how many items it has given: `set_state` on a fresh one draws (and
    drops) that many, so any deterministic iterator (the reward models' endless batch factories, whose random draws
    are seeded) resumes exactly where it stopped; the replay costs building the items, not training on them."""

    def __init__(self, items: Iterator):
        self.items = items
        self.given = 0

    def __iter__(self) -> Replay:
        return self

    def __next__(self):
        item = next(self.items)
        self.given += 1
        return item

    def get_state(self) -> dict:
        return {"given": self.given}

    def set_state(self, state: dict) -> None:
        if self.given:
            raise ValueError(f"Replay.set_state on an iterator that has already given {self.given} items: "
                             "restore into a fresh one")
        for _ in range(int(state["given"])):
            next(self)
