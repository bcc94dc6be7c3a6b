"""Which pairs to ask and how to count the pairs not asked, on a simulated judge: groups of m responses with
standard-normal qualities, a judge whose verdict on (i, j) is right with probability sigmoid(c |q_i - q_j|), c set
so that its error rate is `--error_rate` (the toy world's judge audits at 0.272, results/study/audit.json). Each
schedule's rewards against the true qualities, Kendall tau-b within a group (`rrc_jax.rl.fidelity`, the study's
fidelity), mean and 95% interval over `--groups` groups:

- the round robin (SCR's m(m - 1) / 2 pairs), Swiss (3 rounds, the study's), seeded knockout seeded by index;
- `active` (`rrc_jax.rewards.adaptive.ActiveRoundRobin`) at `--budgets` pairs, a pair not asked counting half a win
  (what it does), and the same rounds counting it by the Bradley-Terry fit's probability instead (the completion
  it does not use), and by its strengths alone;
- again with each group's responses drawn from `--pool` texts (copies, as a sharpening policy's; the judge's
  verdict on two copies a coin flip): the round robin, which asks about copies, against `active` and the round
  robin without the copies' pairs, which do not.

    python benchmarks/schedules.py [--groups=4000 --m=8 --error_rate=0.272 --budgets=12,14]

Prints a markdown table and writes benchmarks/results/schedules.json.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from absl import flags

from rrc_jax import cli
from rrc_jax.rewards.adaptive import ActiveRoundRobin, bradley_terry, copy_classes, win_probabilities
from rrc_jax.rewards.tournament_rules import SeededKnockout, Swiss
from rrc_jax.rl.fidelity import kendall_tau

flags.DEFINE_integer("groups", 4000, "Simulated groups.")
flags.DEFINE_integer("m", 8, "Responses a group.")
flags.DEFINE_float("error_rate", 0.272, "The judge's error rate over random pairs.")
flags.DEFINE_list("budgets", ["12", "14"], "active's pairs a group.")
flags.DEFINE_integer("pool", 5, "Texts a group's responses are drawn from in the second simulation (copies).")
flags.DEFINE_integer("seed", 0, "The simulation's seed.")
flags.DEFINE_string("out", str(Path(__file__).parent / "results" / "schedules.json"), "JSON path.")


def sharpness(error_rate: float, rng) -> float:
    """c of the judge sigmoid(c (q_i - q_j)) whose error rate over random pairs of N(0, 1) qualities is
    `error_rate` (bisection on a fixed sample of pairs)."""
    gaps = np.abs(rng.normal(size=200_000) - rng.normal(size=200_000))
    lo, hi = 1e-3, 100.0
    for _ in range(60):
        c = (lo + hi) / 2
        lo, hi = (c, hi) if np.mean(1 / (1 + np.exp(c * gaps))) > error_rate else (lo, c)
    return (lo + hi) / 2


def play(rule, verdict) -> None:
    while pairs := rule.pairs():
        rule.record(pairs, [verdict(i, j) for i, j in pairs])


def simulate(rng, c: float, m: int, budgets: list[int], groups: int, pool: int = 0) -> dict:
    """Kendall tau of each schedule over `groups` groups; `pool` > 0: each group's m responses drawn with replacement
    from `pool` texts (two copies of a text: the judge's verdict a coin flip), as a sharpening policy repeats
    itself; 0: m different texts."""
    taus: dict[str, list[float]] = {}
    asked: list[int] = []  # pairs the round robin without copies asks

    def add(name, rewards, q):
        taus.setdefault(name, []).append(float(kendall_tau(np.asarray(rewards, float)[None], q[None])[0]))

    for _ in range(groups):
        texts = rng.integers(pool, size=m) if pool else np.arange(m)
        q = rng.normal(size=max(pool, m))[texts]
        copies = copy_classes([str(x) for x in texts])
        verdict = lambda i, j: 1 if rng.random() < 1 / (1 + np.exp(-c * (q[i] - q[j]))) else -1  # noqa: E731
        full = ActiveRoundRobin(m, 1.0)
        play(full, verdict)
        add(f"round robin ({m * (m - 1) // 2} pairs)", full.rewards(), q)
        swiss = Swiss(m, 3)
        play(swiss, verdict)
        add(f"swiss, 3 rounds ({3 * (m // 2)} pairs)", swiss.standing(), q)
        knockout = SeededKnockout(m, -np.arange(m))
        play(knockout, verdict)
        add(f"seeded knockout by index ({m - 1} pairs)", knockout.standing(), q)
        for b in budgets:
            rule = ActiveRoundRobin(m, b / (m * (m - 1) // 2) + 1e-6, copies=copies)
            play(rule, verdict)
            add(f"active (at most {b} pairs): a pair not asked half a win", rule.rewards(), q)
            if pool:
                continue
            p = win_probabilities(bradley_terry(rule.wins))
            off = ~(rule.asked | np.eye(m, dtype=bool))
            add(f"active ({b} pairs): a pair not asked the fit's probability",
                (np.where(rule.asked, rule.score, 0.0) + np.where(off, p, 0.0)).sum(1), q)
            add(f"active ({b} pairs): the fit's strengths", bradley_terry(rule.wins), q)
        if pool:
            rule = ActiveRoundRobin(m, 1.0, copies=copies)
            play(rule, verdict)
            add("round robin without the copies' pairs", rule.rewards(), q)
            asked.append(rule.questions)
    rows = {}
    for name, values in taus.items():
        x = np.asarray([v for v in values if math.isfinite(v)])
        rows[name] = {"tau": float(x.mean()), "ci95": float(1.96 * x.std(ddof=1) / math.sqrt(len(x))), "n": len(x)}
    if asked:
        rows["round robin without the copies' pairs"]["pairs"] = float(np.mean(asked))
    return rows


def run(args) -> dict:
    rng = np.random.default_rng(args.seed)
    c, m = sharpness(args.error_rate, rng), args.m
    budgets = [int(b) for b in args.budgets]
    return {"groups": args.groups, "m": m, "error_rate": args.error_rate, "sharpness": c, "seed": args.seed,
            "pool": args.pool, "schedules": simulate(rng, c, m, budgets, args.groups),
            "copies": simulate(rng, c, m, budgets, args.groups, args.pool)}


def main(argv) -> None:
    cli.no_arguments(argv)
    result = cli.exit_on_user_error(run, flags.FLAGS)
    print(f"A judge of error rate {result['error_rate']} (sharpness {result['sharpness']:.3f}), {result['groups']} "
          f"groups of {result['m']}: Kendall tau-b of each schedule's rewards against the true qualities.\n")
    for key, title in (("schedules", f"{result['m']} different texts"),
                       ("copies", f"responses drawn from {result['pool']} texts")):
        print(f"{title}:\n\n| schedule | Kendall tau |\n| --- | --- |")
        for name, row in result[key].items():
            pairs = f" ({row['pairs']:.1f} pairs on average)" if "pairs" in row else ""
            print(f"| {name}{pairs} | {row['tau']:.3f} ± {row['ci95']:.3f} |")
        print()
    out = Path(flags.FLAGS.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    cli.start(main)
