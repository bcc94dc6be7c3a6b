"""Adaptive comparison schedules (`rrc_jax.rewards.adaptive`, `rrc_jax.constructions.adaptive`): the rules' rounds
and budgets on random outcomes; with nothing left out (the whole budget, tolerance 0) their rewards are SCR's and
AGR's exactly; their exact stop (a comparison's votes stopped once its majority is decided) replays full voting;
their approximate stop (the tolerance) is counted where it binds; and another trainer's groups get them."""

import itertools
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rrc_jax.constructions.adaptive import active_result, sequential_result
from rrc_jax.constructions.agr import agr_result
from rrc_jax.constructions.scr import scr_result
from rrc_jax.judge import Judge
from rrc_jax.rewards import agr_rewards, scr_rewards
from rrc_jax.rewards.adaptive import (ActiveRoundRobin, SequentialAnchors, bradley_terry, budget_pairs,
                                      copy_classes, win_probabilities, wins_left)
from rrc_jax.testing import TextSampler
from test_early_stop import ANCHORS, GROUPS, PROMPTS, TOKENIZER, judges


def test_bradley_terry_orders_by_wins_and_stays_finite():
    """The fit orders a round robin's responses by their wins, is antisymmetric (strengths sum to 0 with the
    symmetric prior), and stays finite when one response beats all (perfect separation)."""
    w = np.array([[0, 3, 3, 3], [0, 0, 2, 3], [0, 1, 0, 2], [0, 0, 1, 0]], float)
    s = bradley_terry(w)
    assert np.all(np.diff(s) < 0) and abs(s.sum()) < 1e-9 and np.all(np.isfinite(s))
    p = win_probabilities(s)
    np.testing.assert_allclose(p + p.T, 1 - np.eye(4) + np.eye(4))  # P(i > j) + P(j > i) = 1 (diagonal: 1/2 + 1/2)
    np.testing.assert_array_equal(bradley_terry(np.zeros((3, 3))), np.zeros(3))  # no data: the prior's mean


def play_out(rule, outcome_of):
    """Play `rule` to its end with `outcome_of(i, j)`; each round's pairs."""
    rounds = []
    while pairs := rule.pairs():
        rounds.append(pairs)
        rule.record(pairs, [outcome_of(i, j) for i, j in pairs])
    return rounds


@settings(max_examples=40, deadline=None)
@given(m=st.integers(2, 9), budget=st.sampled_from([0.1, 0.34, 0.5, 0.8, 1.0]), seed=st.integers(0, 999),
       ties=st.sampled_from(["zero", "half"]))
def test_active_rounds_are_matchings_of_new_pairs_up_to_the_budget(m, budget, seed, ties):
    """Each round pairs a response at most once and never a pair asked before; the rule asks exactly its budget's
    pairs (all of them at budget 1) and, with every pair asked, rewards SCR's win counts under `ties`."""
    rng = np.random.default_rng(seed)
    outcomes = {p: int(rng.choice([-1, 0, 1])) for p in itertools.combinations(range(m), 2)}
    rule = ActiveRoundRobin(m, budget, ties=ties)
    rounds = play_out(rule, lambda i, j: outcomes[i, j])
    asked = [p for r in rounds for p in r]
    assert all(len({x for p in r for x in p}) == 2 * len(r) for r in rounds)
    assert len(set(asked)) == len(asked) == rule.questions == budget_pairs(m, budget)
    if budget == 1.0:
        c = np.zeros((1, m, m))
        for (i, j), o in outcomes.items():
            c[0, i, j], c[0, j, i] = o > 0, o < 0
        np.testing.assert_allclose(rule.rewards(0.1), np.asarray(scr_rewards(c, 0.1, ties))[0], rtol=1e-6)
    else:  # a pair not asked counts its fitted probability: the rewards sum to the pairs' count (ties='half')
        if ties == "half":
            assert rule.rewards().sum() == pytest.approx(m * (m - 1) / 2, rel=1e-5)


def test_active_first_round_pairs_neighbours_then_equal_strengths():
    """With nothing known every pair is as uncertain: round one pairs 0-1, 2-3, ...; round two pairs the winners
    together and the losers together (the closest strengths), as a Swiss round pairs equal scores."""
    rule = ActiveRoundRobin(8, 1.0)
    assert rule.pairs() == [(0, 1), (2, 3), (4, 5), (6, 7)]
    rule.record([(0, 1), (2, 3), (4, 5), (6, 7)], [1, 1, -1, -1])  # winners 0, 2, 5, 7
    second = rule.pairs()
    assert len(second) == 4 and all({i, j} <= {0, 2, 5, 7} or {i, j} <= {1, 3, 4, 6} for i, j in second)


def test_active_tolerance_stops_a_group_whose_open_pairs_are_sure():
    """A strict order of 6 (15 pairs): at tolerance 0.3 the group stops once every open pair is predicted with
    probability >= 0.7, here two pairs early, its order intact; at 0.1 no pair is that sure before the last; a
    tolerance near 1/2 stops it sooner and pays in fidelity (responses 3 and 4 swapped): what the tolerance trades."""
    order = lambda i, j: 1 if i < j else -1  # response 0 best
    rules = {tol: ActiveRoundRobin(6, 1.0, tolerance=tol) for tol in (0.1, 0.3, 0.45)}
    for rule in rules.values():
        play_out(rule, order)
    assert not rules[0.1].stopped and rules[0.1].questions == 15
    assert rules[0.3].stopped and rules[0.3].questions == 13 and np.all(np.diff(rules[0.3].rewards()) < 0)
    loose = rules[0.45]
    assert loose.stopped and loose.questions < 13 and loose.rewards()[4] > loose.rewards()[3]


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 6), n=st.integers(1, 8), tolerance=st.sampled_from([0.0, 0.8, 1.2, 2.0]),
       first=st.integers(1, 3), step=st.integers(1, 3), seed=st.integers(0, 999),
       ties=st.sampled_from(["zero", "half", "win"]))
def test_sequential_anchors_stop_within_their_tolerance(m, n, tolerance, first, step, seed, ties):
    """Each response meets the anchors in order, `first` then `step` a round; it stops before its last anchor only
    when the posterior sd of its wins left is <= the tolerance, and then its reward adds that posterior's mean;
    at tolerance 0 it meets every anchor and rewards AGR's count under `ties` exactly."""
    rng = np.random.default_rng(seed)
    outcomes = rng.choice([-1, 0, 1], size=(m, n))
    rule = SequentialAnchors(m, n, ties=ties, tolerance=tolerance, first=first, step=step)
    rounds = play_out(rule, lambda i, j: int(outcomes[i, j - m]))
    for r in rounds:  # anchors in order, each response's new ones contiguous
        for i in {i for i, _ in r}:
            ks = [j - m for a, j in r if a == i]
            assert ks == list(range(ks[0], ks[0] + len(ks)))
    for i in range(m):
        k = int(rule.met[i])
        assert rule.stopped[i] == (k < n)
        if k < n:
            assert tolerance > 0 and wins_left(rule.score[i], k, n - k)[1] <= tolerance
    if tolerance == 0:
        assert rule.questions == m * n
        w, lo = (outcomes > 0)[None].astype(int), (outcomes < 0)[None].astype(int)
        np.testing.assert_allclose(rule.rewards(0.1), np.asarray(agr_rewards(w, lo, 0.1, ties))[0], rtol=1e-6)


def text_judge():
    """A judge whose verdict is a function of the question's text alone (the A/B order included): schedules that
    ask the same questions get the same verdicts, whatever their calls' keys."""
    verdict = lambda text: ("[[A]]", "[[B]]", "")[zlib.crc32(text.encode()) % 3]
    return Judge(TextSampler(TOKENIZER, verdict), TOKENIZER, template="toy_pairwise_cot", max_new_tokens=8)


def fair_judge():
    """A judge whose verdict depends on the two texts and not on their order (the text with the larger checksum
    wins) and that abstains on two copies of one text: a verdict asked of one copy is the one any copy would get."""
    def verdict(question):
        a, b = (line[3:] for line in question.splitlines()[1:3])
        return "" if a == b else "[[A]]" if zlib.crc32(a.encode()) > zlib.crc32(b.encode()) else "[[B]]"
    return Judge(TextSampler(TOKENIZER, verdict), TOKENIZER, template="toy_pairwise_cot", max_new_tokens=8)


@pytest.mark.parametrize("ties", ["zero", "half"])
def test_active_with_its_whole_budget_is_scr(ties):
    """budget = 1: every pair asked, in the round robin's A/B orders: SCR's rewards exactly."""
    a = scr_result(text_judge(), PROMPTS, GROUPS, votes=3, swap=True, ties=ties)
    b = active_result(text_judge(), PROMPTS, GROUPS, votes=3, swap=True, ties=ties, budget=1.0)
    np.testing.assert_allclose(a.rewards, b.rewards, rtol=1e-6)
    assert b.metrics["judge/comparisons"] == 6 and b.metrics["judge/tolerance_stops"] == 0


@pytest.mark.parametrize("ties", ["zero", "half", "win"])
def test_agr_sequential_at_tolerance_zero_is_agr(ties):
    """Tolerance 0: every response against every anchor: AGR's rewards exactly (no response here copies an anchor
    of its prompt)."""
    groups = [["1 1 1", "2 2 2", "3 3 3", "1 2 2"], ["9 9", "8 8", "7 7", "9 8"]]
    a = agr_result(text_judge(), PROMPTS, groups, ANCHORS, votes=3, swap=True, ties=ties)
    b = sequential_result(text_judge(), PROMPTS, groups, ANCHORS, votes=3, swap=True, ties=ties, tolerance=0.0,
                          first=1, step=1)
    np.testing.assert_allclose(a.rewards, b.rewards, rtol=1e-6)
    assert b.metrics["judge/comparisons"] == 4 * 3 and b.metrics["judge/tolerance_stops"] == 0


def test_copies_are_never_asked_about_each_other():
    """Two copies of one text are half a win each and no question: with the whole budget, `active` asks every
    other pair and gives SCR's rewards under 'half' on a judge that abstains on two copies (a tie: half a win);
    `agr_sequential` meets an anchor its response copies without a question, at half a win, as AGR under 'half'
    does on that judge."""
    groups = [GROUPS[0], [GROUPS[1][0], GROUPS[1][1], GROUPS[1][2], GROUPS[1][0]]]  # the second's last: a copy
    a = scr_result(fair_judge(), PROMPTS, groups, votes=3, swap=True, ties="half")
    b = active_result(fair_judge(), PROMPTS, groups, votes=3, swap=True, ties="half", budget=1.0)
    np.testing.assert_allclose(a.rewards, b.rewards, rtol=1e-6)
    assert b.rewards[1, 0] == b.rewards[1, 3] and b.metrics["judge/comparisons"] == (6 + 5) / 2
    a = agr_result(fair_judge(), PROMPTS, GROUPS, ANCHORS, votes=3, swap=True, ties="half")
    b = sequential_result(fair_judge(), PROMPTS, GROUPS, ANCHORS, votes=3, swap=True, ties="half", tolerance=0.0,
                          first=1, step=1)
    np.testing.assert_allclose(a.rewards, b.rewards, rtol=1e-6)
    same = sum(r == x for g, anchors in zip(GROUPS, ANCHORS) for r in g for x in anchors)
    assert same == 4 and b.metrics["judge/comparisons"] == (2 * 4 * 3 - same) / 2
    group = ["1 2 3", "3 2 1", "1 2 3", "2 1 3", "3 2 1", "1 2 3"]
    rule = ActiveRoundRobin(6, 1.0, ties="zero", copies=copy_classes(group))
    play_out(rule, lambda i, j: 1 if group[i] < group[j] else -1)  # "1 2 3" < "2 1 3" < "3 2 1": the first best
    assert list(copy_classes(group)) == [0, 1, 0, 3, 1, 0] and rule.questions == 15 - 3 - 1
    np.testing.assert_array_equal(rule.rewards(), [3 + 1, 0.5, 4, 2, 0.5, 4])  # wins, and half a win a copy


@settings(max_examples=10, deadline=None)
@given(votes=st.integers(2, 5), swap=st.booleans(), p_abstain=st.sampled_from([0.0, 0.3]),
       schedule=st.sampled_from(["active", "agr_sequential"]), tolerance=st.sampled_from([0.0, 0.3]))
def test_early_stopped_duels_replay_full_voting(votes, swap, p_abstain, schedule, tolerance):
    """The exact stop: a schedule whose duels stop once their majority is decided asks only votes full voting
    asked (same question, same stream), and so plays the same rounds to the same rewards."""
    full, replaying = judges(p_abstain)
    early = replaying()
    if schedule == "active":
        kw = dict(votes=votes, swap=swap, budget=0.5, tolerance=tolerance)
        a, b = active_result(full, PROMPTS, GROUPS, **kw), active_result(early, PROMPTS, GROUPS, early_stop=True, **kw)
    else:
        kw = dict(votes=votes, swap=swap, tolerance=4 * tolerance, first=1, step=1)
        a = sequential_result(full, PROMPTS, GROUPS, ANCHORS, **kw)
        b = sequential_result(early, PROMPTS, GROUPS, ANCHORS, early_stop=True, **kw)
    np.testing.assert_array_equal(a.rewards, b.rewards)
    assert a.metrics == b.metrics
    assert early.metrics.questions + early.metrics.votes_skipped == full.metrics.questions
    assert set(early.sampler.table) <= set(full.sampler.table)


def test_the_tolerance_metric_counts_the_responses_it_stopped():
    """A judge that always prefers the response: every response stops after its first two anchors at a loose
    tolerance (share 1.0) with reward 2 + the posterior mean of the rest; a tight one meets all three. (Responses
    here copy no anchor and no other response.)"""
    always = Judge(TextSampler(TOKENIZER, lambda t: "[[A]]"), TOKENIZER, template="toy_pairwise_cot",
                   max_new_tokens=8)
    groups = [["1 1 1", "2 2 2", "3 3 3", "1 2 2"], ["9 9", "8 8", "7 7", "9 8"]]
    always.trace = []
    loose = sequential_result(always, PROMPTS, groups, ANCHORS, votes=1, swap=False, alpha=1.0, tolerance=0.5)
    assert loose.metrics["judge/tolerance_stops"] == 1.0 and loose.metrics["judge/comparisons"] == 4 * 2
    assert sorted({(r["prompt"], r["i"], r["anchor"]) for r in always.trace}) == [  # traced as AGR's: i, anchor
        (b, i, k) for b in range(2) for i in range(4) for k in range(2)]
    np.testing.assert_allclose(loose.rewards, 2 + wins_left(2, 2, 1)[0])
    tight = sequential_result(always, PROMPTS, groups, ANCHORS, votes=1, swap=False, alpha=1.0, tolerance=0.1)
    assert tight.metrics["judge/tolerance_stops"] == 0.0 and (tight.rewards == 3).all()


def test_the_reward_service_judges_a_cohort_in_rounds():
    """Both schedules served (`GroupRewards` -> `cohort_rewards` -> the endpoint): a whole cohort's rewards, its
    rounds waiting on its earlier verdicts inside one request, equal the schedule's own on the same judge; AGR's
    variant reads the anchors each rollout brings."""
    from conftest import post_json

    from rrc_jax.inference.server import serving
    from rrc_jax.integrations.groups import GroupRewards
    from rrc_jax.service.app import make_app
    from rrc_jax.service.rewards import cohort_rewards

    m = len(GROUPS[0])
    cases = {"active": (dict(budget=0.5), active_result(text_judge(), PROMPTS, GROUPS, votes=1, swap=True)),
             "agr_sequential": (dict(tolerance=0.8, first=1, step=1), sequential_result(
                 text_judge(), PROMPTS, GROUPS, ANCHORS, votes=1, swap=True, tolerance=0.8, first=1, step=1))}
    for kind, (own, direct) in cases.items():
        rewards = GroupRewards(text_judge(), kind, group_size=m, votes=1, **own)
        rollouts = [{"prompt": p, "completion": c, "group_size": m, "request_id": f"{b}.{i}",
                     **({"anchors": ANCHORS[b]} if kind == "agr_sequential" else {})}
                    for b, (p, group) in enumerate(zip(PROMPTS, GROUPS)) for i, c in enumerate(group)]
        with serving(make_app(cohort_rewards(rewards), poll_s=0.05)) as url:
            status, answer = post_json(url + "/v1/rewards", {"rollouts": rollouts})
        assert status == 200, answer
        np.testing.assert_allclose(np.reshape(answer["rewards"], (len(PROMPTS), m)), direct.rewards, rtol=1e-6)
        assert rewards.last_metrics["judge/comparisons"] == direct.metrics["judge/comparisons"]


@pytest.mark.parametrize("field, value, message", [
    ("reward.active.budget", 1.5, r"^config\.reward\.active\.budget: 1\.5 must be in \(0, 1\]"),
    ("reward.active.tolerance", 0.5, r"^config\.reward\.active\.tolerance: 0\.5 must be in \[0, 0\.5\)"),
    ("reward.agr_sequential.alpha", -1.0, r"^config\.reward\.agr_sequential\.alpha: -1\.0 must be > 0"),
    ("reward.agr_sequential.first", 0, r"^config\.reward\.agr_sequential\.first: 0 must be >= 1"),
])
def test_a_bad_setting_is_one_line_naming_its_group(field, value, message):
    """Each schedule's settings are checked in its own config group, AGR's inherited fields too."""
    from rrc_jax.config import base_config, validate
    from rrc_jax.errors import ConfigError

    config = base_config("agr_sequential")
    config.update_from_flattened_dict({field: value})
    with pytest.raises(ConfigError, match=message):
        validate(config)
