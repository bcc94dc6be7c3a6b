"""The per-step compile metrics (`rrc_jax.compiles`): JAX's compile events counted between laps."""

import jax
import numpy as np

from rrc_jax.compiles import CompileLap


def test_a_lap_counts_the_programs_compiled_since_the_last_and_those_loaded_from_the_persistent_cache():
    """A new function compiles one program; its second call none; a new shape one more. Dropped from memory
    (`jax.clear_caches`), it is loaded from the persistent cache the tests run with (conftest): a program and a hit."""
    x = np.arange(5, dtype=np.float32)  # made before the lap: no program of its own
    lap = CompileLap()
    f = jax.jit(lambda v: v * 3.0 + 1.0)
    f(x)
    first = lap.lap()
    assert first["time/compile_programs"] == 1 and first["time/compile_cache_hits"] in (0, 1)
    assert first["time/compile"] > 0
    f(x)
    assert lap.lap() == {"time/compile": 0.0, "time/compile_programs": 0, "time/compile_cache_hits": 0}
    f(x[:3])
    assert lap.lap()["time/compile_programs"] == 1
    jax.clear_caches()
    f(x)
    again = lap.lap()
    assert again["time/compile_programs"] == 1 and again["time/compile_cache_hits"] == 1


def test_laps_of_two_owners_do_not_take_each_others_counts():
    x = np.arange(7, dtype=np.float32)
    a = CompileLap()
    jax.jit(lambda v: v - 2.0)(x)
    b = CompileLap()
    jax.jit(lambda v: v / 2.0)(x)
    assert a.lap()["time/compile_programs"] == 2 and b.lap()["time/compile_programs"] == 1
