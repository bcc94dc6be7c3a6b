"""The programs this process compiles, from JAX's compile events (`jax.monitoring`), reported per step.

A jitted function compiles once for each new input shape. The judge's question shapes change with the responses'
lengths (`rrc_jax.inference.question_tree` buckets them), so a run keeps meeting new programs for a while, and a step
that compiles is slower for it: the trainer logs, each step (evaluation included, every thread of this process):

- `time/compile`: seconds tracing, lowering and compiling or loading programs;
- `time/compile_programs`: programs compiled or loaded from JAX's persistent cache (`JAX_COMPILATION_CACHE_DIR`);
- `time/compile_cache_hits`: those of them loaded from that cache.

They are under `time/` because, like the other timings, they depend on the process (a resumed run compiles its
programs again) and not on the run's arithmetic.
"""

from __future__ import annotations

import threading

import jax

_TRACE, _LOWER, _BACKEND = ("/jax/core/compile/jaxpr_trace_duration",
                            "/jax/core/compile/jaxpr_to_mlir_module_duration",
                            "/jax/core/compile/backend_compile_duration")  # the last includes a persistent-cache load
_CACHE_HIT = "/jax/compilation_cache/cache_hits"


class CompileEvents:
    """Running totals of this process's compile events: seconds, programs, persistent-cache hits."""

    def __init__(self):
        self._lock = threading.Lock()
        self.seconds, self.programs, self.cache_hits = 0.0, 0, 0

    def on_duration(self, event: str, seconds: float, **_) -> None:
        if event in (_TRACE, _LOWER, _BACKEND):
            with self._lock:
                self.seconds += seconds
                self.programs += event == _BACKEND

    def on_event(self, event: str, **_) -> None:
        if event == _CACHE_HIT:
            with self._lock:
                self.cache_hits += 1

    def totals(self) -> tuple[float, int, int]:
        with self._lock:
            return self.seconds, self.programs, self.cache_hits


_events: CompileEvents | None = None
_registered = threading.Lock()


def events() -> CompileEvents:
    """The process's `CompileEvents`, listening from the first call on."""
    global _events
    with _registered:
        if _events is None:
            _events = CompileEvents()
            jax.monitoring.register_event_duration_secs_listener(_events.on_duration)
            jax.monitoring.register_event_listener(_events.on_event)
        return _events


class CompileLap:
    """`lap()`: the module docstring's metrics for the compiles since the last lap (or since construction)."""

    def __init__(self):
        self._events = events()
        self._last = self._events.totals()

    def lap(self) -> dict[str, float]:
        now = self._events.totals()
        seconds, programs, hits = (a - b for a, b in zip(now, self._last))
        self._last = now
        return {"time/compile": seconds, "time/compile_programs": programs, "time/compile_cache_hits": hits}
