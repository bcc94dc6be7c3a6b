"""Progress on stderr, process 0 only: a `tqdm` bar and status lines.

On a terminal the bar is tqdm's own, redrawn in place. Anywhere else (a log file, a pipe, a batch job's stderr)
in-place redraws would be thousands of `\\r`-joined fragments, so the bar writes one complete line per update
interval (30 s unless told otherwise) and a last one when it closes; that is the same tqdm bar with its `display`
and `clear` writing lines instead of redrawing. The interval is `Progress(..., interval=)` or tqdm's own
`TQDM_MININTERVAL` environment variable.
"""

from __future__ import annotations

import os
import sys

import jax
from tqdm import tqdm


def say(message: str) -> None:
    """A status line on stderr, from process 0 only; on a terminal, above the progress bar (tqdm redraws it)."""
    if jax.process_index() != 0:
        return
    if sys.stderr.isatty():
        tqdm.write(message, file=sys.stderr)
    else:
        print(message, file=sys.stderr, flush=True)


def update_interval(interval: float | None, interactive: bool) -> float:
    """Seconds between two draws: `interval`, else `$TQDM_MININTERVAL`, else 0.1 on a terminal and 30 off one."""
    if interval is not None:
        return interval
    return float(os.environ.get("TQDM_MININTERVAL", 0.1 if interactive else 30.0))


def format_postfix(values: dict[str, object]) -> dict[str, str]:
    """`{name: value}` for the bar's postfix, floats to 4 significant digits (tqdm's own rounding keeps 3)."""
    return {k: f"{v:.4g}" if isinstance(v, float) else str(v) for k, v in values.items()}


class Progress(tqdm):
    """`with Progress(total, desc, start=step) as bar: bar.update(n, **postfix)`, drawn by process 0 only.

    `start`: the count already done (a resumed run), from which rate and ETA are measured. `stream`: stderr by
    default. Off a terminal each draw is a whole line (module docstring) and the rate is the average since `start`.
    """

    monitor_interval = 0  # tqdm's monitor thread only tunes `miniters`, which is fixed at 1 here

    def __init__(self, total: int, desc: str = "", *, start: int = 0, interval: float | None = None, stream=None):
        stream = stream or sys.stderr
        self.interactive = stream.isatty()
        super().__init__(total=total, desc=desc, initial=start, file=stream, miniters=1,
                         mininterval=update_interval(interval, self.interactive), dynamic_ncols=self.interactive,
                         leave=self.interactive, smoothing=0.3 if self.interactive else 0.0,
                         disable=jax.process_index() != 0)

    def update(self, n: int = 1, **postfix) -> bool | None:
        """Advance by `n` and show `postfix` (e.g. `reward=0.5`) after the counts."""
        if postfix:
            self.set_postfix(format_postfix(postfix), refresh=False)
        return super().update(n)

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        """Off a terminal: the bar as one new line; a request to blank it (`msg=''`) has nothing to blank."""
        if self.interactive:
            return super().display(msg, pos)
        if msg is None:
            self.fp.write(f"{self}\n")
            self.fp.flush()
        return msg is None

    def clear(self, nolock: bool = False) -> None:
        """Off a terminal there is no line in place to clear."""
        if self.interactive:
            super().clear(nolock)

    def close(self) -> None:
        """Off a terminal, a last line with the final count unless the last update drew it (with `leave=False`,
        tqdm itself draws nothing more)."""
        if not (self.disable or self.interactive) and self.last_print_n < self.n:
            self.refresh()
        super().close()
