"""Matches played with the judge as comparator (beyond the paper): fewer questions than a round robin.

SCR's adaptive orderings (`reward.scr.ordering`): `merge_sort` orders each group in ceil(log2 m) batched merge levels (at most m ceil(log2 m) comparisons per
prompt); `knockout` plays a single-elimination bracket (m - 1 comparisons in ceil(log2 m) batched rounds). Both
return the order and its Eq. 21 rewards (`rrc_jax.rewards.order_rewards`). `play` runs any of the tournaments whose
rules are in `rrc_jax.rewards.tournament_rules` (Swiss, double elimination, seeded knockout, circular) and returns
their standings. Every comparison of a round, across all prompts, is one batched judge call; on several hosts each
host judges its own prompts and every host asks as many rounds as the longest tournament needs.

Shapes: B prompts, m responses per prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from rrc_jax import distributed
from rrc_jax.judge.judge import Judge, check_groups
from rrc_jax.rewards._checks import check_votes
from rrc_jax.rewards import order_rewards


class Ordering(NamedTuple):
    """`order [B, m]` response indices best first; `rewards [B, m]` float32, Eq. 21 with alpha = 1
    (`m - 1 - position`); `queries [B]` pairs compared (each asked V times)."""

    order: np.ndarray
    rewards: np.ndarray
    queries: np.ndarray


def _outcomes(judge: Judge, prompts, responses, duels, votes, swap, outcome=None, order=None,
              tag=None) -> list[int]:
    """One batched round: for each (b, i, j), +1 when the majority of its V votes prefers i, -1 when it prefers j, 0
    when they split or abstain. `outcome`: stop a duel's votes once its majority is decided (`Judge.pair_votes`; the
    same outcomes). `order(b, i, j)`: 0 shows vote 0 as (i, j), 1 as (j, i) (default `(b + i + j) % 2`); `tag(i, j)`:
    what a trace record says of the duel (default `{"i": i, "j": j}`). A host without duels still takes part (the call
    is collective on several hosts)."""
    g = [d[0] for d in duels]
    order = order or (lambda b, i, j: (b + i + j) % 2)
    tag = tag or (lambda i, j: {"i": i, "j": j})
    pv, _ = judge.pair_votes(prompts, g, [responses[b][i] for b, i, _ in duels],
                             [responses[b][j] for b, _, j in duels], votes, swap,
                             orders=[order(b, i, j) for b, i, j in duels],
                             tags=[tag(i, j) for _, i, j in duels], outcome=outcome)
    return [int(x) for x in np.sign(pv.wins.astype(np.int64) - pv.losses)]


def _duel(judge: Judge, prompts, responses, duels, votes, swap) -> list[bool]:
    """One batched round: for each (b, i, j), True iff i is preferred (ties and abstentions keep i first)."""
    return [o >= 0 for o in _outcomes(judge, prompts, responses, duels, votes, swap)]


def play(judge: Judge, prompts: Sequence[str], responses: Sequence[Sequence[str]], rules: Sequence,
         votes: int = 1, swap: bool = True, *, early_stop: bool = False, order=None, tag=None) -> np.ndarray:
    """Each prompt's rounds `rules[b]` (a tournament, `rrc_jax.rewards.tournament_rules`, or an adaptive schedule,
    `rrc_jax.rewards.adaptive`) played to their end: every round's duels of every group asked in one batched judge
    call (V votes each, A/B swapped across votes with `swap`, stopped once decided with `early_stop`: the same
    outcomes), the outcomes recorded in the rules. `responses[b]`: the texts rule b's pairs index; `order`, `tag`: as
    `_outcomes`'s. Returns the duels `[B]` each group played."""
    check_votes(votes)
    check_groups(responses, "tournament responses")
    queries = np.zeros(len(prompts), np.int64)
    while True:
        rounds = [rule.pairs() for rule in rules]
        duels = [(b, i, j) for b, pairs in enumerate(rounds) for i, j in pairs]
        if not distributed.any_host(bool(duels)):  # every host asks as many rounds as the longest tournament
            break
        outcomes = _outcomes(judge, prompts, responses, duels, votes, swap, np.sign if early_stop else None, order,
                             tag)
        k = 0
        for b, pairs in enumerate(rounds):
            if pairs:
                rules[b].record(pairs, outcomes[k:k + len(pairs)])
                k, queries[b] = k + len(pairs), queries[b] + len(pairs)
    return queries


def merge_sort(judge: Judge, prompts: Sequence[str], responses: Sequence[Sequence[str]], votes: int = 1,
               swap: bool = True) -> Ordering:
    """Order each group by bottom-up merge sort with the judge as comparator.

    ceil(log2 m) merge levels; within a level every active merge of every prompt asks its next comparison in
    one batched judge call, so a level takes at most 2^(level+1) - 1 calls and the whole sort at most
    m ceil(log2 m) comparisons per prompt (each asked `votes` times). A tie keeps the left run's response
    first (stable)."""
    check_votes(votes)
    m = check_groups(responses, "merge_sort responses")
    bsz = len(prompts)
    runs = [[[i] for i in range(m)] for _ in range(bsz)]
    queries = np.zeros(bsz, np.int64)
    while distributed.any_host(any(len(r) > 1 for r in runs)):
        merges = []  # [b, left, right, out]
        next_runs: list[list] = [[] for _ in range(bsz)]
        for b in range(bsz):
            for t in range(0, len(runs[b]), 2):
                if t + 1 < len(runs[b]):
                    merge = [b, list(runs[b][t]), list(runs[b][t + 1]), []]
                    merges.append(merge)
                    next_runs[b].append(merge[3])
                else:
                    next_runs[b].append(runs[b][t])
        while True:
            active = [mg for mg in merges if mg[1] and mg[2]]
            if not distributed.any_host(bool(active)):  # every host asks as many rounds as the longest merge
                break
            results = _duel(judge, prompts, responses, [(mg[0], mg[1][0], mg[2][0]) for mg in active], votes,
                                 swap)
            for mg, left_first in zip(active, results):
                queries[mg[0]] += 1
                mg[3].append((mg[1] if left_first else mg[2]).pop(0))
        for mg in merges:
            mg[3].extend(mg[1] + mg[2])
        runs = next_runs
    order = np.array([r[0] for r in runs], np.int64).reshape(bsz, m)
    return Ordering(order, order_rewards(order), queries)

def knockout(judge: Judge, prompts: Sequence[str], responses: Sequence[Sequence[str]], votes: int = 1,
             swap: bool = True) -> Ordering:
    """Single-elimination bracket: m - 1 comparisons per prompt in ceil(log2 m) batched rounds (an odd one out
    gets a bye). The order ranks by rounds survived (the champion first), ties by index; Eq. 21 rewards of
    that order."""
    check_votes(votes)
    m = check_groups(responses, "knockout responses")
    bsz = len(prompts)
    alive = [list(range(m)) for _ in range(bsz)]
    survived = np.zeros((bsz, m), np.int64)
    queries = np.zeros(bsz, np.int64)
    while distributed.any_host(any(len(a) > 1 for a in alive)):
        duels = [(b, a[t], a[t + 1]) for b, a in enumerate(alive) for t in range(0, len(a) - 1, 2)]
        results = _duel(judge, prompts, responses, duels, votes, swap)
        winners: list[list[int]] = [[] for _ in range(bsz)]
        for (b, i, j), left in zip(duels, results):
            queries[b] += 1
            winners[b].append(i if left else j)
        for b, a in enumerate(alive):
            if len(a) > 1 and len(a) % 2:
                winners[b].append(a[-1])  # bye
            if len(a) > 1:
                for w in winners[b]:
                    survived[b, w] += 1
                alive[b] = winners[b]
    order = np.stack([np.lexsort((np.arange(m), -survived[b])) for b in range(bsz)]) if bsz else \
        np.zeros((0, m), np.int64)
    return Ordering(order, order_rewards(order), queries)

