"""Reward-construction benchmarks: jit win counting vs literal Python, greedy CARA cost, greedy-vs-exact gap.

    python benchmarks/rewards.py [--quick]

Prints a table and writes benchmarks/results/rewards.json. Targets: jit SCR win counting at B=1024,
m=16, V=8 at least 100x faster than a literal Python Algorithm 1; greedy CARA under 1 ms per group at m=16.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from rrc_jax import cli
from rrc_jax.rewards import cara_order, kemeny_disagreement, kemeny_exact, scr_rewards
from rrc_jax.rewards.win_counts import _scr_rewards

RESULTS = Path(__file__).resolve().parent / "results" / "rewards.json"


def noisy_counts(rng: np.random.Generator, batch: int, m: int, votes: int, quality_scale: float = 1.0,
                 p_abstain: float = 0.1) -> np.ndarray:
    """``[batch, m, m]`` vote counts: a vote prefers i over j with probability sigmoid(q_i - q_j); some abstain."""
    q = rng.normal(scale=quality_scale, size=(batch, m))
    p = 1.0 / (1.0 + np.exp(-(q[:, :, None] - q[:, None, :])))
    cast = rng.binomial(votes, 1.0 - p_abstain, size=(batch, m, m))
    first = rng.binomial(cast, p)
    upper = np.triu(np.ones((m, m), dtype=bool), k=1)
    c = np.where(upper, first, 0) + np.swapaxes(np.where(upper, cast - first, 0), 1, 2)
    return c.astype(np.int32)


def algorithm1_literal(c: list, m: int, alpha: float) -> list:
    """Algorithm 1 without CARA, literally: lines 9-12 (majority weights), 22 (sort by win count), 23-24."""
    w = [[0] * m for _ in range(m)]
    for i in range(m):
        for j in range(i + 1, m):
            c_ij, c_ji = c[i][j], c[j][i]  # lines 3-8 (the votes, already counted)
            if c_ij >= c_ji:
                w[i][j], w[j][i] = c_ij, c_ji
            else:
                w[j][i], w[i][j] = c_ji, c_ij
    wins = [sum(1 for j in range(m) if j != i and w[i][j] > w[j][i]) for i in range(m)]
    pi = sorted(range(m), key=lambda i: -wins[i])  # line 22
    position = {o: k for k, o in enumerate(pi)}
    return [alpha * sum(1 for j in range(m) if j != i and position[i] < position[j]) for i in range(m)]  # 23-24


def best_time(fn, repeats: int, inner: int = 1) -> float:
    """Best wall time of ``repeats`` runs of ``inner`` calls, per call, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - start) / inner)
    return best


def bench_win_counting(rng, batch=1024, m=16, votes=8) -> dict:
    counts = noisy_counts(rng, batch, m, votes)
    device_counts = jnp.asarray(counts)
    alpha = jnp.asarray(0.1, jnp.float32)
    scr_rewards(device_counts, 0.1).block_until_ready()  # compile
    timed = {
        # What a trainer calls: validated (shapes, option, non-negative counts), then the jit kernel.
        "jit_public_device_ms": lambda: scr_rewards(device_counts, 0.1).block_until_ready(),
        # Counts parsed on host: validation in numpy plus the host-to-device copy.
        "jit_public_numpy_ms": lambda: scr_rewards(counts, 0.1).block_until_ready(),
        "jit_kernel_ms": lambda: _scr_rewards(device_counts, alpha, "half").block_until_ready(),
    }
    row = {"batch": batch, "group": m, "votes": votes}
    for name, fn in timed.items():
        row[name] = best_time(fn, repeats=5, inner=20) * 1e3
    nested = counts.tolist()
    row["literal_python_ms"] = best_time(lambda: [algorithm1_literal(nested[b], m, 0.1) for b in range(batch)], 3) * 1e3
    for name in timed:
        row["speedup_" + name.removesuffix("_ms").removeprefix("jit_")] = row["literal_python_ms"] / row[name]
    return row


def bench_cara_time(rng, sizes=(8, 16, 64), groups=200) -> list[dict]:
    rows = []
    for m in sizes:
        n = groups if m <= 16 else max(groups // 4, 10)
        counts = noisy_counts(rng, n, m, votes=8)
        per_group = best_time(lambda: [cara_order(c) for c in counts], repeats=3) / n
        row = {"group": m, "groups": n, "greedy_ms_per_group": per_group * 1e3}
        if m <= 16:
            k = max(n // (20 if m == 16 else 2), 3)
            row["exact_ms_per_group"] = best_time(lambda: [kemeny_exact(c) for c in counts[:k]], repeats=1) / k * 1e3
        rows.append(row)
    return rows


def bench_gap(rng, cases=((8, 400), (12, 100), (16, 30)), quality_scales=(0.3, 1.0)) -> list[dict]:
    rows = []
    for m, n in cases:
        for scale in quality_scales:
            counts = noisy_counts(rng, n, m, votes=8, quality_scale=scale, p_abstain=0.2)
            greedy = np.array([kemeny_disagreement(c, cara_order(c)) for c in counts])
            exact = np.array([kemeny_disagreement(c, kemeny_exact(c)) for c in counts])
            assert np.all(greedy >= exact - 1e-9)
            gap = greedy - exact
            rows.append({
                "group": m, "groups": n, "quality_scale": scale,
                "mean_disagreement_exact": float(exact.mean()), "mean_disagreement_greedy": float(greedy.mean()),
                "mean_relative_gap": float(np.mean(gap / np.maximum(exact, 1e-12))),
                "max_gap": float(gap.max()), "greedy_optimal_share": float(np.mean(gap <= 1e-9)),
            })
    return rows


def define_flags() -> None:
    """The benchmark's flags (module docstring)."""
    flags.DEFINE_bool("quick", False, "Fewer groups (a smoke run).")


def run() -> None:
    """Time every benchmark, print the tables and write the JSON (module docstring)."""
    args = flags.FLAGS
    rng = np.random.default_rng(0)

    win = bench_win_counting(rng, batch=256 if args.quick else 1024)
    cara = bench_cara_time(rng, groups=40 if args.quick else 200)
    gap = bench_gap(rng, cases=((8, 50), (12, 10)) if args.quick else ((8, 400), (12, 100), (16, 30)))

    print(f"\nSCR win counting, B={win['batch']}, m={win['group']}, V={win['votes']} ({jax.default_backend()})")
    print(f"  {'implementation':<36}{'ms / batch':>12}{'speedup':>10}")
    print(f"  {'literal Python Algorithm 1':<36}{win['literal_python_ms']:>12.2f}{1.0:>10.0f}x")
    for key, label in (("public_device", "scr_rewards(device counts)"), ("public_numpy", "scr_rewards(numpy counts)"),
                       ("kernel", "jit kernel alone")):
        print(f"  {label:<36}{win['jit_' + key + '_ms']:>12.3f}{win['speedup_' + key]:>10.0f}x")

    print("\nCARA time per group (noisy tournaments, V=8)")
    print(f"  {'m':>4}{'greedy ms':>12}{'exact ms':>12}")
    for row in cara:
        exact = f"{row['exact_ms_per_group']:>12.2f}" if "exact_ms_per_group" in row else f"{'-':>12}"
        print(f"  {row['group']:>4}{row['greedy_ms_per_group']:>12.3f}{exact}")

    print("\nGreedy vs exact Kemeny disagreement (Eq. 19), V=8, 20% abstentions")
    print(f"  {'m':>4}{'noise':>8}{'groups':>8}{'exact':>10}{'greedy':>10}{'rel gap':>10}{'max gap':>9}{'optimal':>9}")
    for row in gap:
        noise = "high" if row["quality_scale"] < 1 else "low"
        print(f"  {row['group']:>4}{noise:>8}{row['groups']:>8}{row['mean_disagreement_exact']:>10.2f}"
              f"{row['mean_disagreement_greedy']:>10.2f}{100 * row['mean_relative_gap']:>9.2f}%{row['max_gap']:>9.1f}"
              f"{100 * row['greedy_optimal_share']:>8.0f}%")

    report = {
        "environment": {"jax": jax.__version__, "backend": jax.default_backend(), "cpu_count": os.cpu_count(),
                        "python": platform.python_version(), "machine": platform.machine()},
        "win_counting": win, "cara_time": cara, "greedy_vs_exact": gap,
        "targets": {"win_counting_speedup_ge_100x": win["speedup_public_device"] >= 100,
                    "greedy_m16_under_1ms": next(r for r in cara if r["group"] == 16)["greedy_ms_per_group"] < 1.0},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    define_flags()
    cli.start(cli.flags_main(run))
