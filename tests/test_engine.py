"""The JAX engine (`JaxSampler`) against plain forward passes and plain generation, on a tiny random decoder:
`complete` with and without prefix reuse and at any chunk size equals generating each whole question; the prefill
saving is exact; `next_token_logprobs` equals the model's log-softmax; `generate` chunks whole groups."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rrc_jax.models.batches import pad_sequences
from rrc_jax.inference import JaxSampler, SamplingParams, make_sampler, question_tree
from rrc_jax.inference.kernels import generate
from rrc_jax.models import Decoder, DecoderConfig
from rrc_jax.sharding import model_context

GREEDY = SamplingParams(0.0, max_new_tokens=10, stop_token_ids=())


@pytest.fixture(scope="module")
def model():
    cfg = DecoderConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                        num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=512, bos_token_id=1,
                        eos_token_ids=(2,), pad_token_id=0)
    with model_context(None):
        return Decoder(cfg, rngs=nnx.Rngs(3))


def questions(seed=0):
    """3 prefixes of different lengths and 11 questions on them (suffixes of 0-9 tokens, one prefix unused)."""
    rng = np.random.default_rng(seed)
    prefixes = [[1] + list(rng.integers(3, 64, n)) for n in (5, 12, 8, 3)]
    owners = [0, 0, 1, 1, 1, 1, 2, 0, 2, 1, 0]
    suffixes = [(o, list(rng.integers(3, 64, int(rng.integers(0, 10))))) for o in owners]
    return prefixes, suffixes


@pytest.mark.parametrize("prefix_reuse,max_batch,calls,refills,row_steps", [
    (True, 64, 1, (0, 1, 0), 16 * 10), (True, 4, 3, (1, 2, 0), 3 * 4 * 10), (False, 64, 1, None, 16 * 10),
    (False, 3, 4, None, 4 * 3 * 10)])
def test_complete_equals_generating_each_whole_question(model, prefix_reuse, max_batch, calls, refills, row_steps):
    """Each question's continuation equals generating its whole text; with reuse, the 4 + 5 + 2 questions on three
    prefixes run in one chunk shape of the least padded work (`question_tree.call_shape`): at max_batch 64 one
    chunk of 4 x 4 rows, prefix 1's five questions in two parts (its prefix prefilled twice: 16 rows of 16-token
    questions cost less than 32), at max_batch 4 three chunks of 2 x 2 (prefix 0 prefilled twice, prefix 1 three
    times); each prefix's other uses are saved; the decode's row-steps count the chunks' rows, padding included."""
    prefixes, suffixes = questions()
    sampler = make_sampler("policy", model, max_batch=max_batch, prefix_reuse=prefix_reuse)
    out = sampler.complete(prefixes, suffixes, GREEDY)
    whole = [prefixes[o] + s for o, s in suffixes]
    ref = generate(model, whole, GREEDY)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-4)
    assert sampler.stats.calls == calls
    uses = np.bincount([o for o, _ in suffixes], minlength=len(prefixes))
    saved = sum((k - 1 - r) * len(p) for k, p, r in zip(uses, prefixes, refills or [0] * 3) if k)
    assert sampler.stats.prefill_tokens_saved == (saved if prefix_reuse else 0)
    assert sampler.stats.prefill_tokens == sum(map(len, whole)) - sampler.stats.prefill_tokens_saved
    assert sampler.stats.generated_tokens == int(out.lengths.sum())
    # no stop token: every row of every chunk, padding included (11 questions in 16 rows, or in 4 + 4 + 4, or
    # 3 + 3 + 3 + 3), decodes all 10 steps
    assert sampler.stats.decode_row_steps == row_steps


def test_a_call_runs_in_one_chunk_shape_within_max_batch():
    """A call's questions run in chunks of one shape P prefixes x F nodes x S leaves x C copies (powers of two, at
    most max_batch rows; `question_tree.call_shape`), its parts cut to fit (`fit`, counted by `cut_counts`
    without cutting): a prefix with more questions than a chunk holds spans chunks, and every question has its
    own row. A prefix whose nodes differ in fan-out is cut into pieces of one fan-out each."""
    owners = [0] * 4 + [1] * 11 + [2] * 2 + [3]
    suffixes = [(o, [i]) for i, o in enumerate(owners)]  # all different: one leaf each
    parts = question_tree.pieces(question_tree.question_tree(suffixes), 8)
    fans = question_tree.fan_outs(8)
    assert len(fans) == 20 and all(math.prod(f) <= 8 for f in fans)
    counts = question_tree.cut_counts(parts, fans)
    assert list(counts) == [len(question_tree.fit(parts, *f)) for f in fans]
    shape, n = question_tree.call_shape(fans, counts, (16, 0, 16), 10, 8)
    chunks = question_tree.uniform_chunks(parts, shape)
    assert len(chunks) == n and math.prod(shape[:4]) <= 8 and shape[4:] == (16, 0, 16)
    assert all(len(c) <= shape[0] and all(p.shape <= shape[1:4] for p in c) for c in chunks)
    placed = [question_tree.rows(c, *shape[1:4]) for c in chunks]
    assert sorted(q for questions, _ in placed for q in questions) == list(range(len(owners)))
    assert all(len(set(at)) == len(at) for _, at in placed)
    # AGR's shape: 2 responses before 3 anchors and 3 anchors before 2 responses, 2 votes each (copies)
    tree = question_tree.question_tree([(0, [r, 9, a]) for r in (1, 2) for a in (5, 6, 7) for _ in range(2)]
                                       + [(0, [a, 9, r]) for r in (1, 2) for a in (5, 6, 7) for _ in range(2)],
                                       splits=[1] * 24)
    parts = question_tree.pieces(tree, 64)
    assert sorted(p.shape for p in parts) == [(2, 4, 2), (4, 2, 2)]  # (F, S, C): a piece per fan-out
    fans = question_tree.fan_outs(64)
    shape, n = question_tree.call_shape(fans, question_tree.cut_counts(parts, fans), (16, 16, 16), 10, 64)
    (chunk,) = question_tree.uniform_chunks(parts, shape)
    questions, rows = question_tree.rows(chunk, *shape[1:4])
    assert n == 1 and sorted(questions) == list(range(24)) and len(set(rows)) == 24


def test_cut_counts_agree_with_fit_and_chunks_stay_within_their_slots():
    """On random AGR-like calls, the parts counted by `cut_counts` and those `fit` cuts agree for every fan-out, the
    chosen shape is the same when chosen again, every question has a row, and with a slot budget every chunk but
    a one-question one stays within it."""
    rng = np.random.default_rng(0)
    for _ in range(5):
        suffixes = [(int(rng.integers(0, 4)), [int(rng.integers(0, 3)), 9, int(rng.integers(0, 6))])
                    for _ in range(int(rng.integers(1, 80)))]
        parts = question_tree.pieces(question_tree.question_tree(suffixes, [1] * len(suffixes)), 16)
        fans = question_tree.fan_outs(16)
        counts = question_tree.cut_counts(parts, fans)
        assert list(counts) == [len(question_tree.fit(parts, *f)) for f in fans]
        shape, n = question_tree.call_shape(fans, counts, (16, 16, 16), 8, 16, max_slots=200)
        assert question_tree.call_shape(fans, counts.copy(), (16, 16, 16), 8, 16, max_slots=200) == (shape, n)
        assert question_tree.chunk_slots(shape[:4], 16, 8) <= 200 or shape[:4] == (1, 1, 1, 1)
        chunks = question_tree.uniform_chunks(parts, shape)
        assert len(chunks) == n
        assert sorted(q for c in chunks for q in question_tree.rows(c, *shape[1:4])[0]) == list(range(len(suffixes)))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_question_draws_the_same_whatever_else_the_call_asks(model, temperature):
    """Questions sharing a prefix, a first segment (`splits`) and whole texts (copies: votes) give each question
    what generating its whole text alone gives (greedy), and at temperature 1 the same draws whether asked with
    all the others or alone, at any max_batch (its stream, not its row, picks its draws). The prefix tree
    prefills each level once."""
    rng = np.random.default_rng(5)
    prefixes = [[1] + list(rng.integers(3, 64, n)) for n in (6, 9)]
    firsts = [list(rng.integers(3, 64, n)) for n in (4, 7, 1)]
    rests = [list(rng.integers(3, 64, n)) for n in (3, 5)]
    suffixes, splits = [], []
    for o in range(2):
        for f in firsts:
            for r in rests:
                for _ in range(2):  # two votes of one question
                    suffixes.append((o, f + r))
                    splits.append(len(f))
    params = SamplingParams(temperature, max_new_tokens=10, stop_token_ids=())
    sampler = make_sampler("policy", model, max_batch=64)
    out = sampler.complete(prefixes, suffixes, params, rng=7, splits=splits)
    if temperature == 0:
        ref = generate(model, [prefixes[o] + s for o, s in suffixes], params)
        np.testing.assert_array_equal(out.tokens, ref.tokens)
        np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-4)
    else:
        assert not np.array_equal(out.tokens[0], out.tokens[1])  # two votes: two draws
        small = make_sampler("policy", model, max_batch=4)
        some = [3, 8, 17, 22]
        alone = small.complete(prefixes, [suffixes[q] for q in some], params, rng=7, streams=some,
                               splits=[splits[q] for q in some])
        np.testing.assert_array_equal(alone.tokens, out.tokens[some])
        np.testing.assert_allclose(alone.logprobs, out.logprobs[some], atol=1e-4)
    tree = sum(map(len, prefixes)) + 2 * (sum(map(len, firsts)) + len(firsts) * sum(map(len, rests)))
    assert sampler.stats.prefill_tokens == tree
    assert sampler.stats.prefill_tokens_saved == sum(len(prefixes[o]) + len(s) for o, s in suffixes) - tree


def test_a_token_budget_runs_long_questions_in_fewer_rows_a_call(model):
    """`max_batch_tokens`: a chunk's questions' own slots and decoding room stay within the budget (more calls
    of fewer rows), and every continuation is the same."""
    prefixes, suffixes = questions()
    plain = make_sampler("policy", model, max_batch=64)
    tight = make_sampler("policy", model, max_batch=64, max_batch_tokens=4 * (16 + 10))
    ref, out = plain.complete(prefixes, suffixes, GREEDY), tight.complete(prefixes, suffixes, GREEDY)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    assert plain.stats.calls == 1 and tight.stats.calls == 3  # 11 questions, at most 4 a call (16 own + 10 slots)
    with pytest.raises(ValueError, match="max_batch_tokens=0 must be >= 1"):
        make_sampler("policy", model, max_batch_tokens=0)


def test_a_servers_sampler_runs_new_calls_in_shapes_it_has_compiled(model):
    """`reuse_shapes`: once calls of two kinds ran (a node of 6 leaves x 3 copies; 2 prefixes x 8 questions),
    calls of other shapes (fewer prefixes, fewer leaves, 1 copy) run in shapes compiled before (their parts cut to
    fit, `question_tree.fit`), and every question draws what a plain sampler gives it (temperature 1, its stream)
    and generating it alone gives (greedy)."""
    rng = np.random.default_rng(2)
    prefixes = [[1] + list(rng.integers(3, 64, n)) for n in (6, 9, 4)]
    first = [(o, list(rng.integers(3, 64, 5))) for o in (0, 1) for _ in range(8)]  # 2 prefixes x 8 questions
    second = [(2, [7, 8, 9] + [int(x)]) for x in rng.integers(3, 64, 6)] * 3  # 6 leaves under a node, 3 copies
    params = SamplingParams(1.0, max_new_tokens=6, stop_token_ids=())
    server = JaxSampler(model, max_batch=16, reuse_shapes=True)
    plain = JaxSampler(model, max_batch=16)
    calls = [(second, [3] * 18), (first, None), (first[:3], None), (second[:7], [3] * 7), (first[2:] + second[:2],
                                                                                          [0] * 14 + [3] * 2)]
    for k, (suffixes, splits) in enumerate(calls):
        out = server.complete(prefixes, suffixes, params, rng=4, splits=splits)
        ref = plain.complete(prefixes, suffixes, params, rng=4, splits=splits)
        np.testing.assert_array_equal(out.tokens, ref.tokens)
        np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-4)
        if k == 1:
            compiled = set(server._shapes[6])
    assert server._shapes[6] == compiled and len(compiled) <= 3
    greedy = server.complete(prefixes, second, GREEDY, splits=[3] * len(second))
    np.testing.assert_array_equal(greedy.tokens, generate(model, [prefixes[o] + s for o, s in second], GREEDY).tokens)
    parts = question_tree.fit(question_tree.pieces(question_tree.question_tree(second, [3] * 18), 64), 1, 4, 1)
    assert all(p.shape <= (1, 4, 1) for p in parts)
    assert sorted(q for p in parts for n in p.nodes for leaf in n.leaves for q in leaf.questions) == list(range(18))


def test_a_servers_sampler_reuses_the_compiled_shape_that_prefills_least(model):
    """Of the shapes compiled before, `reuse_shapes` runs a call in the one that runs the fewest tokens
    (`question_tree.chunk_cost`), not the one of fewest rows: after a shared call (a prefix, 4 nodes x 4 leaves) and a
    flat one (8 prefixes, a question each), a call of one prefix with 2 nodes x 4 leaves prefills its prefix
    and nodes once, as a plain sampler does, rather than once a question in the flat shape's 8 rows."""
    rng = np.random.default_rng(5)
    prefixes = [[1] + list(rng.integers(3, 64, 12)) for _ in range(8)]
    flat = [(o, list(rng.integers(3, 64, 4))) for o in range(8)]
    nodes = [list(rng.integers(3, 64, 6)) for _ in range(4)]
    shared = [(0, node + list(rng.integers(3, 64, 3))) for node in nodes for _ in range(4)]
    params = SamplingParams(1.0, max_new_tokens=4, stop_token_ids=())
    server = JaxSampler(model, max_batch=16, reuse_shapes=True)
    plain = JaxSampler(model, max_batch=16)
    server.complete(prefixes, shared, params, splits=[6] * 16)
    server.complete(prefixes, flat, params)  # compiled with the level lengths of the shared call
    call = shared[:4] + shared[8:12]
    before = server.stats.prefill_tokens
    out = server.complete(prefixes, call, params, rng=7, splits=[6] * 8)
    ref = plain.complete(prefixes, call, params, rng=7, splits=[6] * 8)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    assert len(server._shapes[4]) == 2  # nothing compiled for the third call
    assert server.stats.prefill_tokens - before == plain.stats.prefill_tokens == 13 + 2 * 6 + 8 * 3


@pytest.mark.parametrize("prefix_reuse", [True, False])
def test_next_token_logprobs_equal_the_forward_pass(model, prefix_reuse):
    prefixes, suffixes = questions(1)
    token_ids = [5, 9, 2]
    lp = make_sampler("policy", model, max_batch=4, prefix_reuse=prefix_reuse).next_token_logprobs(prefixes, suffixes, token_ids)
    whole = [prefixes[o] + s for o, s in suffixes]
    ids, mask = pad_sequences(whole, max(map(len, whole)), 0, "right")
    logp = np.asarray(jax.nn.log_softmax(model(jnp.asarray(ids), jnp.asarray(mask)), axis=-1))
    last = np.array([len(w) - 1 for w in whole])
    np.testing.assert_allclose(lp, logp[np.arange(len(whole)), last][:, token_ids], atol=1e-4)


def test_generate_chunks_whole_groups(model):
    prompts = [[1, 7, 8], [1, 9], [1, 4, 4, 4, 5], [1, 30]]
    one = make_sampler("policy", model, max_batch=64).generate(prompts, 3, GREEDY)
    chunked_sampler = make_sampler("policy", model, max_batch=6)  # two groups of 3 per call
    chunked = chunked_sampler.generate(prompts, 3, GREEDY)
    assert one.tokens.shape == (12, 10) and chunked_sampler.stats.calls == 2
    np.testing.assert_array_equal(one.tokens, chunked.tokens)
    repeated = generate(model, [p for p in prompts for _ in range(3)], GREEDY)
    np.testing.assert_array_equal(one.tokens, repeated.tokens)


def test_stop_tokens_are_the_models_and_the_tokenizers(model):
    class Tok:
        eos_token_id = 7
        pad_token_id = 0

    assert make_sampler("policy", model, Tok()).stop_token_ids == (2, 7)
    assert make_sampler("policy", model).stop_token_ids == (2,)
    with pytest.raises(ValueError, match="prefix index 5"):
        make_sampler("policy", model).complete([[1, 2]], [(5, [3])], GREEDY)


def test_samplers_come_from_the_factory_and_take_new_weights(model):
    """The factory and the protocol's explicit weight sync: `make_sampler` builds the engine
    named in `inference.engine` for a role (an unknown engine or role is a one-line error listing the known ones); the sampler states
    its context length and pad id, and `update_weights` points it at other parameters."""
    from rrc_jax.config import base_config, validate
    from rrc_jax.errors import ConfigError

    sampler = make_sampler("policy", model, max_batch=8)
    assert isinstance(sampler, JaxSampler) and sampler.max_batch == 8
    assert sampler.role == "policy" and sampler.tokenizer is None and make_sampler("grm", model).role == "grm"
    with pytest.raises(ValueError, match="unknown role 'critic'; roles are policy, reference, grm, drm"):
        make_sampler("critic", model)
    assert sampler.context_length == model.cfg.max_position_embeddings and sampler.pad_id == 0
    with pytest.raises(ConfigError, match=r"config.inference.engine: .vllm. is not an inference engine; known: jax, openai"):
        make_sampler("policy", model, engine="vllm")
    config = base_config("agr")
    config.inference.engine = "vllm"
    with pytest.raises(ConfigError, match="config.inference.engine: 'vllm'"):
        validate(config)

    prompts = [[1, 5, 6], [1, 7]]
    before = sampler.generate(prompts, 1, GREEDY).tokens
    with model_context(None):
        other = nnx.state(Decoder(model.cfg, rngs=nnx.Rngs(9)), nnx.Param)
        held = make_sampler("policy", Decoder(model.cfg, rngs=nnx.Rngs(0)), max_batch=8)
    held.update_weights(nnx.state(model, nnx.Param))  # the weights of `model`: the same greedy continuations
    np.testing.assert_array_equal(held.generate(prompts, 1, GREEDY).tokens, before)
    held.update_weights(other)
    assert not np.array_equal(held.generate(prompts, 1, GREEDY).tokens, before)


def test_a_server_finds_what_its_prompts_share():
    """Whole prompts (a server's requests: 2 judge prompts' questions, each response shown first before 3 others,
    asked twice, and one unrelated prompt) become prefixes and suffixes that rebuild each prompt: one prefix per
    judge prompt (the unrelated one its own), one node per response shown first (its tokens, the same for every
    question showing it), and the repeated questions identical (one leaf, two copies)."""
    rng = np.random.default_rng(2)
    heads = [list(rng.integers(3, 64, 20)) for _ in range(2)]
    responses = [list(rng.integers(3, 64, 12)) for _ in range(4)]
    prompts, firsts = [], []
    for h in heads:
        for i, a in enumerate(responses):
            for j, b in enumerate(responses):
                if i != j:
                    prompts += [h + [1] + a + [2] + b] * 2
                    firsts += [(tuple(h), i)] * 2
    prompts.append(list(rng.integers(3, 64, 30)))
    prefixes, suffixes, splits = question_tree.shared_prefixes(prompts)
    assert [prefixes[o] + s for o, s in suffixes] == prompts
    assert len(prefixes) == 3 and {len(prefixes[o]) for o, _ in suffixes[:-1]} >= {21}
    nodes = {}
    for (o, s), k, first in zip(suffixes[:-1], splits[:-1], firsts):
        nodes.setdefault(first, set()).add((o, tuple(s[:k])))
    assert all(len(v) == 1 and len(next(iter(v))[1]) >= 12 for v in nodes.values())  # a response's questions share it
    tree = question_tree.question_tree(suffixes, splits)
    leaves = [leaf for owner in tree.values() for node in owner.values() for leaf in node.values()]
    assert sorted(map(len, leaves)) == [1] + [2] * 24  # each question twice; the unrelated prompt once


def test_padding_rows_never_keep_a_chunk_decoding(model):
    """A chunk of 3 questions in 8 rows stops when its questions' judgments end (here by their 3rd token): the
    padding rows end before the first step (without that, their own continuations ran the loop on to the limit of
    10), and the questions' continuations are unchanged."""
    prefixes, suffixes = questions()
    suffixes = suffixes[:3]
    first = make_sampler("policy", model, max_batch=64, prefix_reuse=False).complete(prefixes, suffixes, GREEDY)
    stop = tuple(int(t) for t in first.tokens[:, 2])  # each question stops by its 3rd token
    params = SamplingParams(0.0, max_new_tokens=10, stop_token_ids=stop)
    sampler = make_sampler("policy", model, max_batch=64, prefix_reuse=False)
    out = sampler.complete(prefixes, suffixes, params)
    steps = int(out.lengths.max())
    assert steps <= 3
    for q in range(3):
        n = int(out.lengths[q])
        np.testing.assert_array_equal(out.tokens[q, :n], first.tokens[q, :n])
    assert sampler.stats.decode_row_steps == 8 * steps  # the chunk's rows, padding included, for its steps only
