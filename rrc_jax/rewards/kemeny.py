"""Conflict-Aware Ranking Adjustment (CARA): Kemeny aggregation of a pairwise tournament, on host (numpy).

Pairwise majority judgments need not be transitive (Eq. 18: o_i > o_j, o_j > o_k, o_k > o_i). CARA replaces them by
the total order that disagrees least with the weighted votes (the Kemeny rule, Eq. 19-20) and rewards positions in
that order (Eq. 21). Weights are the vote counts: ``w[i, j] = c_ij`` (Algorithm 1 lines 9-12).

* :func:`cara_order` is the greedy heuristic of Davenport & Kalagnanam used by Algorithm 1 lines 13-20.
* :func:`kemeny_exact` is an exact minimiser of Eq. 19's disagreement by dynamic programming over subsets
  (``O(2^m m)`` time and memory), offered for ``m <= 16``.
* :func:`kemeny_disagreement` evaluates Eq. 19 for a given order.

Orders are int64 arrays of response indices, best first. CARA is sequential by nature, so it runs on host; the
batched entry point :func:`cara_rewards` loops over groups.
"""

from __future__ import annotations

import numpy as np

from rrc_jax.rewards._checks import check_nonnegative, check_option, check_rank, check_real

CARA_METHODS = ("greedy", "exact")
MAX_EXACT_GROUP = 16


def _as_weights(w) -> np.ndarray:
    """Validate a ``[group, group]`` weight matrix and return it as float64 (integer counts stay exact)."""
    m, m2 = check_rank(w, 2, "w (pairwise weights)", "[group, group]")
    if m != m2 or m < 1:
        raise ValueError(f"w (pairwise weights) must be a non-empty square [group, group] matrix, got {(m, m2)}.")
    check_real(w, "w (pairwise weights)")
    check_nonnegative(w, "w (pairwise weights)")
    return np.array(w, dtype=np.float64)  # a copy: callers keep their array


def _as_order(order, m: int) -> np.ndarray:
    o = np.asarray(order)
    if o.shape != (m,) or not np.issubdtype(o.dtype, np.integer) or not np.array_equal(np.sort(o), np.arange(m)):
        raise ValueError(f"order must be a permutation of range({m}) (int array [group], best first), got {order!r}.")
    return o


def positions(order) -> np.ndarray:
    """Inverse permutation: ``positions(order)[i]`` is response i's 0-based position in ``order`` (0 = best)."""
    o = np.asarray(order)
    pos = np.empty(o.shape[0], dtype=np.int64)
    pos[o] = np.arange(o.shape[0])
    return pos


def kemeny_disagreement(w, order) -> float:
    """Eq. 19: ``Disagree(pi) = sum_{i ahead of j in pi} w[j, i]``, the weight of votes the order overrules.

    Args:
      w: ``[group, group]`` non-negative weights, ``w[i, j]`` = support for o_i over o_j. The diagonal is ignored.
      order: ``[group]`` permutation, best first.

    ``Agree(pi) = C - Disagree(pi)`` with ``C = sum_{i != j} w[i, j]`` constant (Eq. 20), so minimising this is the
    Kemeny objective.
    """
    a = _as_weights(w)
    pos = positions(_as_order(order, a.shape[0]))
    ahead = pos[:, None] < pos[None, :]  # ahead[i, j]: i is ranked before j
    return float(np.sum(a.T[ahead]))  # a.T[i, j] = w[j, i]


def cara_order(w) -> np.ndarray:
    """Greedy Kemeny aggregation (Davenport-Kalagnanam), Algorithm 1 lines 13-20 exactly.

    Pairs are visited by decreasing ``|w_ij - w_ji|`` (line 16). An undecided pair is fixed in its majority
    direction, ``i`` before ``j`` when ``w_ij >= w_ji`` (lines 17-18), and the partial order is closed transitively
    (line 19). A pair already decided by the closure is skipped: its relation is either implied already or would
    close a cycle, and line 19 discards it. (Since the closure is maintained after every addition, adding a relation
    on an undecided pair can never itself create a cycle.) When every pair is decided the partial order is total and
    its topological sort (line 20) is unique.

    Deterministic tie-breaking: pairs with equal ``|w_ij - w_ji|`` (exact float equality) are visited in row-major
    order of ``(i, j)``, ``i < j``; a pair with ``w_ij == w_ji`` puts the lower index first (line 17's ``>=``).

    Args:
      w: ``[group, group]`` non-negative weights (int or float), ``w[i, j]`` = votes for o_i over o_j.

    Returns:
      ``[group]`` int64 response indices, best first. A transitive tournament yields exactly its own order.

    Cost: ``O(m^2 log m)`` for the sort plus ``O(m^2)`` numpy work per accepted relation; the transitive closure is
    updated with one boolean outer product (ancestors of i x descendants of j).
    """
    a = _as_weights(w)
    m = a.shape[0]
    iu, ju = np.triu_indices(m, k=1)  # row-major (i, j), i < j
    w_ij, w_ji = a[iu, ju], a[ju, iu]
    visit = np.argsort(-np.abs(w_ij - w_ji), kind="stable")  # line 16, stable: ties in row-major order
    i_first = w_ij >= w_ji  # line 17 (else line 18)
    heads = np.where(i_first, iu, ju)[visit].tolist()
    tails = np.where(i_first, ju, iu)[visit].tolist()

    before = np.zeros((m, m), dtype=bool)  # Omega, transitively closed: before[a, b] <=> a ahead of b (line 14)
    for head, tail in zip(heads, tails):  # line 15: while an undecided pair exists
        if before[head, tail] or before[tail, head]:
            continue  # decided by transitivity: implied, or the reverse would close a cycle (line 19: discard)
        ancestors = before[:, head].copy()
        ancestors[head] = True
        descendants = before[tail].copy()
        descendants[tail] = True
        before |= ancestors[:, None] & descendants[None, :]  # line 19: transitive closure of Omega + {head < tail}
    # Line 20: Omega is a strict total order now; the topological sort ranks by number of successors.
    return np.argsort(-before.sum(axis=1), kind="stable").astype(np.int64)


def kemeny_exact(w) -> np.ndarray:
    """An exact Kemeny order: a permutation minimising Eq. 19's disagreement (maximising agreement, Eq. 20).

    Dynamic programming over subsets. For a set S, ``dp[S]`` is the least disagreement among orders of S alone (it
    does not depend on where S sits in the full order). Placing ``k`` first in S costs
    ``D[S \\ {k}, k] = sum_{j in S, j != k} w[j, k]`` (the votes for each j over k that the order overrules), so
    ``dp[S] = min_{k in S} dp[S \\ {k}] + D[S \\ {k}, k]``, computed layer by layer in subset size with vectorised
    numpy over the ``2^m`` subsets.

    Deterministic tie-breaking: among optimal orders, the lexicographically smallest one (best first) is returned:
    the reconstruction picks, at each position, the smallest index that still completes an optimal order (float
    weights compare within a relative tolerance of 1e-9).

    Args:
      w: ``[group, group]`` non-negative weights, ``group <= 16`` (memory and time grow as ``2^group``).

    Returns:
      ``[group]`` int64 response indices, best first.
    """
    a = _as_weights(w)
    m = a.shape[0]
    if m > MAX_EXACT_GROUP:
        raise ValueError(
            f"kemeny_exact supports groups of at most {MAX_EXACT_GROUP} responses (2^m subsets), got {m}; "
            f"use the greedy cara_order (method='greedy') for larger groups."
        )
    np.fill_diagonal(a, 0.0)
    n = 1 << m
    subsets = np.arange(n, dtype=np.int64)
    members = (subsets[:, None] >> np.arange(m)) & 1  # [2^m, m]
    d = members.astype(np.float64) @ a  # d[S, k] = sum_{j in S} w[j, k]
    size = members.sum(axis=1)
    dp = np.zeros(n, dtype=np.float64)
    for p in range(1, m + 1):
        layer = subsets[size == p]
        best = np.full(layer.shape[0], np.inf)
        for k in range(m):
            has_k = ((layer >> k) & 1).astype(bool)
            rest = layer[has_k] ^ (1 << k)
            best[has_k] = np.minimum(best[has_k], dp[rest] + d[rest, k])
        dp[layer] = best

    tol = 1e-9 * max(1.0, float(np.sum(a)))
    order, s = [], n - 1
    while s:
        for k in range(m):
            if (s >> k) & 1:
                rest = s ^ (1 << k)
                if dp[rest] + d[rest, k] <= dp[s] + tol:
                    order.append(k)
                    s = rest
                    break
    return np.asarray(order, dtype=np.int64)


def cara_rewards(c, alpha: float = 1.0, method: str = "greedy") -> np.ndarray:
    """SCR rewards after CARA: positions in the Kemeny-aggregated order (Eq. 21), batched over prompts, on host.

    ``r(x, o_i) = alpha * |{o_j != o_i : i ahead of j in pi}|``: the best response gets ``alpha * (m - 1)``, the
    worst 0, so every group's rewards are ``alpha * {0, ..., m - 1}`` in aggregated order (Algorithm 1 lines 23-24
    with ``use_CARA``). The weights are the vote counts, ``w[i, j] = c[b, i, j]`` (lines 9-12).

    Args:
      c: ``[batch, group, group]`` non-negative vote counts (numpy or jax; copied to host).
      alpha: scaling factor.
      method: ``'greedy'`` (:func:`cara_order`, Algorithm 1) or ``'exact'`` (:func:`kemeny_exact`, group <= 16).

    Returns:
      ``[batch, group]`` float32 numpy rewards.
    """
    check_option(method, CARA_METHODS, "method (CARA)")
    b, m, m2 = check_rank(c, 3, "c (SCR vote counts)", "[batch, group, group]")
    if m != m2:
        raise ValueError(f"c (SCR vote counts) must be square in its last two axes, got shape {(b, m, m2)}.")
    if method == "exact" and m > MAX_EXACT_GROUP:
        raise ValueError(
            f"method='exact' supports groups of at most {MAX_EXACT_GROUP} responses, got {m}; use method='greedy'."
        )
    counts = np.asarray(c)
    check_real(counts, "c (SCR vote counts)")
    check_nonnegative(counts, "c (SCR vote counts)")
    aggregate = cara_order if method == "greedy" else kemeny_exact
    order = np.stack([aggregate(counts[g]) for g in range(b)]) if b else np.zeros((0, m), np.int64)
    return order_rewards(order, alpha)


def order_rewards(order, alpha: float = 1.0) -> np.ndarray:
    """Eq. 21 for total orders `order [batch, group]` (response indices, best first): ``r_i = alpha * |{j : i
    ahead of j}| = alpha * (m - 1 - position of i)``, float32 `[batch, group]`. CARA and the judge's tournaments
    reward their orders with it."""
    order = np.asarray(order)
    b, m = order.shape
    r = np.zeros((b, m), np.float32)
    np.put_along_axis(r, order, alpha * (m - 1 - np.arange(m, dtype=np.float32))[None].repeat(b, 0), axis=1)
    return r
