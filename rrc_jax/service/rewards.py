"""The reward service's judge: a cohort's rewards from a construction of the registry (`GroupRewards`: SCR's win
counts, CARA, AGR's anchors beaten, PRC, a tournament's standing) and its judge, the cohorts of one call judged in
as few construction calls as their sizes allow (whole cohorts share one; an expired cohort of k < G rollouts is
judged as a group of k).

A construction that reads a prompt's columns gets them from the request (a rollout's `anchors`: a trainer that
samples its own, `rrc_jax.constructions.served`) or from the service: AGR's anchors (`anchors`: prompt -> its
reference responses) and PRC's reference (`references`: prompt -> o_ref). A prompt without them fails its cohort
with an error naming it.

`recipe_app(s)` is the service of a recipe (a trainer config): what `python -m rrc_jax.service` serves.

Shapes: C cohorts a call, k rollouts a cohort.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from rrc_jax.inference.sampler import SampleOutput, SamplingParams
from rrc_jax.integrations.groups import GroupRewards, Row, judge_for
from rrc_jax.rl.roles import Roles
from rrc_jax.service.cohorts import Answer, Cohort, Rollout


class Remembered:
    """A greedy judge's sampler that remembers its judgments: `complete` at temperature 0 asks the engine only the
    questions (token ids, sampling settings) it has not answered before, the rest from memory (the last `capacity`
    questions). A reward service asks an unfinished cohort's questions while the judge is idle (SCR: the pairs of
    the rollouts in so far) and the whole cohort's later; the questions asked already then cost nothing, and the
    judgments are the ones a greedy engine gives every time. At temperature > 0 it asks everything (a question's
    draw depends on its call's key and stream). `hits` counts the questions answered from memory."""

    def __init__(self, sampler, capacity: int = 200_000):
        self.inner, self.capacity, self.hits = sampler, capacity, 0
        self._rows: collections.OrderedDict[tuple, tuple] = collections.OrderedDict()

    def __getattr__(self, name):  # the rest of the Sampler protocol: the engine's
        return getattr(self.inner, name)

    def complete(self, prefixes, suffixes, params: SamplingParams = SamplingParams(), rng=0, *, streams=None,
                 splits=None) -> SampleOutput:
        if params.temperature != 0:
            return self.inner.complete(prefixes, suffixes, params, rng, streams=streams, splits=splits)
        keys = [(params, *map(int, prefixes[p]), -1, *map(int, s)) for p, s in suffixes]
        firsts = {k: q for q, k in reversed(list(enumerate(keys)))}  # each different question's first asking
        ask = [firsts[k] for k in dict.fromkeys(keys) if k not in self._rows]
        if ask:
            used = sorted({suffixes[q][0] for q in ask})
            where = {p: i for i, p in enumerate(used)}
            out = self.inner.complete([prefixes[p] for p in used],
                                      [(where[suffixes[q][0]], suffixes[q][1]) for q in ask], params, rng,
                                      streams=[streams[q] if streams is not None else q for q in ask],
                                      splits=[splits[q] for q in ask] if splits is not None else None)
            for j, q in enumerate(ask):
                self._rows[keys[q]] = tuple(x[j] for x in out)
        self.hits += len(keys) - len(ask)
        for k in keys:
            self._rows.move_to_end(k)
        while len(self._rows) > self.capacity:
            self._rows.popitem(last=False)
        return SampleOutput(*(np.stack([self._rows[k][f] for k in keys]) for f in range(4)))


def cohort_rewards(rewards: GroupRewards, *, anchors: Mapping[str, Sequence[str]] | None = None,
                   references: Mapping[str, str] | None = None):
    """`reward_cohorts(cohorts) -> answers` (`rrc_jax.service.app.RewardCohorts`) over `rewards`."""
    anchors, references = anchors or {}, references or {}

    def row(r: Rollout) -> Row:
        given = r.anchors or tuple(anchors.get(r.prompt, ()))
        if "anchors" in rewards.columns and not given:
            raise KeyError(f"no anchors for prompt {r.prompt[:80]!r}: {rewards.kind} needs each prompt's anchors")
        if "reference" in rewards.columns and not references.get(r.prompt):
            raise KeyError(f"no reference for prompt {r.prompt[:80]!r}: {rewards.kind} needs each prompt's o_ref")
        return Row(r.prompt, r.completion, given, references.get(r.prompt, ""))

    def reward_cohorts(cohorts: list[Cohort]) -> list[list[Answer]]:
        answers: list[list[Answer]] = [[] for _ in cohorts]
        by_size: dict[int, list[int]] = {}
        for i, c in enumerate(cohorts):
            by_size.setdefault(len(c.rollouts), []).append(i)
        for k, members in by_size.items():
            ready, rows = [], []
            for i in members:
                try:
                    rows += [row(r) for r in cohorts[i].rollouts]
                    ready.append(i)
                except KeyError as e:  # this cohort fails; the others of its size are judged
                    answers[i] = [Answer(error=str(e.args[0]))] * k
                    del rows[len(ready) * k:]
            if not ready:
                continue
            values = rewards(rows, group_size=k)
            for j, i in enumerate(ready):
                answers[i] = [Answer(reward=float(v)) for v in values[j * k:(j + 1) * k]]
        return answers

    return reward_cohorts


def recipe_app(s, columns: dict | None = None, **limits):
    """The reward service's app (`make_app`, with `limits`) for a recipe (`s`: a trainer config's settings): its
    GRM as a judge (in this process, or asked of `inference.url`'s servers with `inference.engine=openai`), its
    construction and settings as `GroupRewards`, `columns` from `read_columns`; a greedy SCR round robin asks its
    unfinished cohorts' pairs early (`Remembered`). `app.state.grm` names the GRM."""
    from rrc_jax.service.app import make_app  # the serve extra (starlette)

    kind, j = s.reward_kind, s.judge
    settings = s.constructions.get(kind)
    grm = Roles.of_run(s).path("grm")
    served = s.inference.options("grm")  # the judge's servers (a pool), or none: the judge in this process
    judge = judge_for(str(grm), template=j.template, max_new_tokens=j.max_new_tokens, temperature=j.temperature,
                      seed=s.seed, **(served or {"max_batch": j.max_batch}))
    # a greedy round robin's unfinished cohorts are asked early: their pairs' judgments are remembered
    early = kind == "scr" and settings.ordering == "round_robin" and j.temperature == 0
    if early:
        judge.sampler = Remembered(judge.sampler)

    def health() -> dict:
        return {**({"servers": judge.sampler.pool.health()} if served else {}),
                **({"remembered": judge.sampler.hits} if early else {})}

    rewards = GroupRewards(judge, kind, group_size=s.rollout.group_size, votes=j.votes, swap=j.swap, seed=s.seed,
                           **(dataclasses.asdict(settings) if settings is not None else {}))
    app = make_app(cohort_rewards(rewards, **(columns or {})), group_size=s.rollout.group_size, judge_health=health,
                   per_rollout=s.reward.per_response, early=early, **limits)
    app.state.grm = grm
    return app
