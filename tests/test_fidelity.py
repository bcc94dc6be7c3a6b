"""Reward fidelity measures against hand-computed values."""

import numpy as np
import pytest

from rrc_jax.rl.fidelity import advantage_error, fidelity_metrics, kendall_tau


def test_kendall_tau_b_by_hand():
    q = np.array([[0.1, 0.5, 0.9], [0.1, 0.5, 0.9], [0.2, 0.2, 0.8], [0.3, 0.3, 0.3]])
    r = np.array([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0], [0.0, 1.0, 1.0], [1.0, 2.0, 3.0]])
    tau = kendall_tau(r, q)
    assert tau[0] == 1.0 and tau[1] == -1.0
    # group 2: pairs (0,1) r- q0, (0,2) r- q-: concordant, (1,2) r0 q-: n0 = 3, ties 1 in r and 1 in q
    assert tau[2] == pytest.approx(1 / np.sqrt(2 * 2))
    assert np.isnan(tau[3])  # constant quality: nothing to rank
    with pytest.raises(ValueError, match="must both be"):
        kendall_tau(r[:, :2], q)


def test_advantage_error_is_zero_for_an_affine_reward_and_large_for_a_reversed_one():
    q = np.array([[0.1, 0.5, 0.9, 0.3]])
    assert advantage_error(2 * q + 1, q)[0] == pytest.approx(0.0, abs=1e-5)  # Eq. 13: invariant to r -> b r + d
    assert advantage_error(-q, q)[0] == pytest.approx(2.0, abs=1e-4)  # advantages of unit variance, negated
    flat = advantage_error(np.zeros((1, 4)), q)[0]  # a flat reward has zero advantages: the oracle's RMS, 1
    assert flat == pytest.approx(1.0, abs=1e-4)
    m = fidelity_metrics(np.vstack([q, q]), np.vstack([q, np.full((1, 4), 0.5)]))
    assert m["fidelity/kendall_tau"] == 1.0 and m["fidelity/advantage_error"] == pytest.approx(0.5, abs=1e-4)
