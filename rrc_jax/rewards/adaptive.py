"""Adaptive comparison schedules (beyond the paper): a group's comparisons asked in rounds, each round's chosen from
what the earlier rounds showed, so that a group costs fewer judge questions than SCR's round robin or AGR's full
anchor set, at a stated price in fidelity. Pure host-side logic with the tournaments' interface
(`rrc_jax.rewards.tournament_rules`): `pairs()` (the next round's comparisons `(i, j)`, empty when done),
`record(pairs, outcomes)` (+1: i won, -1: j won, 0: a tie, the votes split or abstained) and `rewards(alpha)`;
`rrc_jax.judge.matches.play` asks each round of every group in one batched judge call.

* `ActiveRoundRobin` (SCR's scale): each round a matching of the most uncertain pairs not yet asked under a
  Bradley-Terry fit of the outcomes so far (`bradley_terry`; the first round pairs 0-1, 2-3, ...; then pairs whose
  fitted strengths are closest, as a Swiss round pairs equal scores), until `budget` pairs are asked. Its reward is
  SCR's win count (Eq. 16) over every pair: a pair asked scores its verdict (a tie per SCR's `ties` rule), a pair
  not asked half a win, what no verdict is worth either way (so that a response met once less is not a win
  poorer). With a `tolerance`, a pair the fit predicts with probability >= 1 - tolerance scores its favourite's win
  instead, and a group stops before its budget once every pair not asked is so predicted. With every pair asked it
  is SCR's reward (below: copies). (Completing the pairs not asked by the fit's probabilities instead ranked worse, in
  Kendall tau against the truth, on a simulated judge as noisy as the toy world's: benchmarks/README.md, "Which
  pairs to ask".)
* `SequentialAnchors` (AGR's scale): each response meets its prompt's anchors in order, `first` of them in the first
  round and `step` more a round, and stops once the anchors it has not met cannot move its reward by more than
  `tolerance` anchors in the sense of a posterior standard deviation: the wins left follow a beta-binomial under a
  uniform prior on the response's win rate against the anchors (`wins_left`). Its reward is AGR's count (Eq. 22,
  a tie per AGR's `ties` rule) completed by that posterior's mean. With `tolerance = 0` every response meets every
  anchor: AGR's reward (below: copies).

Neither asks the judge about two copies of one text, whose verdict says nothing of them (`copy_classes`): two
responses of a group with one text, or a response and an anchor it copies, score half a win each, what the judge's
coin-flip verdict on them is worth on average. A GRPO group repeats itself as the policy sharpens (of the pairs of
the toy world's groups of 8, 13 to 26% are two copies), and a round robin asks about every such pair. Copies of a
text against other texts are asked as any pair: each is another draw of the judge's verdict.

Neither stop is exact: a pair not asked could have gone either way, and each one moves the win counts (Eq. 16, 22).
What is exact is stopping a pair's votes once its majority is decided (`reward.judge.early_stop`, `Judge.pair_votes`),
which these schedules use inside every comparison as SCR and AGR do.

Shapes: m responses a group, n anchors a prompt.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rrc_jax.rewards.tournament_rules import Pair

PRIOR_SCALE = 1.0  # the Bradley-Terry strengths' Gaussian prior (standard deviation, in logits)


def tie_credit(ties: str) -> float:
    """What a tied comparison scores for the response: SCR's and AGR's `ties` rules ('zero', 'half', 'win')."""
    return {"zero": 0.0, "half": 0.5, "win": 1.0}[ties]


def bradley_terry(wins: np.ndarray, prior_scale: float = PRIOR_SCALE, iters: int = 50) -> np.ndarray:
    """The maximum a posteriori Bradley-Terry strengths `[m]` of the outcomes `wins [m, m]` (`wins[i, j]`: how often i
    beat j, a tie half to each), P(i beats j) = sigmoid(s_i - s_j), under a Gaussian prior N(0, prior_scale^2) on
    each strength (so that a group whose outcomes separate it perfectly still has finite strengths). Newton's
    method on the strictly concave log posterior."""
    w = np.asarray(wins, np.float64)
    m = w.shape[0]
    n = w + w.T
    s = np.zeros(m)
    for _ in range(iters):
        p = win_probabilities(s)
        grad = (w - n * p).sum(1) - s / prior_scale ** 2
        c = n * p * (1 - p)
        hess = c - np.diag(c.sum(1) + 1.0 / prior_scale ** 2)
        step = np.linalg.solve(hess, grad)
        s = s - step
        if np.max(np.abs(step)) < 1e-10:
            break
    return s


def win_probabilities(strengths: np.ndarray) -> np.ndarray:
    """`[m, m]` P(i beats j) = sigmoid(s_i - s_j) of Bradley-Terry strengths `[m]`."""
    s = np.asarray(strengths, np.float64)
    return 1.0 / (1.0 + np.exp(s[None, :] - s[:, None]))


def budget_pairs(m: int, budget: float) -> int:
    """The pairs a group of m may ask under `budget`, a fraction of the round robin's m(m - 1) / 2 (at least 1)."""
    return max(1, math.floor(budget * (m * (m - 1) // 2) + 1e-9))


def copy_classes(texts: Sequence[str]) -> np.ndarray:
    """`[m]` int: for each text, the index of its first copy in `texts` (itself when it is the first)."""
    first: dict[str, int] = {}
    return np.array([first.setdefault(x, i) for i, x in enumerate(texts)], np.int64)


class ActiveRoundRobin:
    """Uncertainty-driven rounds of pairs (module docstring). `budget`: the most pairs it asks, a fraction of the
    round robin's; `tolerance`: a pair the fit predicts with probability >= 1 - tolerance stands in for a verdict
    (its favourite wins), and a group stops early once every pair not asked is so predicted (0: never); `ties`:
    SCR's rule for a tied comparison; `copies [m]` (`copy_classes`): two responses of one text are never asked
    about (half a win each)."""

    def __init__(self, m: int, budget: float = 0.5, *, ties: str = "zero", tolerance: float = 0.0,
                 copies: Sequence[int] | None = None):
        self.m, self.limit, self.ties, self.tolerance = m, budget_pairs(m, budget), ties, tolerance
        copies = np.arange(m) if copies is None else np.asarray(copies, np.int64)
        self.copy = (copies[:, None] == copies[None, :]) & ~np.eye(m, dtype=bool)  # [m, m]: two copies of a text
        self.wins = np.zeros((m, m))  # wins[i, j]: i's wins over j, a tie half to each (the fit's data)
        self.score = np.zeros((m, m))  # score[i, j]: what comparison (i, j) scores for i under `ties`
        self.asked = np.zeros((m, m), bool)
        self.stopped = False  # the tolerance stopped it before its budget
        self.p = np.full((m, m), 0.5)  # the fit's P(i beats j)

    @property
    def questions(self) -> int:
        return int(np.triu(self.asked, 1).sum())

    def open_pairs(self) -> list[Pair]:
        return [(i, j) for i in range(self.m) for j in range(i + 1, self.m)
                if not self.asked[i, j] and not self.copy[i, j]]

    def sure(self) -> np.ndarray:
        """`[m, m]` bool: the pairs not asked whose prediction stands in for a verdict (`tolerance`)."""
        off = ~(self.asked | self.copy | np.eye(self.m, dtype=bool))
        return off & (np.minimum(self.p, 1 - self.p) <= self.tolerance) if self.tolerance > 0 else \
            np.zeros_like(off)

    def pairs(self) -> list[Pair]:
        left, candidates = self.limit - self.questions, self.open_pairs()
        if self.stopped or left <= 0 or not candidates:
            return []
        sure = self.sure()
        if self.questions and all(sure[ij] for ij in candidates):
            self.stopped = True
            return []
        p, met = self.p, self.asked.sum(1)
        # the most uncertain first (p(1 - p) largest), then the pair whose responses were compared least, then index
        ranked = sorted(candidates, key=lambda ij: (-round(p[ij] * (1 - p[ij]), 12), met[ij[0]] + met[ij[1]], ij))
        used: set[int] = set()
        out = []
        for i, j in ranked:
            if len(out) == left:
                break
            if i not in used and j not in used:
                out.append((i, j))
                used |= {i, j}
        return out

    def record(self, pairs: list[Pair], outcomes: list[int]) -> None:
        tie = tie_credit(self.ties)
        for (i, j), o in zip(pairs, outcomes):
            self.asked[i, j] = self.asked[j, i] = True
            self.wins[i, j] += 1.0 if o > 0 else 0.5 if o == 0 else 0.0
            self.wins[j, i] += 1.0 if o < 0 else 0.5 if o == 0 else 0.0
            self.score[i, j] = 1.0 if o > 0 else tie if o == 0 else 0.0
            self.score[j, i] = 1.0 if o < 0 else tie if o == 0 else 0.0
        self.p = win_probabilities(bradley_terry(self.wins))

    def rewards(self, alpha: float = 1.0) -> np.ndarray:
        """`[m]` float32: alpha x Eq. 16's win count over every pair, a pair asked scoring its verdict (a tie per
        `ties`), a pair the tolerance predicts surely its favourite's win, any other pair not asked (two copies of a
        text among them) half a win (what no verdict is worth either way)."""
        off = ~(self.asked | np.eye(self.m, dtype=bool))
        guessed = np.where(self.sure(), (self.p > 0.5).astype(float), np.where(off, 0.5, 0.0))
        return (alpha * (np.where(self.asked, self.score, 0.0) + guessed).sum(1)).astype(np.float32)


def wins_left(score: float, met: int, left: int) -> tuple[float, float]:
    """The mean and standard deviation of the wins among `left` anchors not met, for a response that scored `score`
    against the `met` it met: beta-binomial(left, score + 1, met - score + 1), the posterior predictive of a uniform
    prior on its win rate against its prompt's anchors."""
    a, b = score + 1.0, met - score + 1.0
    mean = left * a / (a + b)
    var = left * a * b * (a + b + left) / ((a + b) ** 2 * (a + b + 1))
    return mean, math.sqrt(max(var, 0.0))


class SequentialAnchors:
    """Each response against its prompt's n anchors in order, stopped by `tolerance` (module docstring). Pairs are
    `(i, m + k)`: response i against anchor k (the caller's texts are the m responses, then the n anchors).
    `same [m, n]`: response i's text is anchor k's, met without a question (half a win)."""

    def __init__(self, m: int, n: int, *, ties: str = "win", tolerance: float = 1.0, first: int = 2, step: int = 2,
                 same: np.ndarray | None = None):
        if first < 1 or step < 1:
            raise ValueError(f"a response meets at least one anchor a round; got first={first}, step={step}")
        self.m, self.n, self.ties, self.tolerance, self.first, self.step = m, n, ties, tolerance, first, step
        self.same = np.zeros((m, n), bool) if same is None else np.asarray(same, bool)
        self.met = np.zeros(m, np.int64)  # anchors met, in order 0, 1, ...
        self.score = np.zeros(m)  # wins, a tie per `ties`
        self.done = np.zeros(m, bool)
        self.stopped = np.zeros(m, bool)  # the tolerance stopped it before its last anchor
        self.asked = 0

    @property
    def questions(self) -> int:
        return self.asked

    def _settle(self, i: int) -> None:
        """Mark response i done when it met every anchor, or, after its first round, when its tolerance binds."""
        left = self.n - self.met[i]
        if left == 0:
            self.done[i] = True
        elif self.tolerance > 0 and self.met[i] >= self.first and \
                wins_left(self.score[i], int(self.met[i]), left)[1] <= self.tolerance:
            self.done[i] = self.stopped[i] = True

    def pairs(self) -> list[Pair]:
        out: list[Pair] = []
        while not out and not self.done.all():
            for i in np.flatnonzero(~self.done):
                self._settle(i)
                if self.done[i]:
                    continue
                start = int(self.met[i])
                ks = range(start, min(self.n, start + (self.first if start == 0 else self.step)))
                known = [k for k in ks if self.same[i, k]]
                self.met[i] += len(known)  # an anchor it copies: half a win, met without a question
                self.score[i] += 0.5 * len(known)
                out += [(int(i), self.m + k) for k in ks if not self.same[i, k]]
        return out

    def record(self, pairs: list[Pair], outcomes: list[int]) -> None:
        tie = tie_credit(self.ties)
        for (i, _), o in zip(pairs, outcomes):
            self.met[i] += 1
            self.score[i] += 1.0 if o > 0 else tie if o == 0 else 0.0
        self.asked += len(pairs)

    def rewards(self, alpha: float = 1.0) -> np.ndarray:
        """`[m]` float32: alpha x (the anchors beaten, plus the expected wins against those not met)."""
        guessed = [wins_left(s, int(k), self.n - int(k))[0] for s, k in zip(self.score, self.met)]
        return (alpha * (self.score + np.asarray(guessed))).astype(np.float32)
