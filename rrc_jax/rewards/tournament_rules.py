"""The rules of the judged tournaments (beyond the paper): who meets whom, round by round, and the standing they
leave, for one group of m responses. Pure host-side logic: `rrc_jax.judge.matches.play` asks the judge each
round's duels of every group in one batched call and feeds the outcomes back.

A rule object has `pairs()` (the next round's duels `(i, j)`, empty when the tournament is over), `record(pairs,
outcomes)` (each outcome +1: i won, -1: j won, 0: a tie, the votes split or abstained) and `standing()` (`[m]`, higher
is better, equal for responses the tournament does not tell apart). Every tournament's reward is its standing turned
into a rank reward (`rank_rewards`): one scale, 0 .. alpha (m - 1), whatever the format and however many duels each
response played, the scale of SCR's win counts and of Eq. 21 (as ArenaRL turns a tournament's ranking into rewards).

* `Circular` (NeMo Gym's `circular`): response i against i + 1 (mod m), one round, m duels (one for m = 2); standing:
  wins, a tie half.
* `Swiss` (ArenaRL): R rounds; each pairs the responses by current score, best first, every response with the best
  ranked one it has not met (backtracking so that everyone is paired: guaranteed for R <= m / 2); with m odd, the
  lowest ranked response without a bye sits the round out (half a point, as a tie: it tells nothing). R floor(m / 2)
  duels; standing: the score (wins, a tie half).
* `DoubleElimination`: a response is out after its second loss. Each round the unbeaten play among themselves and
  the once-beaten among themselves (adjacent by index; an odd one out waits), until one unbeaten and one once-beaten
  remain: they meet in the final, and if the once-beaten wins, again (the bracket reset). A tie goes to the response
  listed first. 2m - 2 duels, or 2m - 1 after a reset; standing: the round a response went out (the champion last).
* `SeededKnockout` (ArenaRL's seeded single elimination): the responses seeded by a cheap first signal (best first)
  into the standard bracket (seed 1 meets seed P in round one, P = m rounded up to a power of 2; the top seeds get
  the byes; seeds 1 and 2 can meet only in the final); a tie goes to the better seed. m - 1 duels; standing: rounds
  won.

Shapes: m responses.
"""

from __future__ import annotations

import math

import numpy as np

Pair = tuple[int, int]


def rank_rewards(standing, alpha: float = 1.0) -> np.ndarray:
    """Rank rewards `[m]` float32 of a standing `[m]`: alpha x (the responses below + half those level with it),
    i.e. alpha (m - 1 - position), Eq. 21, averaged over the positions of responses that tie."""
    s = np.asarray(standing, np.float64)
    below = (s[None, :] < s[:, None]).sum(1)
    level = (s[None, :] == s[:, None]).sum(1) - 1
    return (alpha * (below + 0.5 * level)).astype(np.float32)


class Circular:
    """i against i + 1 (mod m): one round of m duels (module docstring)."""

    def __init__(self, m: int):
        self.m, self.done, self.score = m, False, np.zeros(m)

    def pairs(self) -> list[Pair]:
        if self.done or self.m < 2:
            return []
        return [(0, 1)] if self.m == 2 else [(i, (i + 1) % self.m) for i in range(self.m)]

    def record(self, pairs: list[Pair], outcomes: list[int]) -> None:
        _score(self.score, pairs, outcomes)
        self.done = True

    def standing(self) -> np.ndarray:
        return self.score.copy()


def _score(score: np.ndarray, pairs: list[Pair], outcomes: list[int]) -> None:
    for (i, j), o in zip(pairs, outcomes):
        score[i] += 1.0 if o > 0 else 0.5 if o == 0 else 0.0
        score[j] += 1.0 if o < 0 else 0.5 if o == 0 else 0.0


class Swiss:
    """R rounds paired by score, no pair twice (module docstring)."""

    def __init__(self, m: int, rounds: int):
        if m > 1 and not 1 <= rounds <= max(1, m // 2):
            raise ValueError(f"a Swiss tournament of {m} responses takes 1 to {max(1, m // 2)} rounds (m / 2: every "
                             f"round can then pair everyone with a new opponent), got {rounds}")
        self.m, self.rounds, self.played = m, rounds, 0
        self.score, self.met, self.byes = np.zeros(m), set(), set()

    def ranked(self) -> list[int]:
        """The responses by score, best first, ties by index."""
        return sorted(range(self.m), key=lambda i: (-self.score[i], i))

    def pairs(self) -> list[Pair]:
        if self.played >= self.rounds or self.m < 2:
            return []
        order = self.ranked()
        if self.m % 2:  # the lowest ranked without a bye sits out
            bye = next(i for i in reversed(order) if i not in self.byes)
            order = [i for i in order if i != bye]
        pairs = self._match(order)
        if pairs is None:
            raise RuntimeError(f"no pairing of round {self.played + 1} avoids a repeat (rounds must be <= m / 2)")
        return pairs

    def _match(self, order: list[int]) -> list[Pair] | None:
        """Pair `order` (best first): its first with the best ranked one it has not met whose removal leaves the rest
        pairable; None when no pairing avoids a repeat."""
        if not order:
            return []
        first, rest = order[0], order[1:]
        for k, other in enumerate(rest):
            if frozenset((first, other)) in self.met:
                continue
            tail = self._match(rest[:k] + rest[k + 1:])
            if tail is not None:
                return [(first, other)] + tail
        return None

    def record(self, pairs: list[Pair], outcomes: list[int]) -> None:
        _score(self.score, pairs, outcomes)
        sat_out = set(range(self.m)) - {i for p in pairs for i in p}
        self.score[list(sat_out)] += 0.5  # a bye tells nothing: half a point, as a tie
        self.byes |= sat_out
        self.met |= {frozenset(p) for p in pairs}
        self.played += 1

    def standing(self) -> np.ndarray:
        return self.score.copy()


class DoubleElimination:
    """Out after two losses, with a final and its reset (module docstring)."""

    def __init__(self, m: int):
        self.m, self.losses, self.out_round, self.round = m, np.zeros(m, np.int64), np.full(m, -1), 0

    def alive(self, losses: int) -> list[int]:
        return [i for i in range(self.m) if self.losses[i] == losses]

    def pairs(self) -> list[Pair]:
        unbeaten, beaten = self.alive(0), self.alive(1)
        if len(unbeaten) + len(beaten) <= 1:
            return []
        if len(unbeaten) == 1 and len(beaten) == 1:  # the final, the unbeaten listed first (its reset: two beaten)
            return [(unbeaten[0], beaten[0])]
        return [(pool[k], pool[k + 1]) for pool in (unbeaten, beaten) for k in range(0, len(pool) - 1, 2)]

    def record(self, pairs: list[Pair], outcomes: list[int]) -> None:
        self.round += 1
        for (i, j), o in zip(pairs, outcomes):
            loser = j if o >= 0 else i  # a tie goes to the first listed
            self.losses[loser] += 1
            if self.losses[loser] == 2:
                self.out_round[loser] = self.round

    def standing(self) -> np.ndarray:
        return np.where(self.out_round < 0, self.round + 1, self.out_round).astype(np.float64)


def bracket_order(size: int) -> list[int]:
    """The standard seeded bracket of `size` (a power of 2) slots: seed numbers (0 = best) in slot order, so that slot
    pairs (0, 1), (2, 3), ... are round one and seeds 0 and 1 can meet only in the final: [0, 1] -> [0, 3, 1, 2]
    -> [0, 7, 3, 4, 1, 6, 2, 5]."""
    order = [0]
    while len(order) < size:
        n = 2 * len(order)
        order = [s for seed in order for s in (seed, n - 1 - seed)]
    return order


class SeededKnockout:
    """Single elimination in the standard seeded bracket (module docstring). `seeds [m]`: the first signal, higher is
    better (ties by index)."""

    def __init__(self, m: int, seeds):
        seeds = np.asarray(seeds, np.float64)
        self.m = m
        by_seed = sorted(range(m), key=lambda i: (-seeds[i], i))  # response of seed 0, 1, ...
        size = 1 << max(0, math.ceil(math.log2(max(m, 1))))
        self.slots = [by_seed[s] if s < m else None for s in bracket_order(size)]  # None: a bye
        self.rank = {r: s for s, r in enumerate(by_seed)}
        self.wins = np.zeros(m)

    def pairs(self) -> list[Pair]:
        if len([s for s in self.slots if s is not None]) <= 1:
            return []
        out = []
        for k in range(0, len(self.slots), 2):
            a, b = self.slots[k], self.slots[k + 1]
            if a is not None and b is not None:
                out.append((a, b) if self.rank[a] < self.rank[b] else (b, a))  # the better seed first
        return out

    def _advance(self, winners: dict[tuple[int, int], int]) -> None:
        nxt = []
        for k in range(0, len(self.slots), 2):
            a, b = self.slots[k], self.slots[k + 1]
            nxt.append(a if b is None else b if a is None else winners[(min(a, b), max(a, b))])
        self.slots = nxt

    def record(self, pairs: list[Pair], outcomes: list[int]) -> None:
        winners = {}
        for (i, j), o in zip(pairs, outcomes):
            w = i if o >= 0 else j  # a tie goes to the better seed (listed first)
            self.wins[w] += 1
            winners[(min(i, j), max(i, j))] = w
        self._advance(winners)

    def standing(self) -> np.ndarray:
        return self.wins.copy()
