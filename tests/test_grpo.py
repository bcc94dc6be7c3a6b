"""GRPO: Eq. 4 advantages (affine invariance, Eq. 13) and the clipped loss (numpy references, gradients, Eq. 9)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rrc_jax.rl.grpo import grpo_loss, group_advantages

# ---------------------------------------------------------------------------------------------------- advantages


def test_group_advantages_eq4_population_std():
    r = np.array([[1.0, 2.0, 3.0, 6.0], [0.0, 0.0, 1.0, 1.0]])
    mu, sd = r.mean(1, keepdims=True), r.std(1, keepdims=True)  # numpy std is the 1/m population std
    np.testing.assert_allclose(np.asarray(group_advantages(r)), (r - mu) / (sd + 1e-6), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(group_advantages(r, "rlvr_no_std")), r - mu, rtol=1e-6)


def test_flat_group_gets_zero_advantages():
    r = np.array([[0.1, 0.1, 0.1], [2.2, 2.2, 2.2], [0.0, 1.0, 3.0]], dtype=np.float32)  # naive: ~1e-2
    for estimator in ("group_norm", "rlvr_no_std", "rloo"):
        a = np.asarray(group_advantages(r, estimator))
        assert np.all(a[:2] == 0.0) and np.all(a[2] != 0.0)


@st.composite
def reward_groups(draw, spread):
    b, m = draw(st.integers(1, 4)), draw(st.integers(2, 16))
    r = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).uniform(0.0, spread, size=(b, m))
    assume(np.all(r.std(axis=1) >= 0.1 * spread))
    return r


# float32 bounds the shift: b*r + d is rounded to float32 before the advantages see it, so |d| is kept within a few
# reward scales (a shift of 1e3 reward scales would alone cost ~1e-4 of precision).
@settings(max_examples=60, deadline=None)
@given(reward_groups(1.0), st.floats(1e-3, 1e3), st.floats(-1.0, 1.0))
def test_group_advantages_affine_invariance_eq13(r, b, d_scale):
    d = d_scale * b * 3.0
    a = np.asarray(group_advantages(r.astype(np.float32), eps=0.0))
    a_affine = np.asarray(group_advantages((b * r + d).astype(np.float32), eps=0.0))
    np.testing.assert_allclose(a_affine, a, atol=1e-5)


@settings(max_examples=60, deadline=None)
@given(reward_groups(10.0), st.floats(1.0, 1e3), st.floats(-1.0, 1.0))
def test_group_advantages_affine_invariance_default_eps(r, b, d_scale):
    d = d_scale * b * 10.0
    a = np.asarray(group_advantages(r.astype(np.float32)))
    a_affine = np.asarray(group_advantages((b * r + d).astype(np.float32)))
    np.testing.assert_allclose(a_affine, a, atol=1e-5)


def test_dr_grpo_advantages_shift_invariant_and_scale_equivariant():
    r = np.random.default_rng(0).uniform(size=(3, 8)).astype(np.float32)
    a = np.asarray(group_advantages(r, "rlvr_no_std"))
    np.testing.assert_allclose(np.asarray(group_advantages(r + 2.0, "rlvr_no_std")), a, atol=1e-6)
    np.testing.assert_allclose(np.asarray(group_advantages(3.0 * r, "rlvr_no_std")), 3.0 * a, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------- loss


def loss_reference(lp, old, ref, adv, mask, eps_low, eps_high, beta, aggregation, max_len):
    """Hand-written per-token loops."""
    batch, time = lp.shape
    per_seq, n_tokens = [], []
    for i in range(batch):
        total, n = 0.0, 0
        for t in range(time):
            if not mask[i, t]:
                continue
            ratio = np.exp(lp[i, t] - old[i, t])
            clipped = min(max(ratio, 1 - eps_low), 1 + eps_high)
            value = -min(ratio * adv[i], clipped * adv[i])
            if ref is not None:
                x = ref[i, t] - lp[i, t]
                value += beta * (np.exp(x) - x - 1)
            total += value
            n += 1
        per_seq.append(total)
        n_tokens.append(n)
    if aggregation == "token_mean":
        return sum(per_seq) / max(sum(n_tokens), 1)
    if aggregation == "seq_mean_token_sum_norm":
        return sum(s / (max_len or time) for s in per_seq) / batch
    means = [s / n for s, n in zip(per_seq, n_tokens) if n > 0]
    return sum(means) / max(len(means), 1)


def random_batch(seed, batch=6, time=7, nan_padding=True, dtype=np.float32):
    rng = np.random.default_rng(seed)
    lp = -rng.uniform(0.1, 3.0, size=(batch, time))
    old = lp + rng.normal(scale=0.3, size=(batch, time))  # ratios well outside [0.8, 1.2]: clipping engages
    ref = lp + rng.normal(scale=0.3, size=(batch, time))
    adv = rng.normal(size=batch)
    lengths = rng.integers(0, time + 1, size=batch)
    lengths[0], lengths[1] = 0, time  # an empty sequence and a full one
    mask = np.arange(time)[None, :] < lengths[:, None]
    if nan_padding:  # garbage in padded positions must not matter
        lp, old, ref = (np.where(mask, x, np.nan) for x in (lp, old, ref))
    return tuple(x.astype(dtype) if x.dtype != bool else x for x in (lp, old, ref, adv, mask))


AGGREGATIONS = ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"]


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("beta, use_ref", [(0.0, False), (0.05, True)])
def test_loss_matches_numpy_reference(aggregation, beta, use_ref):
    for seed in range(3):
        lp, old, ref, adv, mask = random_batch(seed)
        kwargs = dict(eps_low=0.2, eps_high=0.28, beta=beta, aggregation=aggregation)
        max_len = 11 if seed == 2 else None
        loss, metrics = grpo_loss(lp, old, ref if use_ref else None, adv, mask, max_len=max_len, **kwargs)
        want = loss_reference(lp.astype(np.float64), old, ref if use_ref else None, adv, mask, 0.2, 0.28, beta,
                              aggregation, max_len)
        assert float(loss) == pytest.approx(want, rel=1e-5, abs=1e-6)
        assert np.isfinite(float(metrics["policy_loss"]))


def test_metrics():
    lp = np.log(np.array([[1.5, 0.5, 1.0, 1.1], [1.5, 0.5, 1.0, 9.0]], dtype=np.float32))
    old = np.zeros_like(lp)  # ratios = exp(lp)
    adv = np.array([1.0, -1.0], dtype=np.float32)
    mask = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=bool)
    ref = old.copy()
    _, m = grpo_loss(lp, old, ref, adv, mask, eps_low=0.2, eps_high=0.2, beta=0.1)
    # Clipped branch active: (A>0, ratio 1.5 > 1.2) and (A<0, ratio 0.5 < 0.8); the ratio 9.0 is padding.
    assert float(m["clip_fraction"]) == pytest.approx(2 / 7)
    assert float(m["clip_high_fraction"]) == pytest.approx(1 / 7)
    assert float(m["clip_low_fraction"]) == pytest.approx(1 / 7)
    assert float(m["ratio_max"]) == pytest.approx(1.5, rel=1e-6)
    assert float(m["ratio_min"]) == pytest.approx(0.5, rel=1e-6)
    assert float(m["ratio_mean"]) == pytest.approx((1.5 + 0.5 + 1 + 1.1 + 1.5 + 0.5 + 1) / 7, rel=1e-6)
    ratios = np.exp(lp)[mask]
    kl = np.mean(1 / ratios + np.log(ratios) - 1)  # k3 with pi_ref = 1: 1/rho - log(1/rho) - 1
    assert float(m["kl"]) == pytest.approx(kl, rel=1e-5)
    assert float(m["num_tokens"]) == 7


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_gradient_matches_finite_differences(aggregation):
    with jax.enable_x64(True):
        lp, old, ref, adv, mask = random_batch(7, batch=4, time=5, nan_padding=False, dtype=np.float64)
        ratio = np.exp(lp - old)
        for edge in (0.8, 1.25):  # keep every token away from the clip kinks
            assert np.all(np.abs(ratio - edge) > 1e-3)

        def f(x):
            return grpo_loss(x, old, ref, adv, mask, eps_low=0.2, eps_high=0.25, beta=0.1, aggregation=aggregation)[0]

        grad = np.asarray(jax.grad(f)(jnp.asarray(lp)))
        assert grad.dtype == np.float64
        h = 1e-6
        fd = np.zeros_like(lp)
        for idx in np.ndindex(lp.shape):
            e = np.zeros_like(lp)
            e[idx] = h
            fd[idx] = (float(f(lp + e)) - float(f(lp - e))) / (2 * h)
        np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)
        assert np.all(grad[~mask] == 0.0) and np.any(grad[mask] != 0.0)


def test_nan_padding_gives_finite_gradients():
    lp, old, ref, adv, mask = random_batch(3)
    grad, metrics = jax.grad(lambda x: grpo_loss(x, old, ref, adv, mask, beta=0.1), has_aux=True)(jnp.asarray(lp))
    grad = np.asarray(grad)
    assert np.all(np.isfinite(grad)) and np.all(grad[~mask] == 0.0)
    assert all(np.isfinite(float(v)) for v in metrics.values())


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_on_policy_gradient_is_eq9_policy_gradient(aggregation):
    """With ratio 1 and beta 0 the loss gradient is -c * sum_i w_i A_i grad log pi(o_i) (Eq. 9)."""
    rng = np.random.default_rng(11)
    batch, time, vocab = 6, 5, 4
    theta = jnp.asarray(rng.normal(size=(time, vocab)), jnp.float32)  # a position-wise categorical policy
    tokens = rng.integers(0, vocab, size=(batch, time))
    lengths = np.array([5, 3, 1, 4, 2, 5])
    mask = np.arange(time)[None, :] < lengths[:, None]
    adv = np.asarray(group_advantages(rng.normal(size=(1, batch)))).reshape(-1)

    def token_logprobs(th):
        return jnp.take_along_axis(jax.nn.log_softmax(th)[None].repeat(batch, 0), tokens[..., None], -1)[..., 0]

    def loss(th):
        lp = token_logprobs(th)
        return grpo_loss(lp, jax.lax.stop_gradient(lp), None, adv, mask, aggregation=aggregation)[0]

    def log_pi(th, i):  # log pi(o_i | x) = sum over the sequence's tokens
        return jnp.sum(jnp.where(mask[i], token_logprobs(th)[i], 0.0))

    weight = {  # per-sequence constant each aggregation puts in front of A_i grad log pi(o_i)
        "seq_mean_token_mean": 1.0 / (batch * lengths),
        "token_mean": np.full(batch, 1.0 / lengths.sum()),
        "seq_mean_token_sum_norm": np.full(batch, 1.0 / (batch * time)),
    }[aggregation]
    expected = -sum(weight[i] * adv[i] * jax.grad(log_pi)(theta, i) for i in range(batch))
    np.testing.assert_allclose(np.asarray(jax.grad(loss)(theta)), np.asarray(expected), rtol=1e-5, atol=1e-7)


def test_jit_and_value_and_grad():
    lp, old, ref, adv, mask = random_batch(4)
    step = jax.jit(jax.value_and_grad(lambda x, a, beta: grpo_loss(x, old, ref, a, mask, beta=beta,
                                                                    aggregation="token_mean"), has_aux=True))
    (loss, metrics), grad = step(jnp.asarray(lp), jnp.asarray(adv), 0.05)
    eager, _ = grpo_loss(lp, old, ref, adv, mask, beta=0.05, aggregation="token_mean")
    assert float(loss) == pytest.approx(float(eager), rel=1e-6)
    assert grad.shape == lp.shape and set(metrics) >= {"kl", "clip_fraction", "ratio_mean"}


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda a: grpo_loss(a[0], a[1], a[2], a[3], a[4], aggregation="sum"), "unknown aggregation"),
        (lambda a: grpo_loss(a[0][0], a[1], a[2], a[3], a[4]), "rank 2"),
        (lambda a: grpo_loss(a[0], a[1][:, :3], a[2], a[3], a[4]), "old_logprobs"),
        (lambda a: grpo_loss(a[0], a[1], a[2], a[3][:, None], a[4]), "advantages"),
        (lambda a: grpo_loss(a[0], a[1], a[2], a[3], a[4][:2]), "mask"),
        (lambda a: grpo_loss(a[0], a[1], None, a[3], a[4], beta=0.1), "ref_logprobs"),
        (lambda a: grpo_loss(a[0], a[1], a[2], a[3], a[4], max_len=0), "max_len"),
        (lambda a: grpo_loss(a[0], a[1], a[2], a[3], a[4], eps_low=1.5), "eps_low"),
        (lambda a: group_advantages(a[3]), "rank 2"),
    ],
)
def test_input_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call(random_batch(0))
