"""Judge engine against a scripted model: vote tensors exact (swap flipping, abstentions, odd V, no mixing of prompts
in a batch), query counts, tournaments, PRC probabilities, metrics.

The scripted judge is an NNX module with the `Decoder` sampling interface (`cfg`, `extend(cache, ids, mask)`). It
keeps the visible token ids in its KV cache and writes a fixed judgment for what it sees: the prompt character
(from `PROMPTS`), the first and the last response character (from `RESPONSES`) in the question and a table of
scripts indexed by (prompt, first, second). It counts its own output tokens from the end marker `§` that closes
every question, so any prefix / suffix split of the question gives the same output.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rrc_jax.judge import Judge, JudgeTemplate, order_rewards
from rrc_jax.models.char_tokenizer import PRINTABLE, make_char_tokenizer
from rrc_jax.models.decoder import DecoderConfig, KVCache

RESPONSES = "αβγδεζηθικλμνξοπ"  # 16 single-character responses / anchors
PROMPTS = "①②③④⑤"
END, END_DIRECT, END_POINT = "§", "¶", "¤"  # last character of every question (reasoning / direct / pointwise)
TOKENIZER = make_char_tokenizer(PRINTABLE + RESPONSES + PROMPTS + END + END_DIRECT + END_POINT)
ID = TOKENIZER.convert_tokens_to_ids
R0, P0, END_ID, END_DIRECT_ID, END_POINT_ID = (ID(RESPONSES[0]), ID(PROMPTS[0]), ID(END), ID(END_DIRECT),
                                                ID(END_POINT))

TEMPLATE = JudgeTemplate("scripted_cot", "pairwise", "JUDGE THE PAIR.", "Q {prompt}\n", "A {a}\nB {b}\n" + END,
                         think=True)
DIRECT = JudgeTemplate("scripted_direct", "pairwise", "JUDGE THE PAIR.", "Q {prompt}\n", "A {a}\nB {b}\n" + END_DIRECT,
                       think=False)
POINTWISE = JudgeTemplate("scripted_point", "pointwise", "SCORE IT.", "Q {prompt}\n", "R {response}\n" + END_POINT,
                          think=True)
# script 0: prefers A (short reasoning), 1: A (long reasoning), 2: B (short), 3: B (long), 4: abstains (both
# verdicts in the final line), 5: truncated (no verdict before max_new_tokens); after the direct template's
# marker it writes script 6 ([[A]]) or 7 ([[B]]) instead, by DIRECT_OF.
SCRIPTS = ["OK [[A]]", "A IS RIGHT, B IS NOT. [[A]]", "OK [[B]]", "B IS RIGHT, A IS NOT. [[B]]",
           "HARD TO SAY: [[A]] OR [[B]]", "X" * 60, "[[A]]", "[[B]]"] + [f"FINE. <score>{k}</score>" for k in range(10)]
DIRECT_OF = np.array([6, 6, 7, 7, 6, 6, 6, 7] + [6] * 10)
# pointwise questions show one response r, so the model reads table[p, r, r]: script 8 + score
MAX_NEW = 40  # < len of script 5: it never stops


def _script_ids():
    rows = [TOKENIZER(s, add_special_tokens=False)["input_ids"] + [2] for s in SCRIPTS]
    width = max(map(len, rows))
    return np.array([r + [2] * (width - len(r)) for r in rows], np.int32)


class ScriptedJudge(nnx.Module):
    """Next-token logits = 4 x one_hot(script[table[p, first, second]][j]), j = tokens written after `§`."""

    def __init__(self, table: np.ndarray):
        self.cfg = DecoderConfig(model_type="llama", vocab_size=len(TOKENIZER), hidden_size=2, intermediate_size=2,
                                 num_layers=1, num_heads=1, num_kv_heads=1, head_dim=2, eos_token_ids=(2,),
                                 pad_token_id=0, max_position_embeddings=4096)
        self.table = nnx.Variable(jnp.asarray(table, jnp.int32))  # [P, R, R] script index
        self.scripts = nnx.Variable(jnp.asarray(_script_ids()))

    def _logits(self, toks, valid):
        s = toks.shape[1]
        col = jnp.arange(s)[None]
        in_range = lambda lo, n: valid & (toks >= lo) & (toks < lo + n)
        is_r, is_p = in_range(R0, len(RESPONSES)), in_range(P0, len(PROMPTS))
        at = lambda pos: jnp.take_along_axis(toks, pos[:, None], axis=1)[:, 0]
        first = at(jnp.argmax(is_r, axis=1)) - R0
        second = at(s - 1 - jnp.argmax(is_r[:, ::-1], axis=1)) - R0
        p = at(jnp.argmax(is_p, axis=1)) - P0
        is_e = valid & ((toks == END_ID) | (toks == END_DIRECT_ID) | (toks == END_POINT_ID))
        e_pos = s - 1 - jnp.argmax(is_e[:, ::-1], axis=1)
        direct = at(e_pos) == END_DIRECT_ID
        j = jnp.sum(valid & (col > e_pos[:, None]), axis=1)
        script = self.table[...][jnp.clip(p, 0), jnp.clip(first, 0), jnp.clip(second, 0)]
        script = jnp.where(direct, jnp.asarray(DIRECT_OF)[script], script)
        scripts = self.scripts[...]
        tok = scripts[script, jnp.minimum(j, scripts.shape[1] - 1)]
        logits = 4.0 * jax.nn.one_hot(tok, self.cfg.vocab_size)
        return jnp.where(is_e.any(axis=1)[:, None], logits, 0.0)

    def extend(self, cache: KVCache, input_ids, attention_mask=None) -> KVCache:
        b, t = input_ids.shape
        new = jnp.ones((b, t), bool) if attention_mask is None else attention_mask.astype(bool)
        valid = jax.lax.dynamic_update_slice_in_dim(cache.valid, new, cache.end, axis=1)
        upd = jnp.broadcast_to(input_ids.astype(jnp.float32)[:, None, :], (b, 2, t))
        (block,), = cache.k  # one layer; a tiny cache is one block [B*K, D, S], K = 1
        k = jax.lax.dynamic_update_slice(block, upd.astype(block.dtype), (0, 0, cache.end))
        toks, seen = k[:, 0, :].astype(jnp.int32), valid
        if cache.shared:  # a branched cache: the shared prefix [K, D, N] comes before the row's own slots
            shared = jnp.broadcast_to(cache.shared_k[0][0, 0, :].astype(jnp.int32), cache.shared_mask.shape)
            toks, seen = jnp.concatenate([shared, toks], axis=1), jnp.concatenate([cache.shared_mask, valid], axis=1)
        logits = jnp.where(new.any(axis=1)[:, None], self._logits(toks, seen), cache.logits)
        return cache.replace(k=((k,),), valid=valid, positions=cache.positions + new.sum(axis=1, dtype=jnp.int32),
                             end=cache.end + t, logits=logits)


# --------------------------------------------------------------------------------------------------------------
# The scripted world: quality per (prompt, response); prompt ③ has a tie; prompt ④ always says "A" (position bias);
# prompt ⑤ never finishes its reasoning.
# --------------------------------------------------------------------------------------------------------------

rng = np.random.default_rng(0)
QUALITY = rng.permutation(len(PROMPTS) * len(RESPONSES)).reshape(len(PROMPTS), len(RESPONSES)).astype(float)
QUALITY[2, 7] = QUALITY[2, 6]  # prompt ③: its first two responses (η, θ) tie -> the judge abstains on that pair
BIASED, TRUNCATING = 3, 4


def script_for(p, first, second):
    long = (first + second) % 2
    if p == BIASED:
        return long  # always A
    if p == TRUNCATING:
        return 5
    q1, q2 = QUALITY[p, first], QUALITY[p, second]
    return 4 if q1 == q2 else (long if q1 > q2 else 2 + long)


def point_score(p, r):
    return None if p == TRUNCATING else int(QUALITY[p, r]) % 10


TABLE = np.array([[[script_for(p, i, j) if i != j else (5 if point_score(p, i) is None else 8 + point_score(p, i))
                    for j in range(len(RESPONSES))] for i in range(len(RESPONSES))] for p in range(len(PROMPTS))])


@pytest.fixture(scope="module")
def model():
    return ScriptedJudge(TABLE)


def make_judge(model, **kw):
    kw = {"template": TEMPLATE, "direct_template": DIRECT, "temperature": 0.0, "max_new_tokens": MAX_NEW,
          "max_batch": 16, **kw}
    return Judge(model, TOKENIZER, **kw)


def group(p, m, offset=0):
    """Prompt text and m response characters of prompt index p (distinct characters per prompt)."""
    return PROMPTS[p], [RESPONSES[(offset + 3 * p + i) % len(RESPONSES)] for i in range(m)]


def expected_scr(p, resp, votes, swap):
    """c[i, j] written from the scripted world's rules, independently of the engine."""
    m = len(resp)
    c = np.zeros((m, m), np.int32)
    idx = [RESPONSES.index(r) for r in resp]
    for i in range(m):
        for j in range(i + 1, m):
            if p == BIASED:  # always the first shown: original order votes go to i, swapped ones to j
                c[i, j], c[j, i] = (math.ceil(votes / 2), votes // 2) if swap else (votes, 0)
            elif p == TRUNCATING or QUALITY[p, idx[i]] == QUALITY[p, idx[j]]:
                pass  # abstains
            elif QUALITY[p, idx[i]] > QUALITY[p, idx[j]]:
                c[i, j] = votes
            else:
                c[j, i] = votes
    return c


def test_scripted_judge_writes_its_script(model):
    judge = make_judge(model)
    texts, _, _ = judge._complete(TEMPLATE, [PROMPTS[0]], [0, 0], [{"a": "α", "b": "β"}, {"a": "β", "b": "α"}])
    want = [SCRIPTS[script_for(0, 0, 1)], SCRIPTS[script_for(0, 1, 0)]]
    assert texts == want and {t[-5:] for t in texts} == {"[[A]]", "[[B]]"}


@pytest.mark.parametrize("votes,swap", [(1, True), (2, True), (3, True), (2, False)])
def test_round_robin_counts_are_exact(model, votes, swap):
    """Five prompts in one batch (honest, honest, a tie, position-biased, truncating), distinct response characters
    per prompt: every count equals the scripted world's, so no pair is judged under another prompt."""
    m = 4
    prompts, groups = zip(*(group(p, m) for p in range(len(PROMPTS))))
    judge = make_judge(model)
    c = judge.round_robin(list(prompts), [list(g) for g in groups], votes=votes, swap=swap)
    assert c.shape == (len(PROMPTS), m, m) and c.dtype == np.int32
    for p in range(len(PROMPTS)):
        np.testing.assert_array_equal(c[p], expected_scr(p, groups[p], votes, swap), err_msg=f"prompt {p}")
    assert judge.metrics.questions == len(PROMPTS) * m * (m - 1) // 2 * votes  # m(m-1)/2 x V per prompt
    n_abstain = (m * (m - 1) // 2 + 1) * votes  # truncating prompt: all pairs; prompt ③: the tied pair
    assert judge.metrics.abstains == n_abstain
    assert judge.metrics.truncated == m * (m - 1) // 2 * votes


def test_round_robin_prompt_order_does_not_matter(model):
    """Permuting the prompts of a batch permutes the counts (a prompt-index bug would scramble them)."""
    prompts, groups = zip(*(group(p, 5) for p in (0, 1, 2)))
    judge = make_judge(model)
    c = judge.round_robin(list(prompts), [list(g) for g in groups], votes=2)
    perm = [2, 0, 1]
    c_perm = judge.round_robin([prompts[i] for i in perm], [list(groups[i]) for i in perm], votes=2)
    np.testing.assert_array_equal(c_perm, c[perm])


def test_same_responses_under_different_prompts(model):
    """The same two response texts get opposite verdicts under prompts whose qualities disagree."""
    p0, p1 = 0, 1
    i, j = next((i, j) for i in range(16) for j in range(16)
                if (QUALITY[p0, i] > QUALITY[p0, j]) and (QUALITY[p1, i] < QUALITY[p1, j]))
    judge = make_judge(model)
    c = judge.round_robin([PROMPTS[p0], PROMPTS[p1]], [[RESPONSES[i], RESPONSES[j]]] * 2, votes=2)
    np.testing.assert_array_equal(c[:, 0, 1], [2, 0])
    np.testing.assert_array_equal(c[:, 1, 0], [0, 2])


@pytest.mark.parametrize("votes,swap", [(1, True), (4, True), (3, True), (3, False)])
def test_vs_anchors_counts_are_exact(model, votes, swap):
    m, n = 3, 2
    prompts = [PROMPTS[p] for p in (0, BIASED, 1)]
    responses = [group(p, m)[1] for p in (0, BIASED, 1)]
    anchors = [group(p, n, offset=8)[1] for p in (0, BIASED, 1)]
    judge = make_judge(model)
    wins, losses = judge.vs_anchors(prompts, responses, anchors, votes=votes, swap=swap)
    assert wins.shape == losses.shape == (3, m, n)
    for g, p in enumerate((0, BIASED, 1)):
        for i in range(m):
            for k in range(n):
                if p == BIASED:
                    want = (math.ceil(votes / 2), votes // 2) if swap else (votes, 0)
                else:
                    better = QUALITY[p, RESPONSES.index(responses[g][i])] > QUALITY[p, RESPONSES.index(anchors[g][k])]
                    want = (votes, 0) if better else (0, votes)
                assert (wins[g, i, k], losses[g, i, k]) == want, (g, i, k)
    assert judge.metrics.questions == 3 * m * n * votes


def test_compare_swap_and_position_consistency(model):
    judge = make_judge(model)
    a, b = RESPONSES[0], RESPONSES[1]
    honest = judge.compare([PROMPTS[0], PROMPTS[BIASED]], [a, a], [b, b], votes=4, swap=True)
    want0 = (4, 0) if QUALITY[0, 0] > QUALITY[0, 1] else (0, 4)
    assert (honest.wins[0], honest.losses[0]) == want0
    assert (honest.wins[1], honest.losses[1], honest.abstains[1]) == (2, 2, 0)
    summary = judge.metrics.summary()
    # honest prompt: 2 consistent couples; biased prompt: 2 inconsistent couples
    assert (summary["swap_couples"], summary["swap_consistent"]) == (4, 2)
    assert summary["position_consistency"] == 0.5
    no_swap = make_judge(model).compare([PROMPTS[BIASED]], [a], [b], votes=4, swap=False)
    assert (no_swap.wins[0], no_swap.losses[0]) == (4, 0)


def test_compare_abstains(model):
    judge = make_judge(model)
    tie = judge.compare([PROMPTS[2]], [RESPONSES[6]], [RESPONSES[7]], votes=3)
    assert (tie.wins[0], tie.losses[0], tie.abstains[0]) == (0, 0, 3)
    cut = judge.compare([PROMPTS[TRUNCATING]], [RESPONSES[0]], [RESPONSES[1]], votes=2)
    assert (cut.wins[0], cut.losses[0], cut.abstains[0]) == (0, 0, 2)
    assert judge.metrics.summary()["abstain_rate"] == 1.0


def test_prefix_reuse_equals_full_prefill_and_saves_the_expected_tokens(model):
    prompts, groups = zip(*(group(p, 4) for p in range(3)))
    reuse, full = make_judge(model), make_judge(model, prefix_reuse=False)
    c1 = reuse.round_robin(list(prompts), [list(g) for g in groups], votes=2)
    c2 = full.round_robin(list(prompts), [list(g) for g in groups], votes=2)
    np.testing.assert_array_equal(c1, c2)
    # each prompt's prefix ("<s>JUDGE THE PAIR.\n\nQ ①\n": 22 tokens) is prefilled once instead of 12 times
    prefix = len(TOKENIZER("JUDGE THE PAIR.\n\nQ ①\n")["input_ids"])
    assert prefix == 22
    assert reuse.metrics.prefill_tokens_saved == 3 * (12 - 1) * prefix
    assert full.metrics.prefill_tokens - reuse.metrics.prefill_tokens == 3 * (12 - 1) * prefix
    assert reuse.metrics.judge_tokens == full.metrics.judge_tokens
    assert reuse.metrics.reuse_fallbacks == 0


def test_chunking_does_not_change_votes(model):
    prompts, groups = zip(*(group(p, 5) for p in range(3)))
    big = make_judge(model, max_batch=64).round_robin(list(prompts), [list(g) for g in groups], votes=3)
    small_judge = make_judge(model, max_batch=4)
    small = small_judge.round_robin(list(prompts), [list(g) for g in groups], votes=3)
    np.testing.assert_array_equal(big, small)
    assert small_judge.metrics.sampler_calls == math.ceil(3 * 10 * 3 / 4)


@pytest.mark.parametrize("m", [2, 5, 8])
def test_merge_sort_orders_by_quality(model, m):
    prompts, groups = zip(*(group(p, m) for p in (0, 1)))
    judge = make_judge(model)
    result = judge.merge_sort(list(prompts), [list(g) for g in groups])
    for b, p in enumerate((0, 1)):
        q = [QUALITY[p, RESPONSES.index(r)] for r in groups[b]]
        np.testing.assert_array_equal(result.order[b], np.argsort(q)[::-1])
        np.testing.assert_array_equal(result.rewards[b], m - 1 - np.argsort(result.order[b]))
    assert (result.queries <= m * math.ceil(math.log2(m))).all() and (result.queries >= m - 1).all()
    assert judge.metrics.questions == result.queries.sum()


@pytest.mark.parametrize("m", [2, 5, 8])
def test_knockout_uses_m_minus_1_queries_and_crowns_the_best(model, m):
    prompts, groups = zip(*(group(p, m) for p in (0, 1)))
    judge = make_judge(model)
    result = judge.knockout(list(prompts), [list(g) for g in groups], votes=1)
    np.testing.assert_array_equal(result.queries, [m - 1, m - 1])
    assert judge.metrics.sampler_calls == math.ceil(math.log2(m))  # one batched round per bracket level
    for b, p in enumerate((0, 1)):
        q = np.array([QUALITY[p, RESPONSES.index(r)] for r in groups[b]])
        assert result.order[b, 0] == np.argmax(q)
        assert sorted(result.order[b]) == list(range(m))
        assert result.rewards[b, np.argmax(q)] == m - 1


def test_order_rewards_is_eq21():
    np.testing.assert_array_equal(order_rewards(np.array([[2, 0, 1]]), alpha=2.0), [[2.0, 0.0, 4.0]])


def test_preference_prob(model):
    judge = make_judge(model)
    a, b = RESPONSES[0], RESPONSES[1]
    a_better = QUALITY[0, 0] > QUALITY[0, 1]
    sig = 1 / (1 + math.exp(-4.0))  # logits 4 vs 0
    for think in (True, False):
        p = judge.preference_prob([PROMPTS[0], PROMPTS[0]], [a, b], [b, a], think=think)
        want = [sig, 1 - sig] if a_better else [1 - sig, sig]
        np.testing.assert_allclose(p, want, rtol=1e-5)
    assert judge.metrics.forced_verdicts == 0
    p = judge.preference_prob([PROMPTS[TRUNCATING]], [a], [b], think=True)
    assert judge.metrics.forced_verdicts == 1 and 0.0 <= p[0] <= 1.0


def test_pointwise_scores(model):
    judge = make_judge(model)
    groups = [group(p, 3)[1] for p in (0, TRUNCATING, 1)]
    scores = judge.score([PROMPTS[p] for p in (0, TRUNCATING, 1)], groups, template=POINTWISE)
    assert scores.shape == (3, 3)
    for g, p in enumerate((0, TRUNCATING, 1)):
        for i, r in enumerate(groups[g]):
            want = point_score(p, RESPONSES.index(r))
            assert (math.isnan(scores[g, i]) if want is None else scores[g, i] == want), (g, i)
    assert judge.metrics.abstains == 3 and judge.metrics.questions == 9


def test_bad_inputs_name_the_problem(model):
    judge = make_judge(model)
    with pytest.raises(ValueError, match="votes"):
        judge.round_robin(["①"], [["α", "β"]], votes=0)
    with pytest.raises(ValueError, match="same number"):
        judge.round_robin(["①", "②"], [["α", "β"], ["γ"]])
    with pytest.raises(ValueError, match="equal lengths"):
        judge.compare(["①"], ["α", "β"], ["γ"])
    with pytest.raises(ValueError, match="unknown judge template"):
        Judge(model, TOKENIZER, template="nope")
    with pytest.raises(ValueError, match="pointwise"):
        judge.score(["①"], [["α"]], template=TEMPLATE)
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        make_judge(model, max_new_tokens=0)
    with pytest.raises(ValueError, match="top_p"):
        make_judge(model, top_p=0.0)
