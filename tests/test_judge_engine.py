"""The judge against a scripted Sampler: vote tensors exact (swap order, abstentions, odd V, no mixing of prompts
in a batch), query counts, tournaments, PRC probabilities, pointwise scores, metrics.

`ScriptedSampler` (the package's `rrc_jax.testing.TextSampler` over a table) reads each question's text and
answers with a fixed judgment for what it sees: the prompt character (from `PROMPTS`), the first and the last
response character (from `RESPONSES`), looked up in a table of scripts indexed by (prompt, first, second). For
`next_token_logprobs` it continues the script from the text written after the end marker `§` that closes every
question (logits 4 for the script's next token, 0 elsewhere).
"""

import math

import numpy as np
import pytest

from rrc_jax.judge import Judge, JudgeTemplate, knockout, merge_sort
from rrc_jax.models.char_tokenizer import PRINTABLE, make_char_tokenizer
from rrc_jax.rewards import order_rewards
from rrc_jax.testing import TextSampler

RESPONSES = "αβγδεζηθικλμνξοπ"  # 16 single-character responses / anchors
PROMPTS = "①②③④⑤"
END, END_DIRECT, END_POINT = "§", "¶", "¤"  # last character of every question (reasoning / direct / pointwise)
TOKENIZER = make_char_tokenizer(PRINTABLE + RESPONSES + PROMPTS + END + END_DIRECT + END_POINT)

TEMPLATE = JudgeTemplate("scripted_cot", "pairwise", "JUDGE THE PAIR.", "Q {prompt}\n", "A {a}\nB {b}\n" + END,
                         think=True, direct="scripted_direct")
DIRECT = JudgeTemplate("scripted_direct", "pairwise", "JUDGE THE PAIR.", "Q {prompt}\n",
                       "A {a}\nB {b}\n" + END_DIRECT, think=False)
POINTWISE = JudgeTemplate("scripted_point", "pointwise", "SCORE IT.", "Q {prompt}\n", "R {response}\n" + END_POINT,
                          think=True)
# script 0: prefers A (short reasoning), 1: A (long reasoning), 2: B (short), 3: B (long), 4: abstains (both
# verdicts in the final line), 5: truncated (no verdict before max_new_tokens); after the direct template's
# marker it writes script 6 ([[A]]) or 7 ([[B]]) instead, by DIRECT_OF.
SCRIPTS = ["OK [[A]]", "A IS RIGHT, B IS NOT. [[A]]", "OK [[B]]", "B IS RIGHT, A IS NOT. [[B]]",
           "HARD TO SAY: [[A]] OR [[B]]", "X" * 60, "[[A]]", "[[B]]"] + [f"FINE. <score>{k}</score>" for k in range(10)]
DIRECT_OF = [6, 6, 7, 7, 6, 6, 6, 7] + [6] * 10
# pointwise questions show one response r, so the sampler reads table[p, r, r]: script 8 + score
MAX_NEW = 40  # < len of script 5: it never stops


def ScriptedSampler(table: np.ndarray) -> TextSampler:
    """The package's text sampler (`rrc_jax.testing`) over the scripted world; `stats.calls` counts `complete`
    calls."""

    def script(text: str) -> tuple[list[int], int]:
        """(the script's token ids + EOS, tokens already written after the question's end marker)."""
        end = max(text.rfind(END), text.rfind(END_DIRECT), text.rfind(END_POINT))
        shown = [c for c in text[:end] if c in RESPONSES]
        p = next(PROMPTS.index(c) for c in text if c in PROMPTS)
        k = int(table[p, RESPONSES.index(shown[0]), RESPONSES.index(shown[-1])])
        k = DIRECT_OF[k] if text[end] == END_DIRECT else k
        return TOKENIZER(SCRIPTS[k], add_special_tokens=False)["input_ids"] + [2], len(text) - end - 1

    def logprobs(text: str, token_ids) -> list[float]:
        ids, written = script(text)
        nxt = ids[min(written, len(ids) - 1)]
        log_z = math.log(math.exp(4.0) + len(TOKENIZER) - 1)
        return [(4.0 if t == nxt else 0.0) - log_z for t in token_ids]

    return TextSampler(TOKENIZER, lambda text: TOKENIZER.decode(script(text)[0], skip_special_tokens=True),
                       logprobs, eos_id=2)


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


@pytest.fixture()
def model():
    return ScriptedSampler(TABLE)


def make_judge(sampler, **kw):
    kw = {"template": TEMPLATE, "direct_template": DIRECT, "temperature": 0.0, "max_new_tokens": MAX_NEW, **kw}
    return Judge(sampler, TOKENIZER, **kw)


def group(p, m, offset=0):
    """Prompt text and m response characters of prompt index p (distinct characters per prompt)."""
    return PROMPTS[p], [RESPONSES[(offset + 3 * p + i) % len(RESPONSES)] for i in range(m)]


def shown_first(votes, swap, order):
    """(votes showing a pair in the given order, votes showing it reversed) when vote 0 uses `order` (0: as
    given, 1: reversed) and the votes alternate."""
    if not swap:
        return votes, 0
    given = math.ceil(votes / 2) if order == 0 else votes // 2
    return given, votes - given


def expected_scr(b, p, resp, votes, swap):
    """c[i, j] of prompt p at batch index b, written from the scripted world's rules, independently of the judge."""
    m = len(resp)
    c = np.zeros((m, m), np.int32)
    idx = [RESPONSES.index(r) for r in resp]
    for i in range(m):
        for j in range(i + 1, m):
            if p == BIASED:  # always the first shown: votes in the given order go to i, reversed ones to j
                c[i, j], c[j, i] = shown_first(votes, swap, (b + i + j) % 2)
            elif p == TRUNCATING or QUALITY[p, idx[i]] == QUALITY[p, idx[j]]:
                pass  # abstains
            elif QUALITY[p, idx[i]] > QUALITY[p, idx[j]]:
                c[i, j] = votes
            else:
                c[j, i] = votes
    return c


def test_scripted_judge_writes_its_script(model):
    judge = make_judge(model)
    texts, _ = judge._complete(TEMPLATE, [PROMPTS[0]], [0, 0], [{"a": "α", "b": "β"}, {"a": "β", "b": "α"}])
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
        np.testing.assert_array_equal(c[p], expected_scr(p, p, groups[p], votes, swap), err_msg=f"prompt {p}")
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
                    want = shown_first(votes, swap, (g + i + k) % 2)
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
    summary = judge.summary()
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
    assert judge.summary()["abstain_rate"] == 1.0


@pytest.mark.parametrize("m", [2, 5, 8])
def test_merge_sort_orders_by_quality(model, m):
    prompts, groups = zip(*(group(p, m) for p in (0, 1)))
    judge = make_judge(model)
    result = merge_sort(judge, list(prompts), [list(g) for g in groups])
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
    result = knockout(judge, list(prompts), [list(g) for g in groups], votes=1)
    np.testing.assert_array_equal(result.queries, [m - 1, m - 1])
    assert judge.summary()["sampler_calls"] == math.ceil(math.log2(m))  # one batched round per bracket level
    for b, p in enumerate((0, 1)):
        q = np.array([QUALITY[p, RESPONSES.index(r)] for r in groups[b]])
        assert result.order[b, 0] == np.argmax(q)
        assert sorted(result.order[b]) == list(range(m))
        assert result.rewards[b, np.argmax(q)] == m - 1


@pytest.mark.parametrize("votes", [1, 2])
@pytest.mark.parametrize("m", [2, 5, 8])
def test_the_tournaments_ask_their_closed_form_and_follow_the_verdicts(model, m, votes):
    """`play` with the scripted judge (prompts whose verdicts follow quality): each format asks its closed form of
    duels x V questions, every round of every group in one judge call, and its standing is what its rules give on
    the true verdicts (with swapped votes too: a majority decides)."""
    from rrc_jax.judge.matches import play
    from rrc_jax.rewards.tournament_rules import Circular, DoubleElimination, SeededKnockout, Swiss

    prompts, groups = zip(*(group(p, m) for p in (0, 1)))
    formats = {"circular": (lambda: Circular(m), m if m > 2 else 1), "swiss": (lambda: Swiss(m, m // 2),
               (m // 2) * (m // 2)), "seeded_knockout": (lambda: SeededKnockout(m, -np.arange(m)), m - 1),
               "double_elimination": (lambda: DoubleElimination(m), None)}
    for name, (make, duels) in formats.items():
        judge = make_judge(model)
        rules = [make(), make()]
        queries = play(judge, list(prompts), [list(g) for g in groups], rules, votes=votes, swap=True)
        for b, p in enumerate((0, 1)):
            q = np.array([QUALITY[p, RESPONSES.index(r)] for r in groups[b]])
            rule = make()
            while pairs := rule.pairs():
                rule.record(pairs, [1 if q[i] > q[j] else -1 for i, j in pairs])
            np.testing.assert_array_equal(rules[b].standing(), rule.standing(), err_msg=name)
            if duels is not None:
                assert queries[b] == duels, name
            else:  # no ties here: the best response wins every duel, so no reset
                assert queries[b] == 2 * m - 2, name
        assert judge.metrics.questions == queries.sum() * votes, name


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
