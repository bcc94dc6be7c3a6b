"""Reward fidelity: how closely a step's rewards rank and weigh each group's responses as the oracle quality does
(measures of the reproduction study, beyond the paper). Host-side numpy; B groups of m responses.

- `kendall_tau(rewards, quality) -> [B]`: Kendall's tau-b between a group's rewards and its oracle qualities, in
  [-1, 1]; NaN for a group where either is constant (there is no ranking to compare).
- `advantage_error(rewards, quality) -> [B]`: the root-mean-square difference between the group's GRPO advantages
  (Eq. 4) computed from the rewards and computed from the oracle qualities: what the update gets wrong, in
  advantage units (0 for a perfect reward; about 1.4 for one uncorrelated with the oracle).
- `fidelity_metrics(rewards, quality)`: both, averaged over the groups where they are defined, as trainer metrics.
"""

from __future__ import annotations

import warnings

import numpy as np

from rrc_jax.rl.grpo import group_advantages


def _pair_signs(x: np.ndarray) -> np.ndarray:
    """sign(x_i - x_j) `[B, P]` over the m(m-1)/2 pairs i < j of each group."""
    i, j = np.triu_indices(x.shape[1], k=1)
    return np.sign(x[:, i] - x[:, j])


def kendall_tau(rewards, quality) -> np.ndarray:
    """Kendall's tau-b `[B]` float64 between `rewards [B, m]` and `quality [B, m]`, per group (NaN when constant)."""
    r, q = np.asarray(rewards, np.float64), np.asarray(quality, np.float64)
    if r.shape != q.shape or r.ndim != 2:
        raise ValueError(f"rewards {r.shape} and quality {q.shape} must both be [B, m]")
    sr, sq = _pair_signs(r), _pair_signs(q)
    norm = np.sqrt(np.abs(sr).sum(1) * np.abs(sq).sum(1))  # sqrt((n0 - n1)(n0 - n2))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norm > 0, (sr * sq).sum(1) / np.where(norm > 0, norm, 1.0), np.nan)


def advantage_error(rewards, quality) -> np.ndarray:
    """RMS difference `[B]` float64 between the GRPO advantages of `rewards [B, m]` and of `quality [B, m]`."""
    a = np.asarray(group_advantages(np.asarray(rewards, np.float32)), np.float64)
    b = np.asarray(group_advantages(np.asarray(quality, np.float32)), np.float64)
    return np.sqrt(np.mean((a - b) ** 2, axis=1))


def fidelity_metrics(rewards, quality) -> dict[str, float]:
    """`fidelity/kendall_tau` (mean over the groups where it is defined; NaN when none is) and
    `fidelity/advantage_error` (mean over all groups)."""
    tau = kendall_tau(rewards, quality)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # no group with a defined tau
        mean_tau = float(np.nanmean(tau)) if tau.size else float("nan")
    return {"fidelity/kendall_tau": mean_tau,
            "fidelity/advantage_error": float(advantage_error(rewards, quality).mean())}
