"""Continuous batching (`rrc_jax.inference.lanes`): lanes that take the next waiting question when a judgment ends
give every question the continuation the chunked engine gives it (greedy and sampled, any number of lanes, prefixes
swapped in and out, a sliding-window family with rings), and run fewer row-steps when questions outnumber lanes."""

import numpy as np
import pytest
from flax import nnx

from rrc_jax.inference import SamplingParams, make_sampler
from rrc_jax.inference.lanes import lane_plan
from rrc_jax.models import Decoder, DecoderConfig
from rrc_jax.sharding import model_context

FAMILIES = {
    "llama": dict(model_type="llama"),
    # sliding layers of window 4 kept in rings, soft-capped logits
    "gemma2": dict(model_type="gemma2", sliding_window=4, layer_types=("sliding_attention", "full_attention"),
                   attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
}


def tiny(family: str, kv_dtype: str = "") -> Decoder:
    cfg = DecoderConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=8, max_position_embeddings=512, bos_token_id=1, eos_token_ids=(2,),
                        pad_token_id=0, kv_dtype=kv_dtype, **FAMILIES[family])
    with model_context(None):
        return Decoder(cfg, rngs=nnx.Rngs(3))


def questions(seed=0, prompts=4, asked=(4, 5, 2, 3)):
    """`prompts` prefixes of different lengths and questions on them (suffixes of 0-9 tokens), interleaved."""
    rng = np.random.default_rng(seed)
    prefixes = [[1] + list(rng.integers(3, 64, n)) for n in (5, 12, 8, 3, 7)[:prompts]]
    owners = [o for o, k in enumerate(asked) for _ in range(k)]
    owners = list(rng.permutation(owners))
    return prefixes, [(int(o), list(rng.integers(3, 64, int(rng.integers(0, 10))))) for o in owners]


# stop tokens common enough that judgments end at different lengths
VARIED = dict(max_new_tokens=12, stop_token_ids=(5, 7, 9, 11))


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_lanes_continue_every_question_as_chunks_do(family, temperature):
    """14 questions on 4 prompts: in 64 lanes (all at once), 6 (refilled as judgments end) and 2 (each prompt
    swapped into a lane group when the one before it is done), the same tokens, lengths and ends as the chunked
    engine, and log-probs to float rounding."""
    model = tiny(family)
    prefixes, suffixes = questions()
    params = SamplingParams(temperature, **VARIED)
    chunked = make_sampler("grm", model, max_batch=64)
    ref = chunked.complete(prefixes, suffixes, params, rng=11)
    assert len(set(ref.lengths.tolist())) > 2  # judgments of varied lengths
    for max_batch in (64, 6, 2):
        lanes = make_sampler("grm", model, max_batch=max_batch, continuous=True)
        out = lanes.complete(prefixes, suffixes, params, rng=11)
        np.testing.assert_array_equal(out.tokens, ref.tokens)
        np.testing.assert_array_equal(out.lengths, ref.lengths)
        np.testing.assert_array_equal(out.truncated, ref.truncated)
        np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5)
        assert lanes.stats.generated_tokens == chunked.stats.generated_tokens
        # every prompt once, every question's own tokens once
        assert lanes.stats.prefill_tokens == sum(map(len, prefixes)) + sum(len(s) for _, s in suffixes)
        assert lanes.stats.prefill_tokens + lanes.stats.prefill_tokens_saved == sum(
            len(prefixes[o]) + len(s) for o, s in suffixes)


def test_lanes_decode_fewer_row_steps_when_questions_outnumber_them():
    """40 questions on 2 prompts in 8 lanes: the chunks (8 rows each) decode until their longest judgment ends, the
    lanes take new questions as theirs end; both decode every judgment token, the lanes in fewer row-steps."""
    model = tiny("llama")
    prefixes, suffixes = questions(seed=1, prompts=2, asked=(20, 20))
    params = SamplingParams(1.0, **VARIED)
    chunked = make_sampler("grm", model, max_batch=8, prefix_reuse=False)
    lanes = make_sampler("grm", model, max_batch=8, continuous=True)
    ref, out = chunked.complete(prefixes, suffixes, params, rng=2), lanes.complete(prefixes, suffixes, params, rng=2)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    tokens = int(ref.lengths.sum())
    assert lanes.stats.generated_tokens == chunked.stats.generated_tokens == tokens
    assert tokens <= lanes.stats.decode_row_steps < chunked.stats.decode_row_steps
    # each chunk waits for its longest judgment: 5 chunks x 8 rows x their longest
    assert chunked.stats.decode_row_steps == 8 * sum(ref.lengths[i:i + 8].max() for i in range(0, 40, 8))


def test_a_lane_plan_stays_within_its_rows_and_slots():
    """Lanes: a group per prompt while they fit, the rows shared out (no more lanes than a prompt asks), within
    `max_batch_tokens`; refilled once an eighth of the lanes wait, in batches of a multiple of 8 rows."""
    plan = lane_plan([30, 40], [100, 100], 20, 64, 256)
    assert (plan.slots, plan.lanes, plan.rows, plan.refill_at, plan.refill) == (2, 100, 200, 25, 32)
    assert plan.own == 128 and plan.prefix == 48 and plan.question == 32  # (length buckets; 64-slot blocks)
    small = lane_plan([30, 40], [100, 100], 20, 64, 256, max_slots=20 * 128)
    assert (small.rows + small.slots) * small.own + small.slots * small.prefix <= 20 * 128 and small.rows >= 14
    assert lane_plan([5] * 300, [1] * 300, 4, 8, 256).rows == 256  # more prompts than rows: a lane each
    assert lane_plan([5], [3], 4, 8, 256)[-2:] == (1, 3)


def test_continuous_batching_is_one_process_and_jax_engine_only():
    """A served judge ignores the option (the server batches); on several processes the JAX engine refuses it
    (checked where the sampler is made)."""
    from rrc_jax.inference.openai_engine import JAX_ENGINE_OPTIONS

    assert "continuous" in JAX_ENGINE_OPTIONS


@pytest.mark.parametrize("max_batch", [64, 5])
def test_a_questions_votes_prefill_it_once(max_batch):
    """Sampled votes (a question asked 3 times, each its own stream) draw what the chunked engine draws; the lanes
    prefill each question once for its votes (kept for the votes that start later), and each prompt once."""
    model = tiny("llama")
    prefixes, distinct = questions(seed=2, prompts=2, asked=(3, 4))
    suffixes = [x for x in distinct for _ in range(3)]
    params = SamplingParams(1.0, **VARIED)
    ref = make_sampler("grm", model, max_batch=64).complete(prefixes, suffixes, params, rng=5)
    lanes = make_sampler("grm", model, max_batch=max_batch, continuous=True)
    out = lanes.complete(prefixes, suffixes, params, rng=5)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    assert not all(np.array_equal(out.tokens[i], out.tokens[i + 1]) for i in range(0, len(suffixes), 3))
    assert lanes.stats.prefill_tokens == sum(map(len, prefixes)) + sum(len(s) for _, s in distinct)


def test_a_float8_cache_decodes_in_lanes_as_in_chunks():
    """Keys and values stored in float8 (`DecoderConfig.kv_dtype`, a judge's `reward.judge.kv_dtype`): the cache
    holds a byte a value, and the lanes give every question what the chunked engine gives it over the same cache."""
    import jax.numpy as jnp

    from rrc_jax.models.kv_cache import init_cache

    model = tiny("gemma2", kv_dtype="float8_e4m3fn")
    cache = init_cache(model.cfg, 2, 128)
    assert all(x.dtype == jnp.float8_e4m3fn for x in (*cache.k, *cache.v, cache.ring_k, cache.ring_v))
    prefixes, suffixes = questions()
    params = SamplingParams(1.0, **VARIED)
    ref = make_sampler("grm", model, max_batch=64).complete(prefixes, suffixes, params, rng=4)
    out = make_sampler("grm", model, max_batch=6, continuous=True).complete(prefixes, suffixes, params, rng=4)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.lengths, ref.lengths)
