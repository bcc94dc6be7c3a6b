"""What one decoding step's weight matmuls cost on this backend, by the number of rows M (the batch size).

    python benchmarks/matmul_rows.py [--rows=1,2,4,8,16,64 --repeats=10 --out=FILE]

Times `x [M, E] @ W [E, N]` for the weight shapes of the model in `benchmarks/sampler.py` (E = 384, I = 1024,
V = 8192: the fused qkv, o, gate_up, down and LM head), fp32, with enough distinct copies of each W (about 120 MB)
that every product reads its weight from memory, as a decoding step does. Prints microseconds per product and the
weight bytes read per second, and writes benchmarks/results/matmul_rows.json.

A decoding step at batch size M is bound by memory when these products run near the bandwidth of a plain read
(M = 1); the batch-8 target of `benchmarks/sampler.py` needs M = 8 to run close to that. On XLA's CPU backend
(jax 0.10) every M from 2 to 8 costs about the same, about twice M = 1: the kernel's own work per product, not
the rows, sets the time. Re-run this after a jax upgrade to see whether that has changed.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import numpy as np
from absl import flags

from rrc_jax import cli

SHAPES = {"qkv": (384, 640), "o": (384, 384), "gate_up": (384, 2048), "down": (1024, 384), "lm_head": (384, 8192)}
COPY_BYTES = 120e6


def chain(x, weights):
    """`x @ w` for each of `weights` in turn, each product's first E columns (tiled when N < E) feeding the next,
    so that the products run one after another as in a decoding step."""
    import jax.numpy as jnp

    e = x.shape[1]
    for w in weights:
        y = x @ w
        x = jnp.tile(y, (1, -(-e // y.shape[1])))[:, :e] * 0.5
    return x


def time_products(x, weights, repeats: int) -> float:
    """Best seconds per product of `x` with each of `weights`, chained (`chain`) in one jit call."""
    import jax

    f = jax.jit(chain)
    jax.block_until_ready(f(x, weights))
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(f(x, weights))
        best = min(best, time.perf_counter() - t)
    return best / len(weights)


def define_flags() -> None:
    """The benchmark's flags (module docstring)."""
    flags.DEFINE_string("rows", "1,2,4,8,16,64", "Row counts M to time, comma-separated.")
    flags.DEFINE_integer("repeats", 10, "Timed calls per product (the best counts).")
    flags.DEFINE_string("out", None, "JSON path (default: benchmarks/results/matmul_rows.json).")


def run() -> None:
    """Time every weight shape at every `--rows`; print the table, write the JSON (module docstring)."""
    args = flags.FLAGS
    cli.check_at_least(1, "repeats")
    try:
        rows_list = [int(m) for m in args.rows.split(",")]
    except ValueError:
        raise cli.flag_error("rows", "must be whole numbers, comma-separated, e.g. --rows=1,2,4,8") from None
    if min(rows_list) < 1:
        raise cli.flag_error("rows", "each must be >= 1")

    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    results = []
    for name, (e, n) in SHAPES.items():
        copies = max(2, int(COPY_BYTES / (e * n * 4)))
        weights = [jnp.asarray(rng.standard_normal((e, n), np.float32)) for _ in range(copies)]
        for m in rows_list:
            s = time_products(jnp.ones((m, e), jnp.float32), weights, args.repeats)
            results.append({"weight": name, "e": e, "n": n, "rows": m, "us": s * 1e6, "gb_s": e * n * 4 / s / 1e9})
        del weights

    print(f"\nfp32 x [M, E] @ W [E, N], weights read from memory; jax {jax.__version__} ({jax.default_backend()})")
    print(f"{'weight':>8} {'E x N':>11} " + " ".join(f"{'M=' + str(m):>14}" for m in rows_list))
    for name, (e, n) in SHAPES.items():
        cells = [r for r in results if r["weight"] == name]
        print(f"{name:>8} {f'{e}x{n}':>11} " + " ".join(f"{r['us']:6.0f}us {r['gb_s']:4.1f}GB/s" for r in cells))
    out = Path(args.out or Path(__file__).parent / "results" / "matmul_rows.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"jax": jax.__version__, "backend": jax.default_backend(), "machine": platform.machine(),
                               "cpus": os.cpu_count(), "results": results}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    define_flags()
    cli.start(cli.flags_main(run))
