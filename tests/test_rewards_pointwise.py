"""PRC (Eq. 5 + Table 6 saturation), the Bradley-Terry loss (Eq. 1) and IRPO intergroup / format rewards."""

import math
import statistics

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from rrc_jax.rewards import (
    auc_rewards,
    bradley_terry_loss,
    format_reward,
    prc_rewards,
    prc_saturation,
    preference_strength,
    rule_rewards,
)

# ----------------------------------------------------------------------------------------------------------- PRC


def test_prc_rewards_are_the_probabilities():
    p = np.array([[0.0, 0.3, 1.0], [0.95, 0.5, 0.05]])
    np.testing.assert_allclose(np.asarray(prc_rewards(p)), p, rtol=1e-7)


def test_prc_saturation_table6_buckets():
    p = np.array([0.0, 0.05, 0.1, 0.100001, 0.5, 0.899, 0.9, 0.97, 1.0, 0.3])
    assert float(prc_saturation(p)) == pytest.approx(6 / 10)  # 0, .05, .1 | .9, .97, 1 (edges inclusive)
    assert float(prc_saturation(p, low=0.2, high=0.8)) == pytest.approx(8 / 10)


@pytest.mark.parametrize("bad", [[1.2, 0.5], [-0.1], [np.nan]])
def test_prc_rejects_non_probabilities(bad):
    with pytest.raises(ValueError, match=r"probabilities in \[0, 1\]"):
        prc_rewards(np.array(bad))
    with pytest.raises(ValueError, match="low < high"):
        prc_saturation(np.array([0.5]), low=0.9, high=0.1)


# ----------------------------------------------------------------------------------------------------------- DRM


def test_bradley_terry_loss_matches_eq1():
    rng = np.random.default_rng(0)
    rc, rr, margin = rng.normal(size=16), rng.normal(size=16), rng.uniform(0, 1, size=16)
    nll = lambda d: np.mean(np.log1p(np.exp(-d)))  # noqa: E731  -log sigmoid(d)
    assert float(bradley_terry_loss(rc, rr)) == pytest.approx(nll(rc - rr), rel=1e-5)
    assert float(bradley_terry_loss(rc, rr, margin=margin)) == pytest.approx(nll(rc - rr - margin), rel=1e-5)
    want = nll(rc - rr) + 0.01 * np.mean((rc + rr) ** 2)
    assert float(bradley_terry_loss(rc, rr, center_coef=0.01)) == pytest.approx(want, rel=1e-5)


def test_bradley_terry_loss_is_stable_and_differentiable():
    rc, rr = jnp.array([100.0, -100.0]), jnp.array([-100.0, 100.0])
    loss = bradley_terry_loss(rc, rr)
    assert np.isfinite(float(loss)) and float(loss) == pytest.approx(100.0, rel=1e-4)
    g_c, g_r = jax.grad(bradley_terry_loss, argnums=(0, 1))(jnp.array([0.0, 1.0]), jnp.array([0.5, 0.0]))
    assert np.all(np.asarray(g_c) < 0) and np.all(np.asarray(g_r) > 0)  # push chosen up, rejected down
    np.testing.assert_allclose(np.asarray(g_c), -np.asarray(g_r))


def test_bradley_terry_loss_shape_errors():
    with pytest.raises(ValueError, match=r"\[batch\]"):
        bradley_terry_loss(np.zeros((4, 1)), np.zeros((4, 1)))
    with pytest.raises(ValueError, match="margin"):
        bradley_terry_loss(np.zeros(4), np.zeros(4), margin=np.zeros(3))


# ---------------------------------------------------------------------------------------------------------- IRPO


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def random_scores(rng, b=6, gc=5, gr=4):
    # Scores on the 0-10 rubric with one decimal, so ties and equal-to-threshold cases occur.
    return np.round(rng.uniform(0, 10, size=(b, gc)), 1), np.round(rng.uniform(0, 10, size=(b, gr)), 1)


def test_preference_strength_eq5_eq6():
    s_c, s_r = random_scores(np.random.default_rng(1))
    p_c, p_r = (np.asarray(x) for x in preference_strength(s_c, s_r))
    for b in range(s_c.shape[0]):
        for i in range(s_c.shape[1]):
            want = sum(sigmoid(s_c[b, i] - s_r[b, j]) for j in range(s_r.shape[1])) / s_r.shape[1]
            assert p_c[b, i] == pytest.approx(want, rel=1e-5)
        for i in range(s_r.shape[1]):  # oriented so that a lower rejected score earns more (see irpo.py)
            want = sum(sigmoid(s_c[b, j] - s_r[b, i]) for j in range(s_c.shape[1])) / s_c.shape[1]
            assert p_r[b, i] == pytest.approx(want, rel=1e-5)


def test_auc_rewards():
    s_c, s_r = random_scores(np.random.default_rng(2))
    r_c, r_r = (np.asarray(x) for x in auc_rewards(s_c, s_r))
    for b in range(s_c.shape[0]):
        for i in range(s_c.shape[1]):
            assert r_c[b, i] == pytest.approx(np.mean([s_c[b, i] > s for s in s_r[b]]))
        for i in range(s_r.shape[1]):
            assert r_r[b, i] == pytest.approx(np.mean([s_r[b, i] < s for s in s_c[b]]))


def theta_literal(scores, estimator, bound):
    g = len(scores)
    if estimator == "mean":
        return sum(scores) / g
    if estimator == "median":
        return sorted(scores)[math.ceil(0.5 * g) - 1]  # s_(ceil(0.5 G)), 1-indexed
    mu, sigma = statistics.mean(scores), statistics.stdev(scores)  # stdev: unbiased variance
    half = stats.t.ppf(1 - 0.05 / 2, g - 1) * sigma / math.sqrt(g)
    return mu + half if bound == "upper" else mu - half


@pytest.mark.parametrize("estimator", ["mean", "median", "interval"])
@pytest.mark.parametrize("sizes", [(5, 4), (4, 4), (2, 3)])
def test_rule_rewards_match_literal(estimator, sizes):
    s_c, s_r = random_scores(np.random.default_rng(3), b=20, gc=sizes[0], gr=sizes[1])
    r_c, r_r = (np.asarray(x) for x in rule_rewards(s_c, s_r, estimator))
    for b in range(s_c.shape[0]):
        theta_c = theta_literal(s_c[b].tolist(), estimator, "upper")
        theta_r = theta_literal(s_r[b].tolist(), estimator, "lower")
        assert r_c[b].tolist() == [1.0 if s > theta_r + 1e-4 else -1.0 if s < theta_r - 1e-4 else r for s, r in
                                   zip(s_c[b], r_c[b])]
        assert r_r[b].tolist() == [1.0 if s < theta_c - 1e-4 else -1.0 if s > theta_c + 1e-4 else r for s, r in
                                   zip(s_r[b], r_r[b])]
        assert set(r_c[b].tolist()) <= {-1.0, 1.0} and set(r_r[b].tolist()) <= {-1.0, 1.0}


def test_rule_rewards_median_exact_values():
    s_c = np.array([[8.0, 6.0, 9.0, 7.0]])  # lower median 7
    s_r = np.array([[5.0, 6.5, 2.0, 6.0]])  # lower median 5
    r_c, r_r = rule_rewards(s_c, s_r, "median")
    assert np.asarray(r_c).tolist() == [[1.0, 1.0, 1.0, 1.0]]  # all > 5
    assert np.asarray(r_r).tolist() == [[1.0, 1.0, 1.0, 1.0]]  # all < 7
    r_c, r_r = rule_rewards(s_c, np.array([[7.0, 7.0, 7.0, 9.0]]), "median")
    assert np.asarray(r_c).tolist() == [[1.0, -1.0, 1.0, -1.0]]  # a tie with theta is not a win
    assert np.asarray(r_r).tolist() == [[-1.0, -1.0, -1.0, -1.0]]


def test_format_reward():
    np.testing.assert_array_equal(np.asarray(format_reward(np.array([[True, False]]))), [[0.0, -0.5]])


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: rule_rewards(np.zeros((2, 3)), np.zeros((2, 3)), "mode"), "unknown estimator"),
        (lambda: rule_rewards(np.zeros((2, 1)), np.zeros((2, 3)), "interval"), "at least 2"),
        (lambda: rule_rewards(np.zeros((2, 3)), np.zeros((3, 3))), "batch axis"),
        (lambda: auc_rewards(np.zeros(3), np.zeros(3)), "rank 2"),
        (lambda: rule_rewards(np.zeros((2, 3)), np.zeros((2, 3)), confidence=1.5), "confidence"),
    ],
)
def test_irpo_input_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("estimator", ["mean", "median", "interval"])
def test_unparseable_scores_are_abstentions(estimator):
    """A NaN score (the judge wrote none) leaves the group statistics: the other completions get the rewards they
    get without it, the abstaining one gets -1, and nothing is NaN; with no scored completion left in a group, the
    other group's completions get 0 (no comparison to make)."""
    rng = np.random.default_rng(0)
    s_c, s_r = rng.normal(6.0, 1.0, (3, 5)), rng.normal(4.0, 1.0, (3, 5))
    s_c_nan, s_r_nan = s_c.copy(), s_r.copy()
    s_c_nan[0, 1] = s_r_nan[1, 4] = s_r_nan[2, 0] = np.nan
    r_c, r_r = map(np.asarray, rule_rewards(s_c_nan, s_r_nan, estimator))
    assert np.isfinite(r_c).all() and np.isfinite(r_r).all()
    assert r_c[0, 1] == -1 and r_r[1, 4] == -1 and r_r[2, 0] == -1
    for b in range(3):
        keep_c, keep_r = ~np.isnan(s_c_nan[b]), ~np.isnan(s_r_nan[b])
        want_c, want_r = map(np.asarray, rule_rewards(s_c[b][keep_c][None], s_r[b][keep_r][None], estimator))
        np.testing.assert_array_equal(r_c[b][keep_c], want_c[0])
        np.testing.assert_array_equal(r_r[b][keep_r], want_r[0])
    r_c, r_r = map(np.asarray, rule_rewards(s_c, np.full_like(s_r, np.nan), estimator))
    assert (r_c == 0).all() and (r_r == -1).all()


def test_pairwise_rewards_skip_abstentions():
    s_c, s_r = np.array([[3.0, np.nan, 5.0]]), np.array([[4.0, np.nan]])
    for fn in (auc_rewards, preference_strength):
        r_c, r_r = map(np.asarray, fn(s_c, s_r))
        want_c, want_r = map(np.asarray, fn(np.array([[3.0, 5.0]]), np.array([[4.0]])))
        np.testing.assert_allclose(r_c[0, [0, 2]], want_c[0], rtol=1e-6)
        np.testing.assert_allclose(r_r[0, 0], want_r[0, 0], rtol=1e-6)
        assert r_c[0, 1] == 0 and r_r[0, 1] == 0
