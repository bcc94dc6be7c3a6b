"""How imperfect a toy judge is: the README's and the study's figures for the toy GRM, on evaluation-split prompts.

`audit(judge, task)` measures, with one judgment per question (the judge's own sampling temperature):

- `error_rate`: over held-out pairs of unequal oracle quality, each judged once in each A/B order, the share of
  judgments that do not name the better response (an abstention counts as an error); `close_error_rate` the same
  over the close pairs (oracle qualities within one position of each other);
- `position_inconsistency`: the share of pairs whose two orders do not name the same winner;
- `intransitive_triad_rate`: over groups of distinct responses to one prompt (demonstrations, some padded), each
  pair judged once (A/B order alternating), the share of the group's triads that form a strict cycle (Eq. 18);
- `accuracy` and `position_consistency` as `rrc_jax.rm.accuracy.evaluate` reports them (a tie counts half).
"""

from __future__ import annotations

from math import comb

import numpy as np

from rrc_jax.data.toy.task import SortTask, oracle_quality, sample_response, toy_preferences
from rrc_jax.judge import Judge
from rrc_jax.rewards import scr_diagnostics
from rrc_jax.rm.accuracy import evaluate


def _distinct_group(task: SortTask, digits: str, m: int, rng: np.random.Generator) -> list[str]:
    out: list[str] = []
    while len(out) < m:
        r = sample_response(task, digits, rng)
        if r not in out:
            out.append(r)
    return out


def audit(judge: Judge, task: SortTask, *, pairs: int = 512, groups: int = 64, group_size: int = 6,
          seed: int = 0) -> dict[str, float]:
    """The judge's imperfection (module docstring) on `pairs` held-out pairs and `groups` held-out groups."""
    rng = np.random.default_rng([seed, 50])
    prefs = toy_preferences(task, pairs, rng, held_out=True, name="audit")
    result, records = evaluate("pairwise", prefs, judge=judge, votes=1)
    # per pair: judgments naming the better response in order 1 (chosen shown as A) and order 2
    right = np.array([[r["order1"]["chosen"], r["order2"]["chosen"]] for r in records], np.float64)  # [N, 2]
    digits = [p.prompt[:-1] for p in prefs]
    gap = np.array([abs(oracle_quality(d, p.chosen) - oracle_quality(d, p.rejected)) * len(d)
                    for d, p in zip(digits, prefs)])
    close = gap < 1.5
    prompts = [task.prompt(rng, held_out=True) for _ in range(groups)]
    responses = [_distinct_group(task, d, group_size, rng) for d in prompts]
    counts = judge.round_robin([task.prompt_text(d) for d in prompts], responses, votes=1, swap=True)
    triads = np.asarray(scr_diagnostics(counts, votes=1)["intransitive_triads"], np.float64)
    return {
        "pairs": float(pairs), "close_pairs": float(close.sum()),
        "error_rate": float(1 - right.mean()),
        "close_error_rate": float(1 - right[close].mean()) if close.any() else float("nan"),
        "position_inconsistency": float(np.mean(right[:, 0] != right[:, 1])),
        "intransitive_triad_rate": float(triads.mean() / comb(group_size, 3)),
        "accuracy": float(result["accuracy"]), "position_consistency": float(result["position_consistency"]),
    }
