"""IRPO intergroup rewards for pointwise generative judges (IRPO paper, Section 3).

A pointwise judge scores one response at a time. For a preference pair ``(x, y_c, y_r)`` IRPO samples ``G``
judge completions for the chosen response and ``G`` for the rejected one, giving scores ``s_c`` (chosen group) and
``s_r`` (rejected group); each completion is rewarded by comparing its score with the *other* group (intergroup),
then GRPO advantages are computed within each group. Every function takes ``s_c: [batch, G_c]`` and
``s_r: [batch, G_r]`` and returns ``(r_c [batch, G_c], r_r [batch, G_r])``; the two groups may differ in size.

A NaN score is an abstention (the judge wrote no parseable score; `Judge.score` counts them): it is left out of
every group statistic and comparison. The abstaining completion itself gets its rule's lowest reward (0 for the
preference-strength and AUC rewards, -1 for the rule rewards; IRPO's format reward adds -0.5 on top). A scored
completion with no scored completion in the other group to compare with gets a neutral reward (0.5, or 0 for the
rule rewards), so an abstention never turns a whole group's rewards to -1 or NaN.

Paper discrepancy, resolved here: IRPO Eq. 6 prints ``p_i^r = 1/G sum_j sigma(s_i^r - s_j^c)``, which would reward
the judge for scoring the *rejected* response higher. The surrounding text ("the reward increases ... as the score
of the rejected response decreases") and the AUC form ``I(s_i^r < s_j^c)`` say the opposite, so we implement
``p_i^r = 1/G sum_j sigma(s_j^c - s_i^r)``.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from scipy.special import stdtrit

from rrc_jax.rewards._checks import check_option, check_rank, check_real

RULE_ESTIMATORS = ("mean", "median", "interval")


def _as_groups(s_c, s_r) -> tuple[jax.Array, jax.Array]:
    bc, _ = check_rank(s_c, 2, "s_c (chosen-group scores)", "[batch, G_c]")
    br, _ = check_rank(s_r, 2, "s_r (rejected-group scores)", "[batch, G_r]")
    if bc != br:
        raise ValueError(f"s_c and s_r must share the batch axis (one row per preference pair), got {bc} and {br}.")
    check_real(s_c, "s_c")
    check_real(s_r, "s_r")
    return jnp.asarray(s_c, jnp.float32), jnp.asarray(s_r, jnp.float32)


def _pair_means(p, s_c, s_r):
    """Means of pairwise values `p [batch, G_c, G_r]` over the scored opponents of each completion: 0 for an
    abstaining completion, 0.5 for one with no scored opponent."""
    ok_c, ok_r = jnp.isfinite(s_c), jnp.isfinite(s_r)
    both = ok_c[:, :, None] & ok_r[:, None, :]
    p = jnp.where(both, p, 0.0)
    n_c, n_r = both.sum(axis=2), both.sum(axis=1)
    mean = lambda total, n, ok: jnp.where(ok, jnp.where(n > 0, total / jnp.maximum(n, 1), 0.5), 0.0)
    return mean(p.sum(axis=2), n_c, ok_c), mean(p.sum(axis=1), n_r, ok_r)


@jax.jit
def _preference_strength(s_c, s_r):
    gap = s_c[:, :, None] - s_r[:, None, :]  # [batch, G_c, G_r]: s_i^c - s_j^r
    return _pair_means(jax.nn.sigmoid(gap), s_c, s_r)  # Eq. 5; Eq. 6 with sigma(s_j^c - s_i^r) (module docstring)


def preference_strength(s_c, s_r) -> tuple[jax.Array, jax.Array]:
    """IRPO Eq. 5-6: ``p_i^c = mean_j sigma(s_i^c - s_j^r)``, ``p_i^r = mean_j sigma(s_j^c - s_i^r)``.

    Both rewards rise as the judge separates chosen above rejected. (The paper reports this reward collapses
    training by inflating score variance; the rule-based rewards are its fix.)
    """
    return _preference_strength(*_as_groups(s_c, s_r))


@jax.jit
def _auc_rewards(s_c, s_r):
    above = (s_c[:, :, None] > s_r[:, None, :]).astype(jnp.float32)  # I(s_i^c > s_j^r)
    return _pair_means(above, s_c, s_r)  # r_j^r = mean_i I(s_j^r < s_i^c)


def auc_rewards(s_c, s_r) -> tuple[jax.Array, jax.Array]:
    """IRPO AUC rewards: ``r_i^c = mean_j I(s_i^c > s_j^r)``, ``r_i^r = mean_j I(s_i^r < s_j^c)`` (ties give 0)."""
    return _auc_rewards(*_as_groups(s_c, s_r))


def _estimate(s: jax.Array, estimator: str, bound: str, confidence: float) -> jax.Array:
    """``theta-hat`` of one group over its scored completions, ``[batch, G] -> [batch, 1]`` (NaN when it has too
    few: none, or one for ``'interval'``)."""
    g = s.shape[-1]
    ok = jnp.isfinite(s)
    n = ok.sum(axis=-1, keepdims=True)
    mu = jnp.where(ok, s, 0.0).sum(axis=-1, keepdims=True) / jnp.maximum(n, 1)
    if estimator == "mean":
        return jnp.where(n > 0, mu, jnp.nan)
    if estimator == "median":  # s_(ceil(0.5 n)) of the ascending scored values, 1-indexed: the lower median
        ranked = jnp.sort(jnp.where(ok, s, jnp.inf), axis=-1)
        k = jnp.maximum((n + 1) // 2 - 1, 0)  # ceil(0.5 n) - 1
        return jnp.where(n > 0, jnp.take_along_axis(ranked, k, axis=-1), jnp.nan)
    # Interval: mu +- t_{1 - a/2, n - 1} * sigma / sqrt(n) with the unbiased sample variance of the n scored values.
    t = jnp.asarray([math.nan, math.nan] + [float(stdtrit(k - 1, 0.5 + confidence / 2.0)) for k in range(2, g + 1)],
                    jnp.float32)
    var = jnp.where(ok, (s - mu) ** 2, 0.0).sum(axis=-1, keepdims=True) / jnp.maximum(n - 1, 1)
    half_width = t[n] * jnp.sqrt(var / jnp.maximum(n, 1))
    return mu + half_width if bound == "upper" else mu - half_width


@functools.partial(jax.jit, static_argnames=("estimator", "confidence"))
def _rule_rewards(s_c, s_r, estimator, confidence):
    theta_c = _estimate(s_c, estimator, "upper", confidence)  # chosen group: upper bound of its interval
    theta_r = _estimate(s_r, estimator, "lower", confidence)  # rejected group: lower bound of its interval
    rule = lambda s, better, theta: jnp.where(jnp.isfinite(s), jnp.where(jnp.isnan(theta), 0.0,
                                                                          jnp.where(better, 1.0, -1.0)), -1.0)
    return (rule(s_c, s_c > theta_r, theta_r).astype(jnp.float32),
            rule(s_r, s_r < theta_c, theta_c).astype(jnp.float32))


def rule_rewards(s_c, s_r, estimator: str = "median", *, confidence: float = 0.95) -> tuple[jax.Array, jax.Array]:
    """IRPO rule-based intergroup rewards (Section 3.2), +1 / -1 per judge completion.

    ``r_i^c = +1 if s_i^c > theta_r else -1`` and ``r_j^r = +1 if s_j^r < theta_c else -1``, where ``theta_c`` /
    ``theta_r`` estimate the chosen / rejected group's score:

    * ``'mean'``: the sample mean.
    * ``'median'`` (the paper's best): ``s_(ceil(0.5 G))`` of the ascending scores, the lower median for even G.
    * ``'interval'``: a Student-t confidence interval ``mu +- t_{1-a/2, G-1} sigma / sqrt(G)`` (unbiased variance,
      ``confidence = 1 - a``, 0.95 in the paper). As the paper states, ``theta_c`` is the *upper* bound of the
      chosen group's interval and ``theta_r`` the *lower* bound of the rejected group's; needs ``G >= 2``.

    Args:
      s_c: ``[batch, G_c]`` scores of the chosen response's completions.
      s_r: ``[batch, G_r]`` scores of the rejected response's completions.

    Returns:
      ``(r_c [batch, G_c], r_r [batch, G_r])`` float32 in {-1, +1}; 0 for a scored completion whose other group
      has too few scores for its estimate (NaN scores are abstentions, see the module docstring).
    """
    check_option(estimator, RULE_ESTIMATORS, "estimator")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}.")
    s_c, s_r = _as_groups(s_c, s_r)
    if min(s_c.shape[-1], s_r.shape[-1]) < (2 if estimator == "interval" else 1):
        raise ValueError(
            f"estimator={estimator!r} needs at least {2 if estimator == 'interval' else 1} completions per group, "
            f"got G_c={s_c.shape[-1]}, G_r={s_r.shape[-1]}."
        )
    return _rule_rewards(s_c, s_r, estimator, float(confidence))


def format_reward(format_ok) -> jax.Array:
    """IRPO format reward: 0 where the judge output matches the required format, -0.5 otherwise.

    Args:
      format_ok: boolean array of any shape (e.g. ``[batch, G]``).

    Returns:
      float32 array of the same shape; add it to the intergroup reward (``r = r_i + r_f``).
    """
    check_real(format_ok, "format_ok")
    return jnp.where(jnp.asarray(format_ok, dtype=bool), 0.0, -0.5).astype(jnp.float32)
