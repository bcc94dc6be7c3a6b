"""The reward service's cohorts (`rrc_jax.service.cohorts`): rollouts of many groups, interleaved and retried, fill
whole cohorts, each rollout counted once; a cohort that never completes expires; a retry gets its first answer."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rrc_jax.service.cohorts import Answer, CohortError, Cohorts, Place, Rollout


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def rollout(group, k, size=4, prompt=None, **kw):
    return Rollout(prompt=prompt or f"prompt {group}", completion=f"completion {group}.{k}", group_size=size,
                   group=str(group), request_id=f"{group}.{k}", **kw)


@settings(max_examples=60, deadline=None)
@given(st.data(), st.integers(1, 6), st.integers(1, 5))
def test_interleaved_and_retried_rollouts_fill_whole_cohorts_once(data, groups, size):
    """Every group's `size` rollouts, sent in a random interleaving with random retries (before and after their
    cohort is settled): each cohort completes exactly once, holds its group's rollouts only, each once, and a
    retry gets the first place and, once settled, the first answer."""
    cohorts = Cohorts(timeout_s=60)
    sent = [rollout(g, k, size) for g in range(groups) for k in range(size)]
    order = data.draw(st.permutations(sent))
    retries = data.draw(st.lists(st.sampled_from(sent), max_size=2 * len(sent)))
    stream = list(order)
    for r in retries:  # a retry comes after its first sending
        stream.insert(data.draw(st.integers(stream.index(r) + 1, len(stream))), r)
    places, completed = {}, []
    for r in stream:
        place, done = cohorts.add(r)
        if r.request_id in places:
            assert place == places[r.request_id] and done is None
            answer = cohorts.answer(r.request_id)
            settled = any(place.cohort == c.serial for c in completed)
            assert (answer == Answer(reward=float(place.index))) if settled else answer is None
        places[r.request_id] = place
        if done is not None:
            assert done.whole and {x.group for x in done.rollouts} == {done.key}
            ids = [x.request_id for x in done.rollouts]
            assert len(set(ids)) == len(ids)  # each rollout once
            cohorts.settle(done, [Answer(reward=float(k)) for k in range(len(done.rollouts))])
            completed.append(done)
    assert sorted(c.key for c in completed) == sorted(str(g) for g in range(groups))
    assert sorted(x.request_id for c in completed for x in c.rollouts) == sorted(r.request_id for r in sent)
    assert cohorts.stats.rollouts == len(sent) and cohorts.stats.retries == len(retries)
    assert cohorts.stats.whole == groups and cohorts.open == 0 and cohorts.stats.expired == 0


def test_a_prompt_drawn_twice_is_two_cohorts_filled_in_turn():
    """Rollouts without a group id are grouped by prompt: 2G of one prompt are two cohorts, in arrival order; a
    rollout without a request id is a new rollout every time."""
    cohorts = Cohorts(timeout_s=60)
    done = []
    for k in range(4):
        place, whole = cohorts.add(Rollout("same prompt", f"c{k}", group_size=2))
        assert place.cohort == k // 2 and place.index == k % 2
        done += [whole] if whole else []
    assert [[r.completion for r in c.rollouts] for c in done] == [["c0", "c1"], ["c2", "c3"]]
    assert cohorts.stats.retries == 0 and cohorts.stats.rollouts == 4


def test_cohorts_refuse_a_mismatched_rollout_or_a_reused_request_id_naming_the_field():
    cohorts = Cohorts(timeout_s=60)
    cohorts.add(rollout("g", 0))
    with pytest.raises(CohortError, match="prompt of a rollout of group 'g' differs"):
        cohorts.add(rollout("g", 1, prompt="another prompt"))
    with pytest.raises(CohortError, match="group_size of a rollout of group 'g' differs"):
        cohorts.add(rollout("g", 1, size=3))
    with pytest.raises(CohortError, match="request_id 'g.0' was given before with another rollout"):
        cohorts.add(Rollout("prompt g", "a different text", group_size=4, group="g", request_id="g.0"))
    with pytest.raises(CohortError, match="group_size=0 of group 'h' must be an integer >= 1"):
        cohorts.add(rollout("h", 0, size=0))
    assert cohorts.stats.refused == 4 and cohorts.stats.rollouts == 1


def test_a_cohort_that_never_completes_expires_after_its_timeout():
    """A cohort open `timeout_s` after its first rollout is closed by `expire` (counted); the group's next rollout
    opens a new cohort; its answers (here an error) reach a retry."""
    clock = Clock()
    cohorts = Cohorts(timeout_s=10, clock=clock)
    cohorts.add(rollout("a", 0))
    clock.now = 5
    cohorts.add(rollout("a", 1))
    cohorts.add(rollout("b", 0))
    clock.now = 9.9
    assert cohorts.expire() == []
    clock.now = 10
    (late,) = cohorts.expire()
    assert late.key == "a" and len(late.rollouts) == 2 and not late.whole and cohorts.stats.expired == 1
    assert cohorts.add(rollout("a", 2))[0].cohort != late.serial  # a new cohort of group a
    clock.now = 15
    (late_b,) = cohorts.expire()
    assert late_b.key == "b"
    with pytest.raises(ValueError, match="1 answers for the 2 rollouts"):
        cohorts.settle(late, [Answer(reward=1.0)])
    cohorts.settle(late_b, [Answer(error="group 'b': 1 of its 4 rollouts arrived within 10 s")])
    # a failure is not kept: the retry of an expired rollout is a new rollout of a new cohort (judged this time)
    assert cohorts.answer("b.0") is None
    place, whole = cohorts.add(rollout("b", 0))
    assert place.cohort > late_b.serial and whole is None and cohorts.stats.retries == 0


def test_answers_are_kept_for_the_last_remember_request_ids():
    cohorts = Cohorts(timeout_s=60, remember=2)
    for g in range(3):
        (_, whole) = cohorts.add(rollout(g, 0, size=1))
        cohorts.settle(whole, [Answer(reward=float(g))])
    assert cohorts.answer("0.0") is None and cohorts.answer("2.0") == Answer(reward=2.0)
    assert cohorts.add(rollout(0, 0, size=1))[1] is not None  # forgotten: counted again
