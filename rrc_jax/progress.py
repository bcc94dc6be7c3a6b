"""Progress on stderr, process 0 only: a dependency-free progress bar with rate and ETA, and status lines."""

from __future__ import annotations

import sys
import time

import jax


def say(message: str) -> None:
    """A status line on stderr, from process 0 only."""
    if jax.process_index() == 0:
        print(message, file=sys.stderr, flush=True)


class Progress:
    """`with Progress(total, desc) as bar: bar.update(n, **postfix)`; redraws at most every `interval` seconds."""

    def __init__(self, total: int, desc: str = "", *, interval: float = 0.5, stream=None, start: int = 0):
        self.total, self.desc, self.interval = int(total), desc, interval
        self.stream = stream or sys.stderr
        self.n = self.start = int(start)
        self.t0 = self._last = time.time()
        self.postfix = ""
        self._drawn = -1
        self.enabled = jax.process_index() == 0

    def update(self, n: int = 1, **postfix) -> None:
        self.n += n
        if postfix:
            self.postfix = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in postfix.items())
        now = time.time()
        if now - self._last >= self.interval or self.n >= self.total:
            self._last = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        if not self.enabled or self._drawn == self.n:
            return
        self._drawn = self.n
        done = self.n - self.start
        elapsed = now - self.t0
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.n) / rate if rate > 0 else float("nan")
        frac = self.n / self.total if self.total else 1.0
        bar = "#" * int(frac * 24)
        eta_s = f"{int(eta // 60)}:{int(eta % 60):02d}" if eta == eta else "?"
        self.stream.write(f"\r{self.desc} [{bar:<24}] {self.n}/{self.total} {rate:.2f}it/s eta {eta_s} {self.postfix}"
                          f"\033[K")
        self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self._draw(time.time())
            self.stream.write("\n")
            self.stream.flush()
