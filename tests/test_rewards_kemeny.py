"""CARA: greedy Davenport-Kalagnanam against a literal Algorithm 1 transcription, exact Kemeny against brute force."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rrc_jax.rewards import cara_order, cara_rewards, kemeny_disagreement, kemeny_exact


def disagreement_literal(w, order):
    """Eq. 19: Disagree(pi) = sum over i ahead of j of w_ji."""
    total = 0.0
    for a in range(len(order)):
        for b in range(a + 1, len(order)):
            total += w[order[b]][order[a]]
    return total


def brute_force_kemeny(w):
    """Minimum disagreement over all permutations, and the lexicographically first order reaching it."""
    best, best_order = None, None
    for order in itertools.permutations(range(len(w))):  # lexicographic order
        cost = disagreement_literal(w, order)
        if best is None or cost < best:
            best, best_order = cost, list(order)
    return best, best_order


def transitive_closure_literal(relations):
    closed = set(relations)
    changed = True
    while changed:
        changed = False
        for a, b in list(closed):
            for b2, c in list(closed):
                if b == b2 and (a, c) not in closed:
                    closed.add((a, c))
                    changed = True
    return closed


def cara_literal(w):
    """Algorithm 1 lines 13-20, line by line (ties: first maximal pair in row-major order, line 17's >=)."""
    m = len(w)
    omega = set()  # 14: partial order, pairs (a, b) meaning a before b
    while True:
        undecided = [(i, j) for i in range(m) for j in range(i + 1, m) if (i, j) not in omega and (j, i) not in omega]
        if not undecided:  # 15: while there exists an undecided pair
            break
        i, j = max(undecided, key=lambda p: abs(w[p[0]][p[1]] - w[p[1]][p[0]]))  # 16 (max keeps the first)
        relation = (i, j) if w[i][j] >= w[j][i] else (j, i)  # 17-18
        candidate = transitive_closure_literal(omega | {relation})  # 19: enforce transitive closure
        if any((a, a) in candidate for a in range(m)):
            continue  # 19: discard a relation forming a cycle
        omega = candidate
    order, remaining = [], set(range(m))  # 20: topological sort
    while remaining:
        source = min(a for a in remaining if not any((b, a) in omega for b in remaining))
        order.append(source)
        remaining.remove(source)
    return order


def random_tournament(rng, m, V=8, float_weights=False, p_abstain=0.2):
    """Votes from a noisy latent quality: each vote prefers i over j with probability sigmoid(q_i - q_j)."""
    q = rng.normal(size=m) * rng.uniform(0.2, 3.0)
    p = 1.0 / (1.0 + np.exp(-(q[:, None] - q[None, :])))
    c = np.zeros((m, m))
    for i, j in itertools.combinations(range(m), 2):
        cast = rng.binomial(V, 1 - p_abstain)
        c[i, j] = rng.binomial(cast, p[i, j])
        c[j, i] = cast - c[i, j]
    if float_weights:
        return c + rng.uniform(0, 0.5, size=(m, m)) * (1 - np.eye(m))
    return c.astype(np.int64)


def test_greedy_matches_literal_algorithm1():
    rng = np.random.default_rng(0)
    for trial in range(150):
        m = int(rng.integers(1, 9))
        w = random_tournament(rng, m, V=int(rng.integers(1, 9)), float_weights=trial % 3 == 0)
        assert cara_order(w).tolist() == cara_literal(w.tolist()), f"trial {trial}, w={w.tolist()}"


@st.composite
def transitive_tournament(draw):
    m = draw(st.integers(1, 20))
    order = draw(st.permutations(range(m)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    use_float = draw(st.booleans())
    w = np.zeros((m, m))
    for a, b in itertools.combinations(range(m), 2):
        hi, lo = order[a], order[b]  # hi is ahead of lo
        w[hi, lo] = rng.uniform(1.0, 8.0) if use_float else rng.integers(1, 9)
        w[lo, hi] = rng.uniform(0.0, w[hi, lo] * 0.99) if use_float else rng.integers(0, w[hi, lo])
    return list(order), w if use_float else w.astype(np.int64)


@settings(max_examples=60, deadline=None)
@given(transitive_tournament())
def test_cara_order_returns_a_transitive_tournament_order(case):
    order, w = case
    assert cara_order(w).tolist() == order
    if len(order) <= 8:
        assert kemeny_exact(w).tolist() == order


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 7), st.integers(0, 2**32 - 1), st.booleans())
def test_kemeny_exact_equals_brute_force(m, seed, use_float):
    w = random_tournament(np.random.default_rng(seed), m, float_weights=use_float)
    best, first_order = brute_force_kemeny(w.tolist())
    order = kemeny_exact(w)
    assert sorted(order.tolist()) == list(range(m))
    assert kemeny_disagreement(w, order) == pytest.approx(best, abs=1e-9)
    assert disagreement_literal(w.tolist(), order.tolist()) == pytest.approx(best, abs=1e-9)
    if not use_float:
        assert order.tolist() == first_order  # documented tie-breaking: lexicographically smallest optimum


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 11), st.integers(0, 2**32 - 1), st.booleans())
def test_greedy_never_beats_exact(m, seed, use_float):
    w = random_tournament(np.random.default_rng(seed), m, V=3, float_weights=use_float, p_abstain=0.3)
    assert kemeny_disagreement(w, cara_order(w)) >= kemeny_disagreement(w, kemeny_exact(w)) - 1e-9


def test_greedy_is_suboptimal_somewhere():
    """The two methods are genuinely different: on noisy tournaments greedy sometimes loses to exact."""
    rng = np.random.default_rng(5)
    gaps = []
    for _ in range(60):
        w = random_tournament(rng, 8, V=2, p_abstain=0.3)
        gaps.append(kemeny_disagreement(w, cara_order(w)) - kemeny_disagreement(w, kemeny_exact(w)))
    assert min(gaps) >= 0 and max(gaps) > 0


def test_disagreement_plus_agreement_is_constant():
    """Eq. 20: Agree(pi) + Disagree(pi) = sum_{i != j} w_ij for every order."""
    rng = np.random.default_rng(6)
    w = random_tournament(rng, 5)
    total = w.sum() - np.trace(w)
    for order in itertools.permutations(range(5)):
        agree = kemeny_disagreement(w.T, order)  # votes for i over j with i ahead of j
        assert agree + kemeny_disagreement(w, order) == pytest.approx(total)


def test_cara_rewards_are_eq21_positions():
    rng = np.random.default_rng(7)
    counts = np.stack([random_tournament(rng, 6) for _ in range(5)])
    for method, aggregate in (("greedy", cara_order), ("exact", kemeny_exact)):
        r = cara_rewards(counts, alpha=0.1, method=method)
        assert r.shape == (5, 6) and r.dtype == np.float32
        for g in range(5):
            order = aggregate(counts[g])
            expected = np.empty(6)
            expected[order] = 0.1 * np.arange(5, -1, -1)  # alpha * |{j : i ahead of j}|
            np.testing.assert_allclose(r[g], expected, rtol=1e-6)


def test_cara_rewards_cycle_three():
    c = np.zeros((1, 3, 3), dtype=np.int64)
    c[0, 0, 1], c[0, 1, 0] = 5, 0  # 0 > 1 by 5
    c[0, 1, 2], c[0, 2, 1] = 3, 1  # 1 > 2 by 2
    c[0, 2, 0], c[0, 0, 2] = 2, 1  # 2 > 0 by 1: the weakest link of the cycle is dropped
    assert cara_order(c[0]).tolist() == [0, 1, 2]
    np.testing.assert_allclose(cara_rewards(c, method="greedy"), [[2.0, 1.0, 0.0]])
    np.testing.assert_allclose(cara_rewards(c, method="exact"), [[2.0, 1.0, 0.0]])


def test_single_response():
    assert cara_order(np.zeros((1, 1))).tolist() == [0]
    assert kemeny_exact(np.zeros((1, 1))).tolist() == [0]


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: cara_order(np.zeros((1, 3, 3))), "rank 2"),
        (lambda: cara_order(np.zeros((2, 3))), "square"),
        (lambda: cara_order(-np.ones((3, 3))), "negative"),
        (lambda: kemeny_exact(np.zeros((17, 17))), "at most 16"),
        (lambda: cara_rewards(np.zeros((1, 17, 17)), method="exact"), "method='greedy'"),
        (lambda: cara_rewards(np.zeros((1, 3, 3)), method="borda"), "unknown method"),
        (lambda: cara_rewards(np.zeros((3, 3))), "rank 3"),
        (lambda: kemeny_disagreement(np.zeros((3, 3)), [0, 0, 1]), "permutation"),
    ],
)
def test_input_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()
