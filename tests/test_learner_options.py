"""The learner options of the peers (`rl.advantage`, `rl.loss`, `rl.overlong`, `rl.dynamic_sampling`), each against
a literal NumPy implementation of its formula on random inputs: RLOO's and Dr.GRPO's advantages, GSPO's sequence
ratio (and its token variant, and its gradient by finite differences), DAPO's overlong penalty and its dynamic
sampling's choice of groups. A run with all of them on, SIGKILLed and resumed: `test_lora` (one SIGKILL run for
both)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_config
from rrc_jax.config import validate
from rrc_jax.constructions import RewardResult
from rrc_jax.errors import ConfigError
from rrc_jax.rl.dynamic_sampling import Draw, fill
from rrc_jax.rl.grpo import LOSSES, grpo_loss, group_advantages, overlong_penalty
from rrc_jax.rl.rollout import Groups

# ---------------------------------------------------------------------------------------------------- advantages


def advantages_reference(r: np.ndarray, estimator: str) -> np.ndarray:
    """Each group's advantages by the estimators' definitions, one response at a time."""
    out = np.zeros_like(r)
    for b, group in enumerate(r):
        m = len(group)
        if group.max() == group.min():
            continue  # no signal: zero advantages
        for i in range(m):
            if estimator == "group_norm":
                out[b, i] = (group[i] - group.mean()) / (np.sqrt(((group - group.mean()) ** 2).mean()) + 1e-6)
            elif estimator == "rlvr_no_std":
                out[b, i] = group[i] - group.mean()
            else:  # RLOO: the mean of the m - 1 others as the baseline
                out[b, i] = group[i] - sum(group[j] for j in range(m) if j != i) / (m - 1)
    return out


@pytest.mark.parametrize("estimator", ["group_norm", "rlvr_no_std", "rloo"])
def test_each_advantage_estimator_is_its_formula(estimator):
    rng = np.random.default_rng(0)
    for case in range(50):
        b, m = rng.integers(1, 5), rng.integers(2, 9)
        r = rng.integers(0, 4, size=(b, m)).astype(np.float64) if case % 2 else rng.normal(size=(b, m))
        np.testing.assert_allclose(np.asarray(group_advantages(r.astype(np.float32), estimator)),
                                   advantages_reference(r, estimator), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------- GSPO


def gspo_reference(lp, old, adv, mask, eps_low, eps_high):
    """GSPO's objective, negated: -1/G sum_i min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i), with
    s_i = (pi(y_i) / pi_old(y_i))^(1/|y_i|) over sequences with a token."""
    terms = []
    for i in range(lp.shape[0]):
        n = mask[i].sum()
        if n == 0:
            continue
        s = np.exp(sum(lp[i, t] - old[i, t] for t in range(lp.shape[1]) if mask[i, t]) / n)
        terms.append(-min(s * adv[i], min(max(s, 1 - eps_low), 1 + eps_high) * adv[i]))
    return sum(terms) / max(len(terms), 1)


def gspo_batch(seed, batch=6, time=7, spread=0.02):
    rng = np.random.default_rng(seed)
    lp = -rng.uniform(0.1, 3.0, size=(batch, time))
    old = lp + rng.normal(scale=spread, size=(batch, time))
    adv = rng.normal(size=batch)
    lengths = rng.integers(0, time + 1, size=batch)
    lengths[0], lengths[1] = 0, time
    mask = np.arange(time)[None, :] < lengths[:, None]
    return lp, old, adv, mask


@pytest.mark.parametrize("loss", ["gspo", "gspo_token"])
def test_gspo_is_the_clipped_sequence_ratio_objective(loss):
    """Random batches, some sequence ratios inside GSPO's clip range and some outside: the loss equals the literal
    objective (both GSPO variants have the same value)."""
    eps_low, eps_high = LOSSES[loss].clip_range
    for seed in range(20):
        lp, old, adv, mask = gspo_batch(seed, spread=1e-3 if seed % 2 else 0.05)
        value, metrics = grpo_loss(lp.astype(np.float32), old.astype(np.float32), None, adv.astype(np.float32),
                                   mask, eps_low=eps_low, eps_high=eps_high, loss=loss)
        want = gspo_reference(lp, old, adv, mask, eps_low, eps_high)
        assert float(value) == pytest.approx(want, rel=1e-5, abs=1e-6)
        assert float(metrics["policy_loss"]) == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_gspo_gradient_matches_finite_differences_and_its_token_variant():
    """x64: GSPO's gradient equals central finite differences of the literal objective (ratios kept away from the
    clip's kinks), and GSPO-token's gradient equals GSPO's when every token of a sequence has its advantage."""
    with jax.enable_x64(True):
        lp, old, adv, mask = gspo_batch(3, batch=5, time=6, spread=0.3)
        eps_low, eps_high = 0.05, 0.08
        seq = np.array([np.exp((lp[i] - old[i])[mask[i]].mean()) if mask[i].any() else 1.0 for i in range(5)])
        assert np.all(np.abs(seq - 0.95) > 1e-3) and np.all(np.abs(seq - 1.08) > 1e-3)
        assert np.any(seq > 1.08) and np.any((seq > 0.95) & (seq < 1.08))  # clipped and not
        grads = {}
        for loss in ("gspo", "gspo_token"):
            f = lambda x, loss=loss: grpo_loss(x, old, None, adv, mask, eps_low=eps_low, eps_high=eps_high,
                                               loss=loss)[0]
            grads[loss] = np.asarray(jax.grad(f)(jnp.asarray(lp)))
        h = 1e-6
        fd = np.zeros_like(lp)
        for idx in np.ndindex(lp.shape):
            e = np.zeros_like(lp)
            e[idx] = h
            fd[idx] = (gspo_reference(lp + e, old, adv, mask, eps_low, eps_high)
                       - gspo_reference(lp - e, old, adv, mask, eps_low, eps_high)) / (2 * h)
        np.testing.assert_allclose(grads["gspo"], fd, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(grads["gspo_token"], grads["gspo"], rtol=1e-12, atol=1e-14)
        assert np.all(grads["gspo"][~mask] == 0.0) and np.any(grads["gspo"][mask] != 0.0)


def test_the_clip_range_is_the_losses_own_unless_set(tmp_path, toy_cache):
    """rl.eps_low / rl.eps_high unset: GRPO's 0.2 and GSPO's 3e-4 / 4e-4; set: as set; unknown names are one line."""
    grpo = lambda **kw: validate(tiny_config("drm", tmp_path, toy_cache, **kw)).grpo
    assert grpo().clip_range == (0.2, 0.2)
    assert grpo(**{"rl.loss": "gspo"}).clip_range == (3e-4, 4e-4)
    assert grpo(**{"rl.loss": "gspo_token", "rl.eps_high": 1e-3}).clip_range == (3e-4, 1e-3)
    assert grpo(**{"rl.eps_low": 0.1}).clip_range == (0.1, 0.2)
    with pytest.raises(ConfigError, match=r"config.rl.loss: 'ppo': use 'grpo', 'gspo', 'gspo_token'"):
        grpo(**{"rl.loss": "ppo"})
    with pytest.raises(ConfigError, match=r"config.rl.advantage: 'gae'"):
        grpo(**{"rl.advantage": "gae"})


# ------------------------------------------------------------------------------------------------ DAPO's shaping


def test_overlong_penalty_is_dapos_soft_punishment():
    """R_length(y) = 0 up to L_max - L_cache, ((L_max - L_cache) - |y|) / L_cache up to L_max, -1 beyond."""
    rng = np.random.default_rng(1)
    for _ in range(300):
        l_max = int(rng.integers(1, 40))
        cache, penalty = int(rng.integers(0, l_max + 1)), float(rng.uniform(0.1, 2.0))
        lengths = rng.integers(0, l_max + 3, size=(3, 4))
        got = overlong_penalty(lengths, l_max, cache, penalty)
        for y, value in zip(lengths.ravel(), got.ravel()):
            if cache == 0 or y <= l_max - cache:
                want = 0.0
            elif y <= l_max:
                want = ((l_max - cache) - y) / cache
            else:
                want = -1.0
            assert value == pytest.approx(penalty * want, abs=1e-6)


# ---------------------------------------------------------------------------------------------- dynamic sampling


def fake_draw(rng, b=4, m=3):
    """A `Draw` of b groups with integer rewards (often all equal), one judgment per group."""
    rewards = rng.integers(0, 2, size=(b, m)).astype(np.float32)
    index = rng.integers(0, 1000, size=b)
    groups = Groups([[f"{i}-{j}" for j in range(m)] for i in index], [[int(i)] for i in index],
                    [np.array([int(i), j]) for i in index for j in range(m)], np.zeros(b * m, bool))
    result = RewardResult(rewards, {"judge/questions": 10.0, "judge/abstain_rate": float(rng.uniform())},
                          [{"prompt": g, "i": 0, "j": 1, "text": f"about {index[g]}"} for g in range(b)],
                          [{"anchor": int(i)} for i in index])
    return Draw(index, [f"p{i}" for i in index], groups, result, rewards)


def test_dynamic_sampling_keeps_the_first_informative_groups_in_draw_order():
    """300 random sequences of draws: the batch is the first B groups whose rewards differ, in draw order (topped up
    with constant groups, first drawn first, when `max_draws` runs out), drawn no more often than needed; every
    piece of a group (prompt, responses, rewards, notes, judgments) moves with it; questions add up over the draws."""
    rng = np.random.default_rng(2)
    for case in range(300):
        max_draws = int(rng.integers(1, 5))
        draws = [fake_draw(rng) for _ in range(max_draws)]
        made = []
        out, counts = fill(lambda i: made.append(i) or draws[i], max_draws)
        b = 4
        good, flat, used = [], [], 0
        for d in draws:  # the literal rule
            used += 1
            for g in range(b):
                (good if d.rewards[g].max() != d.rewards[g].min() else flat).append((d, g))
            if len(good) >= b:
                break
        picks = good[:b] + flat[:max(0, b - len(good))]
        assert made == list(range(used))
        assert counts == {"data/draws_per_step": used, "data/filtered_groups": len(flat) - max(0, b - len(good)),
                          "data/surplus_groups": max(0, len(good) - b), "data/unfilled_groups": max(0, b - len(good))}
        assert list(out.prompt_index) == [d.prompt_index[g] for d, g in picks]
        np.testing.assert_array_equal(out.rewards, np.stack([d.rewards[g] for d, g in picks]))
        assert out.groups.texts == [d.groups.texts[g] for d, g in picks]
        assert [r.tolist() for r in out.groups.responses] == [[int(d.prompt_index[g]), j] for d, g in picks
                                                              for j in range(3)]
        assert out.result.notes == [{"anchor": int(d.prompt_index[g])} for d, g in picks]
        assert sorted((j["prompt"], j["text"]) for j in out.result.judgments) == \
            sorted((k, f"about {d.prompt_index[g]}") for k, (d, g) in enumerate(picks))
        assert out.result.metrics["judge/questions"] == 10.0 * used
        assert out.result.metrics["judge/abstain_rate"] == pytest.approx(
            np.mean([d.result.metrics["judge/abstain_rate"] for d in draws[:used]]))

