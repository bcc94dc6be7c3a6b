"""A run's workdir: one writer at a time, and the config it trains under.

`WorkdirLock(workdir)` takes an exclusive OS file lock on `workdir/.lock` (`filelock`), held for the run and
released when it ends or its process dies, so a lock left by a killed run is stale by construction and the next
run takes it (saying so). The holder writes `host pid time` into `workdir/.lock.owner`, which the refusal names.
Only process 0 writes a workdir, so only process 0 locks it. A remote workdir (`gs://...`) cannot be file-locked:
the lock is skipped there, with one line saying so.

`check_resume(record, workdir, resume)` refuses, before anything loads, to resume a checkpoint under a config that
changes the optimization (`config_changes`: every field but `RESUMABLE_CHANGES`) unless `resume.allow_changes`
(`ResumeConfig`). What it
compares against is the config recorded in the newest readable checkpoint manifest (`Checkpointer.trained_config`),
so a deleted or damaged `config.json` never switches the check off; only checkpoints written before manifests held
the config fall back to `config.json`. `save_config` writes `config.json`, keeping a different earlier one as
`config.v<N>.json`. The GRPO trainer and `train_rm` use all three."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import time
from collections.abc import Mapping
from typing import ClassVar

import numpy as np

import filelock
from etils import epath

from rrc_jax import distributed
from rrc_jax.checkpoint import Checkpointer, steps_on_disk
from rrc_jax.errors import ConfigError
from rrc_jax.progress import say
from rrc_jax.settings import field_error, flat_fields


# Fields a resumed run may change freely: they do not alter the optimization (where and how it logs, evaluates,
# checkpoints and shards, memory-only settings; the run's length under a schedule that does not depend on it). A
# change to any other field is refused on resume. Not here: `reward.judge.max_batch` (the judge's random draws
# follow its chunks of questions) and, under a schedule that depends on it, `steps` (`resumable`).
RESUMABLE_CHANGES = ("steps", "workdir", "eval.", "log.", "checkpoint.", "distributed.", "mesh.", "resume.",
                     "toy.cache_dir", "reward.drm.max_batch", "rl.micro_batch_size", "rl.remat", "rl.logprob_chunk",
                     "rl.max_skipped_fraction", "rl.guard_window", "rl.max_param_growth",
                     # the judge's servers moved; its requests in flight; when a server of a pool is left out
                     "inference.url", "inference.concurrency", "inference.bench_after", "inference.bench_s",
                     # the reward service moved (its kind, judge and GRM are the service's config); set or cleared,
                     # it moves the judge into or out of this process, a change (`MOVES_ONLY`); how long a run
                     # waits for it
                     "reward.service_url", "reward.service_wait_s")
MOVES_ONLY = ("reward.service_url",)  # resumable from one address to another, not between set and empty


@dataclasses.dataclass(frozen=True)
class ResumeConfig:
    """How a rerun resumes its workdir's latest checkpoint (`resume`): a config that alters the optimization
    (`config_changes`) is refused unless `allow_changes`."""

    GROUP: ClassVar[str] = "resume"
    allow_changes: bool = False

    def __post_init__(self):
        if not isinstance(self.allow_changes, bool):
            raise field_error("resume", "allow_changes", f"{self.allow_changes!r}: use True or False")


def resumable(leaves: dict) -> tuple[str, ...]:
    """The prefixes of `RESUMABLE_CHANGES` for a config's flattened `leaves`: without `steps` when the learning
    rate's schedule depends on the run's length (`rl.lr_schedule` 'cosine': a longer run would decay on another
    curve from the resumed step on)."""
    if leaves.get("rl.lr_schedule", "constant") != "constant":
        return tuple(p for p in RESUMABLE_CHANGES if p != "steps")
    return RESUMABLE_CHANGES


def config_hash(record: Mapping) -> str:
    """A short hash of the fields that define a run's optimization (all but `resumable`'s) of a run's record (its
    config as a JSON dict, `rrc_jax.config.config_record`), kept in each checkpoint's manifest."""
    leaves = flat_fields(record)
    exempt = resumable(leaves)
    kept = {k: v for k, v in leaves.items() if not k.startswith(exempt)}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]


def config_changes(saved: dict, new: dict) -> list[str]:
    """`KEY: OLD -> NEW` for every field of two trainer configs (as JSON dicts) that differs and is not `resumable`
    (by the saved config's schedule), or is one of `MOVES_ONLY` set or cleared. A field only one of them has (added
    or removed by an upgrade of rrc-jax) is not a change."""
    a, b = flat_fields(saved), flat_fields(new)
    exempt = resumable(a)
    return [f"{k}: {a[k]!r} -> {b[k]!r}" for k in sorted(a.keys() & b.keys())
            if a[k] != b[k] and (not k.startswith(exempt) or (k in MOVES_ONLY and not (a[k] and b[k])))]


class WorkdirLock:
    """`with WorkdirLock(workdir): ...` holds the workdir for this process (module docstring); a `ConfigError`
    naming the holder when another live process holds it."""

    def __init__(self, workdir):
        self.workdir = epath.Path(workdir)
        self.local = "://" not in str(workdir)
        self._lock = filelock.FileLock(str(self.workdir / ".lock"), timeout=0) if self.local else None
        self.owner = self.workdir / ".lock.owner"

    def __enter__(self) -> WorkdirLock:
        if not distributed.is_main():
            return self
        if not self.local:
            say(f"note: {self.workdir} is remote and cannot be locked; run one trainer on it at a time")
            return self
        check_writable(self.workdir)
        previous = self.owner.read_text().strip() if self.owner.exists() else ""
        try:
            self._lock.acquire()
        except filelock.Timeout:
            raise ConfigError(f"{self.workdir} is in use by another trainer ({previous or 'owner unknown'}); wait "
                              "for it to finish, stop it, or give this run another workdir") from None
        if previous:
            say(f"took over a stale lock on {self.workdir} (its holder, {previous}, is gone)")
        self.owner.write_text(f"host {socket.gethostname()} pid {os.getpid()} since "
                              f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        return self

    def __exit__(self, *exc) -> None:
        if self._lock is not None and self._lock.is_locked:
            self.owner.unlink(missing_ok=True)
            self._lock.release()


def check_writable(workdir: epath.Path) -> None:
    """Create `workdir` if needed; a one-line `ConfigError` when it is a file or cannot be written (a read-only
    file system, no permission)."""
    if workdir.exists() and not workdir.is_dir():
        raise ConfigError(f"config.workdir: {workdir} is a file, not a directory; give a directory")
    probe = workdir / ".write_test"
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"config.workdir: {workdir} cannot be written ({type(e).__name__}: {e.strerror or e}); "
                          "give a writable directory") from None


def save_config(workdir: epath.Path, record: Mapping) -> None:
    """`workdir/config.json`, the run's record (process 0); a different one already there (a resume with
    `resume.allow_changes`) is kept as `config.v<N>.json` first, so every version a run trained under stays."""
    if not distributed.is_main():
        return
    path, text = workdir / "config.json", json.dumps(record, indent=2) + "\n"
    if path.exists() and path.read_bytes() != text.encode():
        n = 1 + sum(1 for _ in workdir.glob("config.v*.json"))
        path.rename(workdir / f"config.v{n}.json")
    path.write_text(text)


def check_resume(record: Mapping, workdir: epath.Path, resume: ResumeConfig) -> None:
    """Before anything loads: a workdir holding a checkpoint is resumed only under the config it was trained with
    (module docstring: the whole `record`, the run's config as a JSON dict, is compared), unless `resume.allow_changes`; a one-line `ConfigError`
    lists the changes, or says why the saved config cannot be read."""
    checkpoints = workdir / "checkpoints"
    resuming = bool(steps_on_disk(checkpoints))
    if resume.allow_changes or not distributed.main_value(np.asarray(resuming)):
        return
    ckpt = Checkpointer(checkpoints, create=False)
    try:
        saved = ckpt.trained_config()
    finally:
        ckpt.manager.close()
    saved = saved if saved is not None else _saved_config_file(workdir / "config.json")
    changes = config_changes(saved, record)
    if distributed.main_value(np.asarray(bool(changes))):
        raise ConfigError(f"{workdir} holds a checkpoint trained under another config; changed: "
                          f"{'; '.join(changes) or 'see process 0'}. Rerun with the saved flags, use another workdir, "
                          "or pass --config.resume.allow_changes=True")


def _saved_config_file(path: epath.Path) -> dict:
    """`config.json` of a workdir whose checkpoints do not record their config; a one-line `ConfigError` when it is
    missing or not a JSON object."""
    try:
        saved = json.loads(path.read_text())
        if not isinstance(saved, dict):
            raise ValueError(f"a JSON {type(saved).__name__}, not an object")
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is unreadable ({type(e).__name__}: {e}) and the checkpoints beside it were written "
                          "without their config, so this resume cannot be checked: restore the file, use another "
                          "workdir, or pass --config.resume.allow_changes=True") from None
    return saved
