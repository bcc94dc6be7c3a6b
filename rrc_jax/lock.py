"""One writer per workdir: a lock that stops a second trainer on the same workdir with one line.

`WorkdirLock(workdir)` takes an exclusive OS file lock on `workdir/.lock` (`filelock`), held for the run and
released when it ends or its process dies, so a lock left by a killed run is stale by construction and the next
run takes it (saying so). The holder writes `host pid time` into `workdir/.lock.owner`, which the refusal names.
Only process 0 writes a workdir, so only process 0 locks it. A remote workdir (`gs://...`) cannot be file-locked:
the lock is skipped there, with one line saying so.
"""

from __future__ import annotations

import os
import socket
import time

import filelock
from etils import epath

from rrc_jax import distributed
from rrc_jax.errors import ConfigError
from rrc_jax.progress import say


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
        self.workdir.mkdir(parents=True, exist_ok=True)
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
