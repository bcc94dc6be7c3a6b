"""SCR / AGR win counting against literal transcriptions of the paper, properties, diagnostics and input errors."""

import itertools

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rrc_jax.rewards import agr_diagnostics, agr_rewards, scr_diagnostics, scr_rewards

PREFER_FIRST, PREFER_SECOND, ABSTAIN = 1, -1, 0

# ---------------------------------------------------------------------------------------------------------------
# Literal transcriptions. Each consumes raw per-query verdicts (the GRM's answers, line 6 / line 7) and mirrors the
# pseudocode line by line; an unparseable verdict (abstention) is counted for neither side.
# ---------------------------------------------------------------------------------------------------------------


def algorithm1_eq16_literal(verdicts, m, V, alpha, tie_value):
    """Algorithm 1 lines 1-12, then Eq. 16 with a strict majority; tied pairs give ``tie_value`` to each side."""
    w = [[0] * m for _ in range(m)]  # 1: w[i][j] <- 0
    for i in range(m):  # 2: for each unordered pair {i, j}, i < j
        for j in range(i + 1, m):
            c_ij = 0  # 3
            c_ji = 0  # 4
            for t in range(V):  # 5
                preference = verdicts[i][j][t]  # 6: query GRM on (x, o_i, o_j)
                if preference == PREFER_FIRST:  # 7
                    c_ij = c_ij + 1
                elif preference == PREFER_SECOND:  # 8
                    c_ji = c_ji + 1
            if c_ij >= c_ji:  # 9
                w[i][j] = c_ij  # 10
                w[j][i] = c_ji
            else:  # 11
                w[j][i] = c_ji  # 12
                w[i][j] = c_ij
    rewards = []
    for i in range(m):  # Eq. 16: r(x, o_i) = alpha * sum_{j != i} 1[o_i > o_j]
        wins = 0.0
        for j in range(m):
            if j == i:
                continue
            if w[i][j] > w[j][i]:
                wins += 1
            elif w[i][j] == w[j][i]:
                wins += tie_value
        rewards.append(alpha * wins)
    return rewards


def algorithm2_literal(verdicts, m, n, V, alpha):
    """Algorithm 2, lines 1-12."""
    rewards = []
    for i in range(m):  # 1
        s_i = 0  # 2
        for k in range(n):  # 3
            c_ik = 0  # 4
            c_ki = 0  # 5
            for t in range(V):  # 6
                preference = verdicts[i][k][t]  # 7: query GRM on (x, o_i, a_k)
                if preference == PREFER_FIRST:  # 8
                    c_ik = c_ik + 1
                elif preference == PREFER_SECOND:  # 9
                    c_ki = c_ki + 1
            if c_ik >= c_ki:  # 10
                s_i = s_i + 1  # 11
        rewards.append(alpha * s_i)  # 12
    return rewards


def random_verdicts(rng, shape, V):
    """Random verdicts with a random preference bias and abstention rate, padded to 8 queries."""
    p_abstain = rng.uniform(0.0, 0.5)
    p_first = rng.uniform(0.0, 1.0) * (1 - p_abstain)
    probs = [p_first, 1 - p_abstain - p_first, p_abstain]
    v = rng.choice([PREFER_FIRST, PREFER_SECOND, ABSTAIN], size=shape + (8,), p=probs)
    v[..., V:] = ABSTAIN  # only the first V queries were made
    return v


def scr_counts(verdicts):
    """Count tensor c[i, j] from upper-triangle verdicts (i < j)."""
    m = verdicts.shape[0]
    upper = np.triu(np.ones((m, m), dtype=bool), k=1)
    first = np.where(upper, (verdicts == PREFER_FIRST).sum(-1), 0)
    second = np.where(upper, (verdicts == PREFER_SECOND).sum(-1), 0)
    return first + second.T


PER_GROUP_SIZE = 70  # 15 group sizes x 70 = 1050 random vote tensors per construction


@pytest.mark.parametrize("ties, tie_value", [("zero", 0.0), ("half", 0.5)])
def test_scr_matches_algorithm1_and_eq16(ties, tie_value):
    rng = np.random.default_rng(1)
    checked = 0
    for m in range(2, 17):
        alpha = float(rng.choice([1.0, 0.1, 2.5]))
        verdicts, votes = [], []
        for _ in range(PER_GROUP_SIZE):
            V = int(rng.integers(1, 9))
            verdicts.append(random_verdicts(rng, (m, m), V))
            votes.append(V)
        counts = np.stack([scr_counts(v) for v in verdicts]).astype(np.int32)
        got = np.asarray(scr_rewards(counts, alpha=alpha, ties=ties))
        for g in range(PER_GROUP_SIZE):
            want = algorithm1_eq16_literal(verdicts[g].tolist(), m, votes[g], alpha, tie_value)
            np.testing.assert_allclose(got[g], want, rtol=1e-6, err_msg=f"m={m} V={votes[g]} group {g}")
            checked += 1
    assert checked >= 1000


def test_agr_win_ties_matches_algorithm2():
    rng = np.random.default_rng(2)
    checked = 0
    for m in range(2, 17):
        n = int(rng.integers(1, 17))
        alpha = float(rng.choice([1.0, 0.1, 2.5]))
        verdicts, votes = [], []
        for _ in range(PER_GROUP_SIZE):
            V = int(rng.integers(1, 9))
            verdicts.append(random_verdicts(rng, (m, n), V))
            votes.append(V)
        wins = np.stack([(v == PREFER_FIRST).sum(-1) for v in verdicts]).astype(np.int32)
        losses = np.stack([(v == PREFER_SECOND).sum(-1) for v in verdicts]).astype(np.int32)
        got = np.asarray(agr_rewards(wins, losses, alpha=alpha, ties="win"))
        for g in range(PER_GROUP_SIZE):
            want = algorithm2_literal(verdicts[g].tolist(), m, n, votes[g], alpha)
            np.testing.assert_allclose(got[g], want, rtol=1e-6, err_msg=f"m={m} n={n} V={votes[g]} group {g}")
            checked += 1
    assert checked >= 1000


def test_agr_tie_modes_differ_only_on_ties():
    wins = np.array([[[2, 1, 0, 0]]])
    losses = np.array([[[1, 1, 0, 3]]])  # a win, a tie, an all-abstained tie, a loss
    assert np.asarray(agr_rewards(wins, losses, ties="win")).tolist() == [[3.0]]
    assert np.asarray(agr_rewards(wins, losses, ties="half")).tolist() == [[2.0]]
    assert np.asarray(agr_rewards(wins, losses, ties="zero")).tolist() == [[1.0]]


# ---------------------------------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------------------------------


@st.composite
def unanimous_scr(draw, max_m=12):
    m = draw(st.integers(2, max_m))
    order = draw(st.permutations(range(m)))  # best first
    V = draw(st.integers(1, 8))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    rank = np.empty(m, dtype=int)
    rank[list(order)] = np.arange(m)
    counts = np.zeros((m, m), dtype=np.int32)
    for i, j in itertools.permutations(range(m), 2):
        if rank[i] < rank[j]:
            counts[i, j] = rng.integers(1, V + 1)  # at least one vote, none against: unanimous (the rest abstain)
    return list(order), counts


@settings(max_examples=60, deadline=None)
@given(unanimous_scr(), st.sampled_from(["half", "zero"]), st.sampled_from([1.0, 0.1, 7.0]))
def test_scr_property1_order_preservation(case, ties, alpha):
    order, counts = case
    r = np.asarray(scr_rewards(counts[None], alpha=alpha, ties=ties))[0]
    assert np.all(np.diff(r[order]) < 0)  # strictly decreasing along the true order


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 10), st.integers(1, 6), st.integers(1, 8), st.integers(0, 2**32 - 1),
       st.sampled_from(["half", "zero", "win"]))
def test_agr_property1_order_preservation(m, n, V, seed, ties):
    rng = np.random.default_rng(seed)
    quality = rng.permutation(m + n)  # a strict total order over responses (first m) and anchors (last n)
    q_resp, q_anchor = quality[:m], quality[m:]
    better = q_resp[:, None] > q_anchor[None, :]
    support = rng.integers(1, V + 1, size=(m, n))
    wins = np.where(better, support, 0)[None]
    losses = np.where(better, 0, support)[None]
    r = np.asarray(agr_rewards(wins, losses, ties=ties))[0]
    for i, j in itertools.permutations(range(m), 2):
        if q_resp[i] > q_resp[j]:
            assert r[i] >= r[j]
            if np.any((q_anchor < q_resp[i]) & (q_anchor > q_resp[j])):  # an anchor separates them
                assert r[i] > r[j]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 16), st.integers(1, 8), st.integers(0, 2**32 - 1), st.floats(0.01, 10.0))
def test_scr_half_ties_sum_to_alpha_pairs(m, V, seed, alpha):
    rng = np.random.default_rng(seed)
    verdicts = random_verdicts(rng, (3, m, m), V)
    counts = np.stack([scr_counts(v) for v in verdicts])
    r = np.asarray(scr_rewards(counts, alpha=alpha, ties="half"))
    np.testing.assert_allclose(r.sum(-1), alpha * m * (m - 1) / 2, rtol=1e-5)


def test_scr_diagonal_is_ignored():
    counts = np.array([[[5, 2, 0], [1, 7, 3], [3, 3, 9]]])
    zeroed = counts * (1 - np.eye(3, dtype=int))
    np.testing.assert_array_equal(np.asarray(scr_rewards(counts)), np.asarray(scr_rewards(zeroed)))


def test_rewards_under_jit_and_float_alpha_is_traced():
    counts = np.array([[[0, 2, 3], [1, 0, 0], [0, 2, 0]]], dtype=np.int32)
    jitted = jax.jit(lambda c, a: scr_rewards(c, alpha=a, ties="zero"))
    np.testing.assert_allclose(np.asarray(jitted(counts, 0.5)), [[1.0, 0.0, 0.5]])
    np.testing.assert_allclose(np.asarray(jitted(counts, 2.0)), [[4.0, 0.0, 2.0]])
    w = counts[:, :, :2]
    l = counts[:, :, 1:]
    np.testing.assert_allclose(np.asarray(jax.jit(agr_rewards)(w, l)), np.asarray(agr_rewards(w, l)))


# ---------------------------------------------------------------------------------------------------------------
# Diagnostics
# ---------------------------------------------------------------------------------------------------------------


def test_scr_diagnostics_match_literal_counts():
    rng = np.random.default_rng(3)
    V = 5
    counts = np.stack([scr_counts(random_verdicts(rng, (7, 7), V)) for _ in range(40)])
    d = {k: np.asarray(v) for k, v in scr_diagnostics(counts, votes=V).items()}
    for g, c in enumerate(counts):
        m = c.shape[0]
        pairs = list(itertools.combinations(range(m), 2))
        ties = sum(c[i, j] == c[j, i] for i, j in pairs)
        abstained = sum(V - c[i, j] - c[j, i] for i, j in pairs)
        beats = lambda a, b: c[a, b] > c[b, a]  # noqa: E731
        cycles = sum(
            (beats(i, j) and beats(j, k) and beats(k, i)) or (beats(i, k) and beats(k, j) and beats(j, i))
            for i, j, k in itertools.combinations(range(m), 3)
        )
        assert d["tie_fraction"][g] == pytest.approx(ties / len(pairs))
        assert d["abstain_fraction"][g] == pytest.approx(abstained / (V * len(pairs)))
        assert d["intransitive_triads"][g] == cycles


def test_scr_diagnostics_three_cycle():
    c = np.zeros((1, 3, 3), dtype=np.int32)
    c[0, 0, 1] = c[0, 1, 2] = c[0, 2, 0] = 2  # 0 > 1 > 2 > 0
    d = scr_diagnostics(c, votes=2)
    assert int(d["intransitive_triads"][0]) == 1
    assert float(d["tie_fraction"][0]) == 0.0
    assert float(d["abstain_fraction"][0]) == 0.0


def test_agr_diagnostics():
    wins = np.array([[[2, 1, 0], [0, 3, 1]]])
    losses = np.array([[[1, 1, 0], [3, 0, 1]]])
    d = agr_diagnostics(wins, losses, votes=3)
    assert float(d["tie_fraction"][0]) == pytest.approx(3 / 6)
    assert float(d["abstain_fraction"][0]) == pytest.approx((0 + 1 + 3 + 0 + 0 + 1) / 18)


# ---------------------------------------------------------------------------------------------------------------
# Errors a caller can cause
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: scr_rewards(np.zeros((3, 3))), "rank 3"),
        (lambda: scr_rewards(np.zeros((1, 3, 4))), "square"),
        (lambda: scr_rewards(np.zeros((1, 3, 3)), ties="first"), "unknown ties"),
        (lambda: scr_rewards(-np.ones((1, 3, 3))), "negative"),
        (lambda: scr_rewards(np.full((1, 2, 2), np.nan)), "NaN"),
        (lambda: scr_rewards(np.zeros((1, 2, 2), dtype=complex)), "real numbers"),
        (lambda: agr_rewards(np.zeros((1, 3, 2)), np.zeros((1, 3, 3))), "same shape"),
        (lambda: agr_rewards(np.zeros((1, 3, 2)), np.zeros((1, 3, 2)), ties="lose"), "unknown ties"),
        (lambda: agr_rewards(np.zeros((1, 3, 2)), -np.ones((1, 3, 2))), "negative"),
        (lambda: scr_diagnostics(np.full((1, 2, 2), 3), votes=4), "votes=4"),
        (lambda: scr_diagnostics(np.zeros((1, 2, 2)), votes=0), "positive"),
        (lambda: agr_diagnostics(np.ones((1, 2, 2)), np.ones((1, 2, 2)), votes=1), "votes=1"),
    ],
)
def test_input_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_accelerator_value_check_helper():
    """The on-accelerator branch of the count check (on CPU, numpy reads the buffer instead)."""
    from rrc_jax.rewards._checks import _min_and_finite

    low, finite = jax.device_get(_min_and_finite(jax.numpy.array([[3, -2], [0, 1]])))
    assert low == -2 and finite
    low, finite = jax.device_get(_min_and_finite(jax.numpy.array([1.0, np.inf])))
    assert low == 1.0 and not finite
    low, finite = jax.device_get(_min_and_finite(jax.numpy.array([True, False])))
    assert low == 0 and finite
