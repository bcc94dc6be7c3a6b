"""KV-cache sampler: greedy parity with transformers' generate, batching, prefix reuse, filters, log-probs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from conftest import make_hf_model, padded_batch
from rrc_jax.models.batches import pad_sequences
from rrc_jax.inference import kernels
from rrc_jax.inference.kernels import SamplingParams, decode, extend, generate, prefill, sample_token
from rrc_jax.models import load_hf

LENGTHS = [5, 17, 9, 12]


def params(max_new_tokens, temperature=1.0, top_k=0, top_p=1.0, stop_token_ids=None):
    stop = None if stop_token_ids is None else tuple(stop_token_ids)
    return SamplingParams(temperature, top_k, top_p, max_new_tokens=max_new_tokens, stop_token_ids=stop)


def gen(model, prompts, *, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0, stop_token_ids=None, **kw):
    """`generate` with the sampling settings as keywords."""
    return generate(model, prompts, params(max_new_tokens, temperature, top_k, top_p, stop_token_ids), **kw)


def loaded(kind, tmp_path_factory):
    """(our model, the transformers model) of a tiny `kind` checkpoint (seed 1)."""
    ref = make_hf_model(kind, seed=1)
    path = tmp_path_factory.mktemp(kind)
    ref.save_pretrained(path)
    return load_hf(path), ref


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return loaded("llama3_untied", tmp_path_factory)


def prompts_of(ids, mask):
    return [[int(t) for t in row[m.astype(bool)]] for row, m in zip(ids, mask)]


def hf_greedy(ref, ids, mask, n, eos):
    with torch.no_grad():
        out = ref.generate(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
                           max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=0)
    return out[:, ids.shape[1]:].numpy()


def test_greedy_matches_transformers_generate(hf_checkpoint):
    _, path, ref = hf_checkpoint
    model = load_hf(path)
    ids, mask = padded_batch(LENGTHS, "left", seed=5)
    out = gen(model, prompts_of(ids, mask), max_new_tokens=32, temperature=0.0)
    expected = hf_greedy(ref, ids, mask, 32, eos=2)
    assert out.tokens.shape == (4, 32)
    for b in range(4):
        n = out.lengths[b]
        np.testing.assert_array_equal(out.tokens[b, :n], expected[b, :n])
        assert out.truncated[b] == (2 not in expected[b])


def test_greedy_stops_like_transformers(llama):
    """A stop id that some rows emit: those rows end there (stop token included), the others run to N."""
    model, ref = llama
    ids, mask = padded_batch(LENGTHS, "left", seed=5)
    free = gen(model, prompts_of(ids, mask), max_new_tokens=32, temperature=0.0)
    stop = int(free.tokens[0, 6])  # a token row 0 emits at step 6 (or earlier)
    out = gen(model, prompts_of(ids, mask), max_new_tokens=32, temperature=0.0, stop_token_ids=[stop])
    expected = hf_greedy(ref, ids, mask, 32, eos=stop)
    assert out.lengths[0] <= 7 and not out.truncated[0]
    for b in range(4):
        n = out.lengths[b]
        np.testing.assert_array_equal(out.tokens[b, :n], expected[b, :n])
        assert (out.tokens[b, n:] == 0).all() and (out.logprobs[b, n:] == 0).all()
        assert out.truncated[b] == (stop not in out.tokens[b, :n])
        if not out.truncated[b]:
            assert out.tokens[b, n - 1] == stop


def test_batch_equals_one_prompt_at_a_time(llama):
    model, _ = llama
    ids, mask = padded_batch(LENGTHS, "left", seed=7)
    prompts = prompts_of(ids, mask)
    batch = gen(model, prompts, max_new_tokens=20, temperature=0.0, stop_token_ids=[])
    for b, p in enumerate(prompts):
        one = gen(model, [p], max_new_tokens=20, temperature=0.0, stop_token_ids=[])
        np.testing.assert_array_equal(one.tokens[0], batch.tokens[b])
        np.testing.assert_allclose(one.logprobs[0], batch.logprobs[b], atol=1e-5)


def test_prefill_extend_decode_equals_whole_prompt(llama):
    """Two prefixes prefilled once, each reused by two suffixes of different lengths (cache.take), equal
    prefilling the concatenated texts."""
    model, _ = llama
    rng = np.random.default_rng(0)
    prefixes = [list(rng.integers(3, 96, n)) for n in (6, 11)]
    suffixes = [list(rng.integers(3, 96, n)) for n in (3, 8, 1, 5)]
    owner = np.array([0, 0, 1, 1])
    n_new = 12
    ids, mask = pad_sequences(prefixes, 16, 0, "left")
    prefix_cache = prefill(model, ids, mask, cache_size=16 + 8 + n_new)
    s_ids, s_mask = pad_sequences(suffixes, 8, 0, "right")
    cache = extend(model, prefix_cache.take(jnp.asarray(owner)), s_ids, s_mask)
    assert int(prefix_cache.end) == 16 and int(cache.end) == 24  # the prefix cache itself is untouched
    logits = np.asarray(cache.logits)  # read before decode consumes the cache (donated)
    out = decode(model, cache, params(n_new, 0.0, stop_token_ids=[]))
    whole = [prefixes[o] + s for o, s in zip(owner, suffixes)]
    ref = gen(model, whole, max_new_tokens=n_new, temperature=0.0, stop_token_ids=[])
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5)
    # next-token logits after the suffix equal a plain forward pass over the whole text
    w_ids, w_mask = pad_sequences(whole, 24, 0, "right")
    full = np.asarray(model(jnp.asarray(w_ids), jnp.asarray(w_mask)))
    last = np.array([len(w) - 1 for w in whole])
    np.testing.assert_allclose(logits, full[np.arange(4), last], atol=1e-4)


def test_chunked_prefill_equals_one_pass(llama, monkeypatch):
    """Prompts and suffixes longer than `PREFILL_CHUNK` run through the model a chunk at a time (left-padded
    prompts, right-padded suffixes, rows whose chunk is all padding): the same next-token logits as one pass, and
    the same greedy continuations."""
    model, _ = llama
    ids, mask = padded_batch(LENGTHS, "left", seed=5)
    s_ids, s_mask = pad_sequences([[7, 8, 9, 10, 11, 12, 13], [5], [], [20, 21, 22]], 8, 0, "right")
    whole = extend(model, prefill(model, ids, mask, cache_size=64), s_ids, s_mask)
    logits = np.asarray(whole.logits)
    one = decode(model, whole, params(12, 0.0, stop_token_ids=[]))
    monkeypatch.setattr(kernels, "PREFILL_CHUNK", 3)
    chunked = extend(model, prefill(model, ids, mask, cache_size=64), s_ids, s_mask)
    np.testing.assert_allclose(np.asarray(chunked.logits), logits, atol=1e-5)
    np.testing.assert_array_equal(decode(model, chunked, params(12, 0.0, stop_token_ids=[])).tokens, one.tokens)


def test_logprobs_equal_log_softmax_of_model_logits(llama):
    model, _ = llama
    ids, mask = padded_batch(LENGTHS, "left", seed=11)
    prompts = prompts_of(ids, mask)
    out = gen(model, prompts, max_new_tokens=16, temperature=0.8, top_p=0.9, rng=3, stop_token_ids=[])
    whole = [p + list(out.tokens[b]) for b, p in enumerate(prompts)]
    w_ids, w_mask = pad_sequences(whole, max(map(len, whole)), 0, "right")
    logp = np.asarray(jax.nn.log_softmax(model(jnp.asarray(w_ids), jnp.asarray(w_mask)), axis=-1))
    for b, p in enumerate(prompts):
        pos = np.arange(len(p) - 1, len(p) - 1 + 16)
        np.testing.assert_allclose(out.logprobs[b], logp[b, pos, out.tokens[b]], atol=1e-5)


def test_sampling_is_deterministic_for_a_key(llama):
    model, _ = llama
    ids, mask = padded_batch(LENGTHS, "left", seed=2)
    a = gen(model, prompts_of(ids, mask), max_new_tokens=16, temperature=1.0, rng=jax.random.key(42))
    b = gen(model, prompts_of(ids, mask), max_new_tokens=16, temperature=1.0, rng=jax.random.key(42))
    c = gen(model, prompts_of(ids, mask), max_new_tokens=16, temperature=1.0, rng=jax.random.key(43))
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert (a.tokens != c.tokens).any()


def _allowed(logits, top_k, top_p):
    order = np.argsort(-logits)
    if top_k:
        order = order[:top_k]
    p = np.exp(logits[order] - logits[order].max())
    p /= p.sum()
    keep = np.cumsum(p) - p < top_p
    kept = order[keep]
    probs = np.exp(logits[kept] - logits[kept].max())
    return kept, probs / probs.sum()


@pytest.mark.parametrize("top_k,top_p", [(5, 1.0), (0, 0.8), (10, 0.6), (1, 1.0)])
def test_top_k_top_p_stay_in_the_allowed_set(top_k, top_p):
    """20k fixed-seed draws: never a token outside the allowed set; frequencies match the renormalized
    probabilities (total variation < 0.03)."""
    logits = np.random.default_rng(0).normal(size=64).astype(np.float32) * 2
    draws = 20_000
    keys = jax.random.split(jax.random.key(0), draws)  # one per row
    tokens = np.asarray(sample_token(jnp.tile(jnp.asarray(logits), (draws, 1)), keys,
                                     SamplingParams(1.0, top_k, top_p)))
    kept, probs = _allowed(logits, top_k, top_p)
    assert set(np.unique(tokens)) <= set(kept.tolist())
    freq = np.array([(tokens == k).mean() for k in kept])
    assert 0.5 * np.abs(freq - probs).sum() < 0.03


def test_prompt_longer_than_cache_is_an_error(llama):
    model, _ = llama
    with pytest.raises(ValueError, match="prompt of 40 tokens plus max_new_tokens=10 exceeds the cache") as e:
        gen(model, [[5] * 40], max_new_tokens=10, cache_size=32)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings"):
        gen(model, [[5] * 250], max_new_tokens=10)
    ids, mask = pad_sequences([[5] * 10], 16, 0)
    cache = prefill(model, ids, mask, cache_size=20)
    with pytest.raises(ValueError, match="exceeds its 20 slots"):
        extend(model, cache, np.ones((1, 8), np.int32))
    with pytest.raises(ValueError, match="does not fit the cache of 20 slots"):
        decode(model, cache, params(5))


def test_compiles_once_per_batch_bucket_and_length(llama):
    model, _ = llama
    gen(model, [[5, 6, 7], [8] * 9], max_new_tokens=6, temperature=0.0)
    before = (kernels._prefill._cache_size(), kernels._decode._cache_size())
    gen(model, [[9] * 12, [4, 4]], max_new_tokens=6, temperature=0.0)  # same batch, bucket 16, N
    gen(model, [[3] * 15, [4] * 16], max_new_tokens=6, temperature=0.0, rng=5)
    assert (kernels._prefill._cache_size(), kernels._decode._cache_size()) == before


def test_blocked_attention_equals_dense():
    from rrc_jax.models.attention import cache_attention, dense_attention, empty_carry, normalize_carry

    rng = np.random.default_rng(0)
    b, kh, g, t, d, s = 3, 2, 3, 5, 8, 512
    q, k, v = (jnp.asarray(rng.normal(size=shape), jnp.float32)
               for shape in ((b, kh, g, t, d), (b, kh, d, s), (b, kh, s, d)))  # keys are [B, K, D, S]
    end = 200  # slots beyond end + t are never visible
    mask = rng.random((b, t, s)) < 0.7
    mask[:, :, end + t:] = False
    mask[0, 1] = False  # a query that sees nothing must not produce NaN
    mask = jnp.asarray(mask)
    blocks = lambda x, axis: tuple(jnp.split(x[None], s // 128, axis=axis + 1))  # 4 blocks of 128 slots, 1 layer
    dense = dense_attention(q, k, v, mask)
    blocked = normalize_carry(cache_attention(empty_carry(q), q, blocks(k, 3), blocks(v, 2), mask, jnp.asarray(end + t),
                                         layer=0))
    assert not np.isnan(np.asarray(blocked)).any()
    sees = np.asarray(mask.any(-1))[:, None, None, :, None]  # a query that sees nothing has no defined output
    np.testing.assert_allclose(np.where(sees, np.asarray(blocked), 0), np.where(sees, np.asarray(dense), 0),
                               atol=1e-5)


def test_long_cache_uses_blocks_and_matches(llama, monkeypatch):
    """A 576-slot cache (9 blocks, blocked attention) gives the same greedy tokens as a 96-slot one (one block);
    so does a prefill that spans several blocks and starts past the first (extend into a blocked cache)."""
    from rrc_jax.models import kv_cache

    model, _ = llama
    ids, mask = padded_batch(LENGTHS, "left", seed=9)
    small = gen(model, prompts_of(ids, mask), max_new_tokens=40, temperature=0.0, cache_size=96)
    monkeypatch.setattr(kv_cache, "BLOCKED_ATTENTION_MIN_BYTES", 0)  # a tiny model's cache is blocked too
    blocks = kv_cache.init_cache(model.cfg, 4, 576).k  # 9 blocks [L, B, K, D, 64]
    assert len(blocks) == 9 and {b.shape for b in blocks} == {(model.cfg.num_layers, 4, model.cfg.num_kv_heads,
                                                                model.cfg.head_dim, 64)}
    large = gen(model, prompts_of(ids, mask), max_new_tokens=40, temperature=0.0, cache_size=576)
    np.testing.assert_array_equal(small.tokens, large.tokens)
    np.testing.assert_allclose(small.logprobs, large.logprobs, atol=1e-5)
    # writing several tokens across block boundaries: 60 slots of padding first, then the prompts from slot 60 on
    cache = extend(model, prefill(model, np.zeros((len(ids), 60), np.int32), np.zeros((len(ids), 60), bool),
                                  cache_size=576), ids, mask)
    assert len(cache.k) == 9 and int(cache.end) == 60 + ids.shape[1]
    later = decode(model, cache, params(40, 0.0))
    np.testing.assert_array_equal(small.tokens, later.tokens)
    np.testing.assert_allclose(small.logprobs, later.logprobs, atol=1e-5)


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory):
    """Sliding windows of 4 on alternate layers, soft-capped attention logits (Gemma 2)."""
    return loaded("gemma2_tied", tmp_path_factory)


@pytest.mark.parametrize("blocked,family", [(False, "llama"), (True, "llama"), (True, "gemma2")])
def test_branch_equals_take(request, monkeypatch, blocked, family):
    """A branched cache (each prefix shared by its group of rows, not copied) gives the logits, greedy tokens and
    log-probs of `take`, and so does one branched twice (a prefix tree of two levels). With `blocked`, the rows'
    own slots are read by blocked attention after the prefix. Gemma 2 (blocked): a sliding window (4) shorter than
    the prefixes, so the suffixes see only the last prefix slots, and soft-capped scores in the prefix attention."""
    from rrc_jax.models import kv_cache

    model, _ = request.getfixturevalue(family)
    if blocked:
        monkeypatch.setattr(kv_cache, "BLOCKED_ATTENTION_MIN_BYTES", 0)
    rng = np.random.default_rng(1)
    prefixes = [list(rng.integers(3, 96, n)) for n in (6, 11, 2)]
    suffixes = [list(rng.integers(3, 96, n)) for n in (3, 8, 1, 5, 7, 0)]  # two rows per prefix, one empty
    n_new, own = 20, 192 if blocked else 40
    ids, mask = pad_sequences(prefixes, 16, 0, "left")
    s_ids, s_mask = pad_sequences(suffixes, 8, 0, "right")
    owner = jnp.asarray([0, 0, 1, 1, 2, 2], jnp.int32)
    copied = extend(model, prefill(model, ids, mask, cache_size=16 + own).take(owner), s_ids, s_mask)
    shared = extend(model, prefill(model, ids, mask, cache_size=16, ring=False).branch(2, own), s_ids, s_mask)
    assert shared.shared and shared.size == own and int(shared.end) == 8 and shared.shared_k[0].shape[2] == 3
    np.testing.assert_allclose(np.asarray(shared.logits), np.asarray(copied.logits), atol=1e-5)
    greedy = params(n_new, 0.0, stop_token_ids=[])
    a, b = decode(model, copied, greedy), decode(model, shared, greedy)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    # two levels (a judge question's first response, then its votes): each row's own slots become the prefix of
    # two new rows, which `take` copies instead
    tails = [list(rng.integers(3, 96, n)) for n in (2, 4, 0, 1, 3, 5, 2, 2, 1, 6, 3, 0)]
    t_ids, t_mask = pad_sequences(tails, 8, 0, "right")
    twice = jnp.repeat(jnp.arange(6), 2)
    copied = extend(model, extend(model, prefill(model, ids, mask, cache_size=24 + own).take(owner), s_ids,
                                  s_mask).take(twice), t_ids, t_mask)
    shared = extend(model, prefill(model, ids, mask, cache_size=16, ring=False).branch(2, 8, ring=False), s_ids,
                    s_mask)
    shared = extend(model, shared.branch(2, own), t_ids, t_mask)
    assert len(shared.shared_k) == 2 and shared.shared_k[1].shape[2] == 6 and shared.batch_size == 12
    np.testing.assert_allclose(np.asarray(shared.logits), np.asarray(copied.logits), atol=1e-5)
    a, b = decode(model, copied, greedy), decode(model, shared, greedy)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


@pytest.mark.parametrize("kind", ["gemma2_tied", "mistral_window"])
def test_sliding_layers_keep_only_their_window(tmp_path_factory, monkeypatch, kind):
    """A cache longer than the window (4) keeps the sliding layers' last 4 tokens of each row in ring buffers
    (`KVCache.ring`; Mistral: every layer, so no full-layer blocks at all) and computes what the full cache does:
    a prefill in chunks longer than the window, right-padded suffixes (gaps inside a row), then decoding, and a
    branched cache whose rows' own slots are rings; logits and log-probs within 1e-5, the same greedy tokens."""
    model, _ = loaded(kind, tmp_path_factory)
    cfg = model.cfg
    monkeypatch.setattr(kernels, "PREFILL_CHUNK", 8)  # 16-token prompts: two chunks of 8, each longer than 4
    rng = np.random.default_rng(3)
    prefixes = [list(rng.integers(3, 96, n)) for n in (6, 16, 2)]
    suffixes = [list(rng.integers(3, 96, n)) for n in (3, 8, 1, 5, 7, 0)]
    ids, mask = pad_sequences(prefixes, 16, 0, "left")
    s_ids, s_mask = pad_sequences(suffixes, 8, 0, "right")
    owner = jnp.asarray([0, 0, 1, 1, 2, 2], jnp.int32)
    greedy = params(12, 0.0, stop_token_ids=[])
    full = extend(model, prefill(model, ids, mask, cache_size=40, ring=False).take(owner), s_ids, s_mask)
    ring = extend(model, prefill(model, ids, mask, cache_size=40).take(owner), s_ids, s_mask)
    shared = extend(model, prefill(model, ids, mask, cache_size=16, ring=False).branch(2, 24), s_ids, s_mask)
    sliding = sum(cfg.sliding)
    assert not full.ring and ring.ring and shared.ring
    assert ring.ring_k.shape == (sliding, 6, cfg.num_kv_heads, cfg.head_dim, 4) and ring.ring_positions.shape == (6, 4)
    assert sum(b.shape[0] for b in ring.k[:1]) == cfg.num_layers - sliding  # the full layers' blocks only
    for cache in (ring, shared):
        np.testing.assert_allclose(np.asarray(cache.logits), np.asarray(full.logits), atol=1e-5)
    want = decode(model, full, greedy)
    for cache in (ring, shared):
        got = decode(model, cache, greedy)
        np.testing.assert_array_equal(got.tokens, want.tokens)
        np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)
    with pytest.raises(ValueError, match="ring=False"):
        prefill(model, ids, mask, cache_size=16).branch(2, 24)


def test_ring_buffers_are_updated_in_place():
    """The compiled extend and decode of a cache with rings hold no copy of a whole ring stack or of the full
    layers' stack (each layer reads and writes its own stack in place): a `lax.switch` on a layer's kind, or a ring
    write XLA cannot order after the reads, copies the whole cache at every layer."""
    import re

    from flax import nnx

    from rrc_jax.inference.kernels import _decode, _extend
    from rrc_jax.models import Decoder, DecoderConfig

    cfg = DecoderConfig(model_type="gemma2", vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=6,
                        num_heads=4, num_kv_heads=2, head_dim=8, sliding_window=4, max_position_embeddings=256,
                        layer_types=("sliding_attention", "full_attention") * 3, eos_token_ids=(2,), pad_token_id=0)
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    ids = np.ones((2, 8), np.int32)
    cache = prefill(model, ids, np.ones_like(ids, bool), cache_size=64)
    stacks = {str(list(x.shape)).replace(" ", "") for x in (*cache.k, *cache.v, cache.ring_k, cache.ring_v)}
    graphdef, state = nnx.split(model)
    programs = {"extend": _extend.lower(graphdef, state, cache, jnp.ones((2, 8), jnp.int32), jnp.ones((2, 8), bool)),
                "decode": _decode.lower(graphdef, state, cache, kernels.row_keys(0, range(2)),
                                        *kernels.to_the_end(np.ones(2, bool), 4, 0), params=params(4, 0.0),
                                        stop_ids=(2,), pad_id=0, impl="threefry2x32")}
    for name, lowered in programs.items():
        copied = set(re.findall(r"= \w+(\[[\d,]*\])[^=\n]*? copy\(", lowered.compile().as_text()))
        assert not copied & stacks, (name, copied & stacks)


def test_layer_segments_cover_the_layers_with_the_fewest_traced():
    from rrc_jax.models.block import layer_segments

    full, local = False, True
    assert layer_segments([full] * 4) == [(0, (full,), 4)]
    assert layer_segments(([local] * 5 + [full]) * 10 + [local] * 2) == [(0, (local,) * 5 + (full,), 10),
                                                                          (60, (local,), 2)]
    assert layer_segments([full] * 3 + [local] * 4) == [(0, (full,), 3), (3, (local,), 4)]  # Qwen2's windows
    assert layer_segments([local, full] * 3) == [(0, (local, full), 3)]
    assert layer_segments([]) == []
    rng = np.random.default_rng(0)
    for _ in range(20):  # any pattern: the segments cover it, in order
        kinds = [bool(x) for x in rng.integers(0, 2, rng.integers(1, 12))]
        rebuilt = [k for start, unit, reps in layer_segments(kinds) for k in unit * reps]
        assert rebuilt == kinds


def test_group_size_shares_each_prompt(llama):
    """`generate(prompts, group_size=G)` equals generating each prompt repeated G times: greedy tokens and log-probs;
    sampled groups are deterministic for a key and their rows differ."""
    model, _ = llama
    ids, mask = padded_batch(LENGTHS, "left", seed=4)
    prompts = prompts_of(ids, mask)
    repeated = [p for p in prompts for _ in range(3)]
    ref = gen(model, repeated, max_new_tokens=16, temperature=0.0, stop_token_ids=[])
    out = gen(model, prompts, max_new_tokens=16, temperature=0.0, stop_token_ids=[], group_size=3)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5)
    a = gen(model, prompts, max_new_tokens=16, temperature=1.0, rng=3, group_size=3)
    b = gen(model, prompts, max_new_tokens=16, temperature=1.0, rng=3, group_size=3)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert a.tokens.shape == (3 * len(prompts), 16)
    assert all(len({tuple(t) for t in a.tokens[3 * i:3 * i + 3]}) > 1 for i in range(len(prompts)))
    with pytest.raises(ValueError, match="group_size"):
        gen(model, prompts, max_new_tokens=4, group_size=0)


@pytest.mark.parametrize("prefix_block", [None, 8])
def test_shared_then_blocked_attention_equals_dense(monkeypatch, prefix_block):
    """Per-prompt prefixes (3 prompts x 2 rows; in one pass, or two blocks of 8 slots) then the rows' blocked cache
    equal dense attention over each row's own prefix followed by its own slots."""
    from rrc_jax.models import kv_cache
    from rrc_jax.models.attention import (cache_attention, dense_attention, empty_carry, normalize_carry,
                                          shared_attention)
    from rrc_jax.models.kv_cache import prefix_blocks

    if prefix_block:
        monkeypatch.setattr(kv_cache, "SHARED_ATTENTION_BLOCK", prefix_block)
    rng = np.random.default_rng(2)
    p, m, kh, g, t, d, n, s = 3, 2, 2, 2, 4, 8, 16, 128
    b = p * m
    q = jnp.asarray(rng.normal(size=(b, kh, g, t, d)), jnp.float32)
    ks, vs = (jnp.asarray(rng.normal(size=shape), jnp.float32) for shape in ((p, kh, d, n), (p, kh, n, d)))
    k, v = (jnp.asarray(rng.normal(size=shape), jnp.float32) for shape in ((b, kh, d, s), (b, kh, s, d)))
    shared_mask = jnp.asarray(rng.random((p, n)) < 0.6)
    mask = jnp.asarray(np.broadcast_to(np.arange(s) < 70, (b, t, s)))
    bk, bv, bmask = prefix_blocks(ks[None], vs[None], shared_mask)  # one layer: [1, J, P, ...]
    assert bk.shape[1] == (2 if prefix_block else 1)
    carry = shared_attention(empty_carry(q), q, bk[0], bv[0], bmask)
    out = normalize_carry(cache_attention(carry, q, jnp.split(k[None], 2, axis=4), jnp.split(v[None], 2, axis=3), mask,
                                     jnp.asarray(70), layer=0))
    rows = lambda x: jnp.repeat(x, m, axis=0)
    full_k = jnp.concatenate([rows(ks), k], axis=3)
    full_v = jnp.concatenate([rows(vs), v], axis=2)
    full_mask = jnp.concatenate([jnp.broadcast_to(rows(shared_mask)[:, None], (b, t, n)), mask], axis=2)
    np.testing.assert_allclose(np.asarray(out), np.asarray(dense_attention(q, full_k, full_v, full_mask)), atol=1e-5)


def test_greedy_token_is_argmax_including_ties():
    from rrc_jax.inference.kernels import greedy_token

    rng = np.random.default_rng(0)
    logits = rng.integers(-3, 3, (64, 50)).astype(np.float32)  # many ties: the first maximum must win
    logits[0] = -np.inf
    logits[1, 7] = np.inf
    np.testing.assert_array_equal(np.asarray(greedy_token(jnp.asarray(logits))), np.argmax(logits, axis=-1))
