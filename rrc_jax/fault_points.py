"""Fault points: the moments at which this project's tests SIGKILL a trainer, to check that a resume gives the
metrics of an uninterrupted run whatever was under way.

`RRC_JAX_KILL_AT=PHASE:STEP` kills the process (SIGKILL: no handler runs, nothing is flushed) when it reaches
`PHASE` of step `STEP`: `judge` (the judge starts on that step's batch), `update` (the step's first optimizer update
is dispatched, not finished), `save` (that step's checkpoint is being written). Unset, `reached` does nothing.
"""

from __future__ import annotations

import os
import signal

ENV = "RRC_JAX_KILL_AT"


def reached(phase: str, step: int) -> None:
    """Kill this process now if `RRC_JAX_KILL_AT` names `phase` of `step`."""
    if os.environ.get(ENV) == f"{phase}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)
