"""Early-stopped voting (`Judge.pair_votes` with an outcome): a pair stops once the votes left cannot change what its
reward reads, and the rewards equal full voting's. Checked exhaustively on the rule (`decided`), then by replaying
a recorded full-voting trace of a sampled judge for SCR and AGR under every tie rule: each vote the early-stopped run
asks is one full voting asked (same question, same stream), and the rewards are the same."""

import itertools
import zlib

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rrc_jax.constructions.agr import agr_result
from rrc_jax.constructions.scr import scr_result
from rrc_jax.judge import Judge
from rrc_jax.models.char_tokenizer import make_char_tokenizer
from rrc_jax.rewards.win_counts import AGR_TIES, SCR_TIES, decided, pair_outcome, votes_to_decide
from rrc_jax.testing import TextSampler

TOKENIZER = make_char_tokenizer()
RULES = [("scr", t) for t in SCR_TIES] + [("agr", t) for t in AGR_TIES]


@pytest.mark.parametrize("kind,ties", RULES)
def test_a_decided_pair_keeps_its_outcome_whatever_the_votes_left_say(kind, ties):
    """For every margin and every number of votes left (up to 5), `decided` holds exactly when every way the votes
    left can go (win, loss or abstention each) gives one outcome; `votes_to_decide` is the fewest votes that can
    decide a pair."""
    outcome = pair_outcome(ties, kind)
    for w, l, r in itertools.product(range(5), range(5), range(6)):
        finals = {int(outcome(np.asarray(w - l + sum(c)))) for c in itertools.product((1, -1, 0), repeat=r)}
        assert bool(decided([w], [l], [r], outcome)[0]) == (len(finals) == 1), (w, l, r)
        need = int(votes_to_decide([w], [l], [r], outcome)[0])
        if len(finals) == 1 or r == 0:
            assert need == 0
            continue
        can = lambda j: any(decided([w + a], [l + j - a], [r - j], outcome)[0] for a in (0, j))
        assert can(need) and not any(can(j) for j in range(1, need)), (w, l, r, need)


class DrawnJudge(TextSampler):
    """A sampled judge: each question's verdict ('[[A]]', '[[B]]' or none: an abstention) is a function of its text,
    the call's key and its stream, as a real engine's draws are; `table` records every (text, key, stream) answered,
    and with `replay` it answers only what that table holds."""

    def __init__(self, p_abstain: float, replay: dict | None = None):
        super().__init__(TOKENIZER)
        self.p_abstain, self.replay, self.table = p_abstain, replay, {}

    def draw(self, text: str, key: int, stream: int) -> str:
        u = zlib.crc32(f"{text}|{key}|{stream}".encode()) / 2 ** 32
        return "" if u < self.p_abstain else ("[[A]]" if u < (1 + self.p_abstain) / 2 else "[[B]]")

    def complete(self, prefixes, suffixes, params, rng=0, *, streams=None, splits=None):
        key = int(np.asarray(jax.random.key_data(rng)).sum()) if not isinstance(rng, int) else rng
        streams = range(len(suffixes)) if streams is None else streams
        texts = [self.text(list(prefixes[o]) + list(s)) for o, s in suffixes]
        answers = []
        for text, stream in zip(texts, streams):
            if self.replay is not None:
                assert (text, key, int(stream)) in self.replay, "a vote full voting never asked"
                answers.append(self.replay[text, key, int(stream)])
            else:
                answers.append(self.draw(text, key, int(stream)))
            self.table[text, key, int(stream)] = answers[-1]
        self.stats.calls += 1
        answer = iter(answers)
        self.answer = lambda _text: next(answer)  # `_out` asks for them in question order
        return self._out(texts, params.max_new_tokens)


def judges(p_abstain: float):
    """A full-voting judge and a replaying one built after it (same seed)."""
    full = Judge(DrawnJudge(p_abstain), TOKENIZER, template="toy_pairwise_cot", max_new_tokens=8, seed=3)
    return full, lambda: Judge(DrawnJudge(p_abstain, replay=full.sampler.table), TOKENIZER,
                               template="toy_pairwise_cot", max_new_tokens=8, seed=3)


GROUPS = [["1 2 3", "3 2 1", "2 1 3", "1 3 2"], ["4 5", "5 4", "4 4", "5 5"]]
PROMPTS = ["3 1 2", "5 4"]
ANCHORS = [["1 2 3", "2 3 1", "3 1 2"], ["4 5", "5 5", "4 4"]]


@settings(max_examples=12, deadline=None)
@given(votes=st.integers(1, 6), swap=st.booleans(), p_abstain=st.sampled_from([0.0, 0.2, 0.5]),
       m=st.integers(2, 4), rule=st.sampled_from(RULES))
def test_early_stopped_rewards_replay_full_voting(votes, swap, p_abstain, m, rule):
    """Full voting's trace replayed: the early-stopped run asks only votes full voting asked, gives its rewards, and
    counts the votes it did not ask; the pairs' margins keep their outcomes."""
    kind, ties = rule
    responses = [g[:m] for g in GROUPS]
    full, replaying = judges(p_abstain)
    early = replaying()
    if kind == "scr":
        a = scr_result(full, PROMPTS, responses, votes=votes, swap=swap, ties=ties)
        b = scr_result(early, PROMPTS, responses, votes=votes, swap=swap, ties=ties, early_stop=True)
    else:
        a = agr_result(full, PROMPTS, responses, ANCHORS, votes=votes, swap=swap, ties=ties)
        b = agr_result(early, PROMPTS, responses, ANCHORS, votes=votes, swap=swap, ties=ties, early_stop=True)
    np.testing.assert_array_equal(a.rewards, b.rewards)
    pairs = len(PROMPTS) * (m * (m - 1) // 2 if kind == "scr" else m * len(ANCHORS[0]))
    assert early.metrics.questions + early.metrics.votes_skipped == full.metrics.questions == pairs * votes
    assert set(early.sampler.table) <= set(full.sampler.table)


def test_early_stopping_asks_in_rounds_and_keeps_the_trace_order():
    """Voting@8 on a judge that always answers A. Without swap the first round's 5 votes a pair (the fewest that
    can make a strict majority) decide every pair: one round, 3 votes a pair skipped. With swap A is each side in
    turn, so every pair stays tied and undecided: later rounds ask the rest, and nothing is skipped. The trace lists
    the votes asked in full voting's order."""
    full = Judge(TextSampler(TOKENIZER, lambda t: "[[A]]"), TOKENIZER, template="toy_pairwise_cot", max_new_tokens=8)
    full.trace = []
    c_full = full.round_robin(PROMPTS[:1], GROUPS[:1], votes=8, swap=False)
    early = Judge(TextSampler(TOKENIZER, lambda t: "[[A]]"), TOKENIZER, template="toy_pairwise_cot", max_new_tokens=8)
    early.trace = []
    c = early.round_robin(PROMPTS[:1], GROUPS[:1], votes=8, swap=False, outcome=pair_outcome("half"))
    assert (c_full[0] == 8 * np.triu(np.ones((4, 4)), 1)).all() and (c[0] == 5 * np.triu(np.ones((4, 4)), 1)).all()
    assert early.metrics.vote_rounds == 1 and early.metrics.votes_skipped == 6 * 3
    swapped = Judge(TextSampler(TOKENIZER, lambda t: "[[A]]"), TOKENIZER, template="toy_pairwise_cot",
                    max_new_tokens=8)
    swapped.trace = []
    c = swapped.round_robin(PROMPTS[:1], GROUPS[:1], votes=8, swap=True, outcome=pair_outcome("half"))
    assert (c[0] + c[0].T == 8 * (1 - np.eye(4))).all()  # position bias alone never decides a pair: all 8 asked
    assert swapped.metrics.vote_rounds > 1 and swapped.metrics.votes_skipped == 0
    order = [(r["i"], r["j"], r["vote"]) for r in swapped.trace]
    assert order == sorted(order)
