"""The learner on a random tiny decoder with a lambda reward, without the toy world: a GRPO step improves the
rewarded tokens, non-finite updates are skipped, micro-batches give exactly the minibatch's update for every loss
aggregation, buffers are donated, log-probabilities follow the sampling temperature, Dr.GRPO's constant."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rrc_jax.models.batches import completion_batch
from rrc_jax.inference import SamplingParams, make_sampler
from rrc_jax.models import Decoder, DecoderConfig
from rrc_jax.rl.grpo import AGGREGATIONS, group_advantages, grpo_objective
from rrc_jax.rl.learner import Learner, make_optimizer, token_logprobs
from rrc_jax.sharding import model_context

VOCAB = 32


def tiny_model(seed=0) -> Decoder:
    cfg = DecoderConfig(model_type="llama", vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_layers=1,
                        num_heads=2, num_kv_heads=1, head_dim=8, max_position_embeddings=128, bos_token_id=1,
                        eos_token_ids=(2,), pad_token_id=0)
    with model_context(None):
        return Decoder(cfg, rngs=nnx.Rngs(seed))


def rollout_batch(model, *, prompts=4, group=4, temperature=1.0, seed=0, length=None):
    """Rollouts of `model` rewarded by a lambda (the number of token 7 in the response) with GRPO advantages and
    old log-probabilities at the sampling temperature."""
    ids = [[1, 3 + i] for i in range(prompts)]
    out = make_sampler("policy", model).generate(ids, group, SamplingParams(temperature, max_new_tokens=6), rng=seed)
    responses = [out.tokens[r, :out.lengths[r]] for r in range(prompts * group)]
    reward = lambda resp: float(np.sum(resp == 7))
    r = np.array([reward(x) for x in responses]).reshape(prompts, group)
    batch = completion_batch([ids[i // group] for i in range(len(responses))], responses, 0, length)
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    batch["old_logp"] = token_logprobs(model, batch["ids"], batch["mask"], temperature)
    batch["advantages"] = jnp.asarray(group_advantages(r)).reshape(-1)
    return batch, r


def params_of(model):
    return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.Param)))


def test_a_grpo_step_raises_the_rewarded_log_probability():
    model = tiny_model()
    learner = Learner(model, make_optimizer(2e-2), grpo_objective())
    for step in range(4):
        batch, r = rollout_batch(model, prompts=8, group=8, seed=step, length=16)  # one shape, one compile
        metrics = jax.device_get(learner.update(batch))
        assert metrics["skipped"] == 0 and np.isfinite(metrics["loss"])
    logp7 = lambda m: float(jax.nn.log_softmax(m(jnp.asarray([[1, 3]]))[0, -1])[7])
    assert logp7(model) > logp7(tiny_model()) + 0.5


def test_non_finite_update_is_skipped():
    model = tiny_model()
    learner = Learner(model, make_optimizer(1e-2), grpo_objective())
    batch, _ = rollout_batch(model)
    before, count = params_of(model), int(jax.tree.leaves(learner.opt_state)[0])
    batch["advantages"] = batch["advantages"].at[0].set(jnp.nan)
    metrics = jax.device_get(learner.update(batch))
    assert metrics["skipped"] == 1 and np.isnan(metrics["loss"])
    jax.tree.map(np.testing.assert_array_equal, params_of(model), before)
    assert int(jax.tree.leaves(learner.opt_state)[0]) == count  # the optimizer did not step either
    batch["advantages"] = jnp.nan_to_num(batch["advantages"])
    assert jax.device_get(learner.update(batch))["skipped"] == 0


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_micro_batches_give_the_minibatch_update(aggregation):
    """Gradient accumulation over 4 micro-batches of 4 equals one step on the 16 rows, whatever the token counts of
    the micro-batches (rows of different lengths)."""
    batch, _ = rollout_batch(tiny_model(), seed=3)
    batch["ref_logp"] = batch["old_logp"] - 0.1
    objective = grpo_objective(aggregation=aggregation, beta=0.05, max_len=6)
    whole, micro = tiny_model(), tiny_model()
    sgd = optax.sgd(1.0)  # parameters move by the gradient itself (Adam's first step would hide its scale)
    m1 = jax.device_get(Learner(whole, sgd, objective).update(batch))
    m2 = jax.device_get(Learner(micro, sgd, objective, micro_batch_size=4).update(batch))
    np.testing.assert_allclose(m1["loss"], m2["loss"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(m1["grad_norm"], m2["grad_norm"], rtol=1e-4)
    for k in m1:  # token means weighed by tokens, the token count summed, the ratio's extremes
        np.testing.assert_allclose(m1[k], m2[k], rtol=1e-5, atol=1e-6, err_msg=k)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), params_of(whole), params_of(micro))
    with pytest.raises(ValueError, match="micro_batch_size=3"):
        Learner(micro, make_optimizer(1e-2), objective, micro_batch_size=3).update(batch)


def test_remat_chunks_and_micro_batched_logprob_passes_change_nothing():
    """`remat` (blocks recomputed in the backward pass) and a smaller LM-head chunk give the same update; the
    old-policy log-prob pass in micro-batches gives the same log-probs."""
    batch, _ = rollout_batch(tiny_model(), seed=5)
    np.testing.assert_allclose(np.asarray(token_logprobs(tiny_model(), batch["ids"], batch["mask"],
                                                         micro_batch_size=4, chunk_size=3)),
                               np.asarray(batch["old_logp"]), atol=1e-6)
    sgd = optax.sgd(1.0)
    plain, remat = tiny_model(), tiny_model()
    m1 = jax.device_get(Learner(plain, sgd, grpo_objective(max_len=6)).update(batch))
    m2 = jax.device_get(Learner(remat, sgd, grpo_objective(max_len=6, remat=True, chunk_size=5)).update(batch))
    np.testing.assert_allclose(m1["grad_norm"], m2["grad_norm"], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), params_of(plain), params_of(remat))
    with pytest.raises(ValueError, match="micro_batch_size=3"):
        token_logprobs(plain, batch["ids"], batch["mask"], micro_batch_size=3)


def test_parameter_and_optimizer_buffers_are_donated():
    model = tiny_model()
    learner = Learner(model, make_optimizer(1e-2), grpo_objective())
    batch, _ = rollout_batch(model)
    old_params, old_opt = jax.tree.leaves(learner.params), jax.tree.leaves(learner.opt_state)
    learner.update(batch)
    assert all(x.is_deleted() for x in old_params) and all(x.is_deleted() for x in old_opt)
    assert not any(x.is_deleted() for x in jax.tree.leaves(learner.params))  # the model holds the new ones


def test_logprobs_follow_the_sampling_temperature():
    """`token_logprobs(..., temperature=T)` is the log-probability under softmax(logits / T), the distribution a
    sampler at T draws from (the importance ratio's old, new and reference log-probabilities all use it)."""
    model = tiny_model()
    batch, _ = rollout_batch(model, temperature=0.5)
    logits = model(batch["ids"], batch["mask"])
    want = jnp.take_along_axis(jax.nn.log_softmax(logits / 0.5, axis=-1)[:, :-1], batch["ids"][:, 1:, None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(batch["old_logp"])[:, 1:], np.asarray(want), atol=1e-5)
    loss, metrics = grpo_objective(temperature=0.5)(model, batch)
    assert float(metrics["ratio_min"]) == pytest.approx(1.0, abs=1e-5) == float(metrics["ratio_max"])
    _, at_one = grpo_objective(temperature=1.0)(model, batch)
    assert abs(float(at_one["ratio_max"]) - 1.0) > 1e-2


def test_dr_grpo_divides_by_the_generation_budget_not_the_padded_length():
    model = tiny_model()
    short, _ = rollout_batch(model, seed=5)
    long, _ = rollout_batch(model, seed=5, length=64)  # the same rows padded to 64 columns
    objective = grpo_objective(aggregation="seq_mean_token_sum_norm", max_len=6)
    a, _ = objective(model, short)
    b, _ = objective(model, long)
    np.testing.assert_allclose(float(a), float(b), rtol=1e-5)
    adv, mask = np.asarray(short["advantages"]), np.asarray(short["loss_mask"])
    # at ratio 1 the clipped term is -A per token: each row's sum is -A * tokens, over 6, then the mean over rows
    np.testing.assert_allclose(float(a), np.mean(-adv * mask.sum(1) / 6), rtol=1e-5, atol=1e-7)


def test_updates_compile_once_and_an_on_policy_batch_needs_no_old_logprobs():
    """The first update (fresh parameters) and the later ones (the update's outputs) are one
    compiled program; a batch without `old_logp` (each rollout's single update) takes the same step as one with
    the policy's own log-probabilities, without their pass."""
    batch, _ = rollout_batch(tiny_model(), seed=3)
    with_old, on_policy = tiny_model(), tiny_model()
    learner = Learner(with_old, optax.sgd(1.0), grpo_objective())
    m1 = jax.device_get(learner.update(batch))
    for _ in range(2):
        learner.update(batch)
    assert learner._update._cache_size() == 1
    m2 = jax.device_get(Learner(on_policy, optax.sgd(1.0), grpo_objective()).update(
        {k: v for k, v in batch.items() if k != "old_logp"}))
    np.testing.assert_allclose(m1["loss"], m2["loss"], rtol=1e-5, atol=1e-7)
    assert m2["ratio_min"] == m2["ratio_max"] == 1.0
    first = tiny_model()
    Learner(first, optax.sgd(1.0), grpo_objective()).update(batch)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), params_of(first), params_of(on_policy))
