"""Win counting for Self-Competitive Ranking (SCR) and Anchor-Guided Ranking (AGR), on device.

Votes are integer count tensors (docs/design.md, decisions):

* SCR: ``c[b, i, j]`` = judge votes preferring response i over response j (i != j), ``[batch, group, group]``;
  ``c[b, i, j] + c[b, j, i] <= V``, the rest abstained. The diagonal is ignored.
* AGR: ``wins[b, i, k]`` / ``losses[b, i, k]`` = votes for response i over / under anchor k,
  ``[batch, group, anchors]``.

A pair's majority decides it (Algorithm 1 lines 5-12, Algorithm 2 lines 6-10). ``ties`` names what a tied pair
(equal counts, which includes a pair where every vote abstained) gives:

* ``'half'`` (default): 0.5 to each side, so a tie sits between a loss and a win.
* ``'zero'``: nothing to either side (Eq. 16 / Eq. 22 read with a strict majority; this is also what Algorithm 1
  line 22 computes, ``1[w_ij > w_ji]``).
* ``'win'`` (AGR only): the response wins a tie against an anchor, Algorithm 2 line 10 (``c_ik >= c_ki``) exactly.

Paper discrepancy, resolved here: Algorithm 1 lines 22-24 sort the responses by win count and reward *positions* in
that sorted order, which breaks win-count ties and cycles arbitrarily (two responses with equal win counts get
different rewards depending on the sort). Eq. 16 defines the SCR reward as the win count itself. Without CARA we
implement Eq. 16 (equal win counts give equal rewards); with CARA, ``kemeny.cara_rewards`` implements Eq. 21
(positions in the aggregated total order), where positions are well defined because the order is total.

All functions here are pure, jit-compiled and batched over prompts; ``ties`` is a static argument, ``alpha`` is
traced (changing it does not recompile).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from rrc_jax.rewards._checks import (check_nonnegative, check_option, check_rank, check_real, check_votes,
                                     is_concrete)

SCR_TIES = ("half", "zero")
AGR_TIES = ("half", "zero", "win")


def _check_scr_counts(c) -> int:
    b, m, m2 = check_rank(c, 3, "c (SCR vote counts)", "[batch, group, group]")
    if m != m2:
        raise ValueError(f"c (SCR vote counts) must be square in its last two axes, got shape {(b, m, m2)}.")
    check_real(c, "c (SCR vote counts)")
    check_nonnegative(c, "c (SCR vote counts)")
    return m


def _check_agr_counts(wins, losses) -> None:
    w_shape = check_rank(wins, 3, "wins (AGR votes for the response)", "[batch, group, anchors]")
    l_shape = check_rank(losses, 3, "losses (AGR votes for the anchor)", "[batch, group, anchors]")
    if w_shape != l_shape:
        raise ValueError(
            f"wins and losses must have the same shape [batch, group, anchors], got {w_shape} and {l_shape}."
        )
    check_real(wins, "wins")
    check_real(losses, "losses")
    check_nonnegative(wins, "wins")
    check_nonnegative(losses, "losses")


# --------------------------------------------------------------------------------------------------------------
# SCR (Eq. 15-17, Algorithm 1 lines 1-12 and the win count of line 22)
# --------------------------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("ties",))
def _scr_rewards(c: jax.Array, alpha: jax.Array, ties: str) -> jax.Array:
    m = c.shape[-1]
    c_ji = jnp.swapaxes(c, -1, -2)  # votes for o_j > o_i (Algorithm 1 line 4)
    # Lines 9-12 store w[i][j] = c_ij, w[j][i] = c_ji; line 22 / Eq. 16: o_i > o_j iff w_ij > w_ji (majority).
    # The diagonal never counts: c_ii > c_ii is false.
    wins = jnp.sum(c > c_ji, axis=-1, dtype=jnp.int32)
    if ties == "half":  # wins + 0.5 * ties, with ties = (m - 1) - wins - losses
        losses = jnp.sum(c < c_ji, axis=-1, dtype=jnp.int32)
        score = 0.5 * (m - 1 + wins - losses).astype(jnp.float32)
    else:
        score = wins.astype(jnp.float32)
    return alpha * score  # Eq. 16: r(x, o_i) = alpha * sum_{j != i} 1[o_i > o_j]


def scr_rewards(c, alpha: float = 1.0, ties: str = "half") -> jax.Array:
    """SCR rewards: each response's majority-vote win count in its group's round robin, times ``alpha`` (Eq. 16).

    Args:
      c: ``[batch, group, group]`` non-negative vote counts, ``c[b, i, j]`` = votes for o_i over o_j. The diagonal
        is ignored. Integer counts are expected; floats are compared the same way.
      alpha: scaling factor of Eq. 16 (the paper uses 0.1). Traced, not static.
      ties: ``'half'`` (a tied pair gives 0.5 to each side) or ``'zero'`` (strict majority, Eq. 16 literally).

    Returns:
      ``[batch, group]`` float32 rewards. With ``'half'`` every group's rewards sum to ``alpha * m (m - 1) / 2``.

    This is Eq. 16, not the position reward of Algorithm 1 lines 22-24 (see the module docstring).
    """
    check_option(ties, SCR_TIES, "ties (SCR)")
    _check_scr_counts(c)
    return _scr_rewards(jnp.asarray(c), jnp.asarray(alpha, jnp.float32), ties)


# --------------------------------------------------------------------------------------------------------------
# AGR (Eq. 22-23, Algorithm 2)
# --------------------------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("ties",))
def _agr_rewards(wins: jax.Array, losses: jax.Array, alpha: jax.Array, ties: str) -> jax.Array:
    if ties == "win":
        s = jnp.sum(wins >= losses, axis=-1, dtype=jnp.int32)  # Algorithm 2 line 10: if c_ik >= c_ki: s_i += 1
        score = s.astype(jnp.float32)
    else:
        s = jnp.sum(wins > losses, axis=-1, dtype=jnp.int32)
        score = s.astype(jnp.float32)
        if ties == "half":
            score = score + 0.5 * jnp.sum(wins == losses, axis=-1, dtype=jnp.int32).astype(jnp.float32)
    return alpha * score  # line 12 / Eq. 22: r(x, o_i) = alpha * s_i


def agr_rewards(wins, losses, alpha: float = 1.0, ties: str = "half") -> jax.Array:
    """AGR rewards: how many anchors each response beats by majority vote, times ``alpha`` (Eq. 22, Algorithm 2).

    Args:
      wins: ``[batch, group, anchors]`` votes for response i over anchor k (``c_ik`` in Algorithm 2).
      losses: ``[batch, group, anchors]`` votes for anchor k over response i (``c_ki``).
      alpha: scaling factor. Traced, not static.
      ties: ``'half'`` (0.5 per tied anchor), ``'zero'`` (strict majority) or ``'win'`` (a tie counts as a win,
        Algorithm 2 line 10 exactly: a pair where every vote abstained also counts as a win).

    Returns:
      ``[batch, group]`` float32 rewards in ``[0, alpha * anchors]``.
    """
    check_option(ties, AGR_TIES, "ties (AGR)")
    _check_agr_counts(wins, losses)
    return _agr_rewards(jnp.asarray(wins), jnp.asarray(losses), jnp.asarray(alpha, jnp.float32), ties)


# --------------------------------------------------------------------------------------------------------------
# Per-group diagnostics
# --------------------------------------------------------------------------------------------------------------


@jax.jit
def _scr_diagnostics(c: jax.Array, votes: jax.Array) -> dict[str, jax.Array]:
    m = c.shape[-1]
    n_pairs = max(m * (m - 1) // 2, 1)
    c_ji = jnp.swapaxes(c, -1, -2)
    upper = jnp.triu(jnp.ones((m, m), dtype=bool), k=1)  # each unordered pair {i, j} once
    tied = (c == c_ji) & upper
    cast = jnp.float32
    abstained = jnp.where(upper, votes - c.astype(cast) - c_ji.astype(cast), 0.0)
    # Strict majority relation P[i, j] = 1[o_i > o_j]; each directed 3-cycle appears 3 times in trace(P^3).
    p = (c > c_ji).astype(cast)
    triads = jnp.einsum("bij,bjk,bki->b", p, p, p) / 3.0
    return {
        "tie_fraction": jnp.sum(tied, axis=(-2, -1)).astype(cast) / n_pairs,
        "abstain_fraction": jnp.sum(abstained, axis=(-2, -1)) / (n_pairs * votes),
        "intransitive_triads": jnp.round(triads).astype(jnp.int32),
    }


def scr_diagnostics(c, votes: int) -> dict[str, jax.Array]:
    """Per-group health of an SCR round robin.

    Args:
      c: ``[batch, group, group]`` vote counts as for :func:`scr_rewards`.
      votes: the voting budget V (judge queries per pair), a positive int.

    Returns:
      A dict of ``[batch]`` arrays:
      ``tie_fraction`` share of unordered pairs with no majority (equal counts, all-abstained pairs included);
      ``abstain_fraction`` share of the ``V * m (m - 1) / 2`` votes that abstained (``V - c_ij - c_ji`` per pair);
      ``intransitive_triads`` (int32) number of triples forming a strict-majority cycle i > j > k > i (Eq. 18),
      the conflicts CARA resolves.

    Raises ValueError (on concrete input) when a pair holds more than ``votes`` votes.
    """
    check_votes(votes)
    m = _check_scr_counts(c)
    if is_concrete(c) and m > 1:
        a = np.asarray(c)
        total = a + np.swapaxes(a, -1, -2)
        total = np.where(np.eye(m, dtype=bool), 0, total)
        if np.max(total) > votes:
            raise ValueError(
                f"c[b, i, j] + c[b, j, i] reaches {np.max(total)} > votes={votes}; pass the voting budget V "
                f"used to collect the counts."
            )
    return _scr_diagnostics(jnp.asarray(c), jnp.asarray(votes, jnp.float32))


@jax.jit
def _agr_diagnostics(wins: jax.Array, losses: jax.Array, votes: jax.Array) -> dict[str, jax.Array]:
    cast = jnp.float32
    n = wins.shape[-2] * wins.shape[-1]
    abstained = votes - wins.astype(cast) - losses.astype(cast)
    return {
        "tie_fraction": jnp.sum(wins == losses, axis=(-2, -1)).astype(cast) / max(n, 1),
        "abstain_fraction": jnp.sum(abstained, axis=(-2, -1)) / (max(n, 1) * votes),
    }


def agr_diagnostics(wins, losses, votes: int) -> dict[str, jax.Array]:
    """Per-group health of AGR comparisons.

    Args:
      wins, losses: ``[batch, group, anchors]`` as for :func:`agr_rewards`.
      votes: the voting budget V per (response, anchor) pair.

    Returns:
      A dict of ``[batch]`` arrays: ``tie_fraction`` (share of response-anchor pairs with no majority) and
      ``abstain_fraction`` (share of the ``V * group * anchors`` votes that abstained). A bipartite comparison has
      no cycles among responses, so there is no triad count.
    """
    check_votes(votes)
    _check_agr_counts(wins, losses)
    if is_concrete(wins) and is_concrete(losses):
        total = np.asarray(wins) + np.asarray(losses)
        if total.size and np.max(total) > votes:
            raise ValueError(
                f"wins + losses reaches {np.max(total)} > votes={votes}; pass the voting budget V used to "
                f"collect the counts."
            )
    return _agr_diagnostics(jnp.asarray(wins), jnp.asarray(losses), jnp.asarray(votes, jnp.float32))


# --------------------------------------------------------------------------------------------------------------
# Early-stopped voting: a pair's votes only matter through its outcome
# --------------------------------------------------------------------------------------------------------------


def pair_outcome(ties: str, kind: str = "scr"):
    """What of a pair's vote margin `d = wins - losses` (`[K]` ints) a reward reads, as a function of d: its sign
    for SCR (both sides score, Eq. 16 and the tie rule) and AGR with `ties='half'`; `d > 0` for AGR with 'zero'
    (only a strict majority scores); `d >= 0` for AGR with 'win' (Algorithm 2 line 10). Each is non-decreasing in
    d, which `decided` relies on."""
    check_option(kind, ("scr", "agr"), "kind")
    check_option(ties, SCR_TIES if kind == "scr" else AGR_TIES, f"ties ({kind.upper()})")
    if kind == "scr" or ties == "half":
        return np.sign
    return (lambda d: d > 0) if ties == "zero" else (lambda d: d >= 0)


def decided(wins, losses, remaining, outcome) -> np.ndarray:
    """`[K]` bool: the `remaining` votes of each pair cannot change its `outcome` (`pair_outcome`), whatever they
    say (each a win, a loss or an abstention moves the margin by +1, -1 or 0). The outcome is non-decreasing in the
    margin, so it is decided when the two extremes, every remaining vote against and every one for, agree: the
    votes not asked then leave every reward as full voting gives it."""
    d = np.asarray(wins, np.int64) - np.asarray(losses, np.int64)
    r = np.asarray(remaining, np.int64)
    return np.asarray(outcome(d - r) == outcome(d + r), bool)


def votes_to_decide(wins, losses, remaining, outcome) -> np.ndarray:
    """`[K]` the fewest more votes that could decide each pair (`decided`, had they all gone one way), 0 for a pair
    decided or without votes left: what a round of early-stopped voting asks."""
    wins, losses, remaining = (np.asarray(x, np.int64) for x in (wins, losses, remaining))
    need = np.zeros(wins.shape, np.int64)
    open_ = ~decided(wins, losses, remaining, outcome) & (remaining > 0)
    for j in range(1, int(remaining.max(initial=0)) + 1):
        left = remaining - j
        can = (decided(wins + j, losses, left, outcome) | decided(wins, losses + j, left, outcome)) & (left >= 0)
        need = np.where(open_ & (need == 0) & can, j, need)
    return need
